package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// testPauseResume checks runtime.Freezer, on a runtime that implements it
// (a backend that cannot freeze does not, and callers refuse to pause).
func (s *suite) testPauseResume(t *testing.T) {
	t.Parallel()
	fr, ok := s.rt.(runtime.Freezer)
	if s.lacks(t, LimitFreeze) {
		if ok {
			t.Fatalf("%T declares %q but implements runtime.Freezer", s.rt, LimitFreeze)
		}
		return
	}
	if !ok {
		t.Skipf("%T does not implement runtime.Freezer (no pause/resume)", s.rt)
	}
	ctx := context.Background()
	spec := s.spec(s.images.Empty)
	sb := s.create(t, spec)
	if err := fr.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	got, err := s.rt.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != runtime.StatePaused {
		t.Errorf("State after Pause = %q, want paused", got.State)
	}
	if err := s.healthz(sb, 300*time.Millisecond); err == nil {
		t.Errorf("a paused sandbox answered /healthz")
	}
	if err := fr.Pause(ctx, sb.ID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Pause of a paused sandbox: %v, want ErrFailedPrecondition", err)
	}
	if err := fr.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got, _ := s.rt.Get(ctx, sb.ID); got.State != runtime.StateRunning {
		t.Errorf("State after Resume = %q, want running", got.State)
	}
	if err := s.healthz(sb, 5*time.Second); err != nil {
		t.Errorf("healthz after Resume: %v", err)
	}
	if err := fr.Resume(ctx, sb.ID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Resume of a running sandbox: %v, want ErrFailedPrecondition", err)
	}

	// A paused sandbox can be stopped and removed (the reaper does that).
	if err := fr.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := s.rt.Stop(ctx, sb.ID, time.Second); err != nil {
		t.Errorf("Stop of a paused sandbox: %v", err)
	}
	if got, err := s.rt.Get(ctx, sb.ID); err != nil || got.State != runtime.StateExited {
		t.Errorf("after Stop of a paused sandbox: %+v %v, want exited", got, err)
	}
	if err := fr.Pause(ctx, sb.ID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Pause of a stopped sandbox: %v, want ErrFailedPrecondition", err)
	}
	spec2 := s.spec(s.images.Empty)
	sb2 := s.create(t, spec2)
	if err := fr.Pause(ctx, sb2.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := s.rt.Remove(ctx, sb2.ID); err != nil {
		t.Errorf("Remove of a paused sandbox: %v", err)
	}
	s.assertNothingLeft(t, spec2.LeaseID)
}
