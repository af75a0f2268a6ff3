package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

func TestParseDrainMode(t *testing.T) {
	for in, want := range map[string]DrainMode{"hibernate": DrainHibernate, " Release ": DrainRelease, "HIBERNATE": DrainHibernate} {
		if got, err := ParseDrainMode("mode", in); err != nil || got != want {
			t.Errorf("ParseDrainMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "freeze", "sleep"} {
		if _, err := ParseDrainMode("mode", in); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "mode") {
			t.Errorf("ParseDrainMode(%q) = %v; want INVALID_ARGUMENT naming mode", in, err)
		}
	}
	h := newHarness(t, nil)
	if _, err := h.m.Drain(context.Background(), "freeze", ""); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "mode") {
		t.Fatalf("Drain(freeze) = %v; want INVALID_ARGUMENT naming mode", err)
	}
	if h.m.Draining() {
		t.Fatal("a refused Drain set the Manager draining")
	}
}

// Drain with hibernate stops every READY lease's container (files kept),
// leaves a frozen one as it is, refuses new leases and resumes (an acquire
// of a paused conversation too) until the restart, and the restart adopts
// the hibernated leases, which resume again.
func TestDrainHibernate(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	a, _ := h.acquire("a")
	b, _ := h.acquire("b")
	frozen, _ := h.acquire("frozen")
	if _, err := h.m.Pause(ctx, frozen.ID, PauseFreeze); err != nil {
		t.Fatal(err)
	}

	res, err := h.m.Drain(ctx, DrainHibernate, "")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a.ID, b.ID, frozen.ID}
	slices.Sort(want)
	if !slices.Equal(res.Drained, want) || len(res.Failed) != 0 {
		t.Fatalf("drain = %+v; want drained %v", res, want)
	}
	if !h.m.Draining() {
		t.Fatal("not draining after Drain")
	}
	for _, l := range []Lease{a, b} {
		got := h.get(l.ID)
		if got.State != StatePaused || got.Paused != PauseHibernate {
			t.Errorf("lease %s: %s (%s), want PAUSED (hibernate)", l.ID, got.State, got.Paused)
		}
		if st := h.rt.state(l.ContainerID); st != runtime.StateExited {
			t.Errorf("lease %s's container is %q, want exited with its files", l.ID, st)
		}
	}
	if got := h.get(frozen.ID); got.State != StatePaused || got.Paused != PauseFreeze || h.rt.state(frozen.ContainerID) != runtime.StatePaused {
		t.Errorf("frozen lease: %s (%s), container %s; want it left frozen", got.State, got.Paused, h.rt.state(frozen.ContainerID))
	}

	// New leases and resumes are refused with UNAVAILABLE, and nothing moves.
	creates := h.rt.creates()
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "new"}); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "draining") {
		t.Errorf("acquire of a new conversation while draining = %v; want UNAVAILABLE saying draining", err)
	}
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "a"}); !errdefs.IsUnavailable(err) {
		t.Errorf("acquire of a hibernated conversation while draining = %v; want UNAVAILABLE", err)
	}
	if _, err := h.m.Resume(ctx, b.ID); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), b.ID) {
		t.Errorf("resume while draining = %v; want UNAVAILABLE naming the lease", err)
	}
	if h.rt.creates() != creates || h.get(a.ID).State != StatePaused || h.get(b.ID).State != StatePaused {
		t.Fatal("a refused call created a sandbox or woke a lease")
	}
	// Draining again is harmless: everything is paused already.
	if res, err := h.m.Drain(ctx, DrainHibernate, ""); err != nil || len(res.Drained) != 3 || len(res.Failed) != 0 {
		t.Fatalf("second drain = %+v, %v", res, err)
	}

	// The restart forgets draining and adopts the hibernated leases.
	h.restart()
	if h.m.Draining() {
		t.Fatal("draining survived a restart")
	}
	if got := h.get(a.ID); got.State != StatePaused || got.Paused != PauseHibernate {
		t.Fatalf("after restart lease a is %s (%s), want PAUSED (hibernate)", got.State, got.Paused)
	}
	l, _, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "a"})
	if err != nil || created || l.ID != a.ID || l.State != StateReady {
		t.Fatalf("acquire of conversation a after restart = %s %s created=%v %v; want lease %s resumed", l.ID, l.State, created, err, a.ID)
	}
	if _, _, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "new"}); err != nil || !created {
		t.Fatalf("new acquire after restart = created %v, %v", created, err)
	}
}

// Drain with release releases every live lease with the reason given and
// removes its container; a released conversation's next acquire is
// refused while draining.
func TestDrainRelease(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	a, _ := h.acquire("a")
	b, _ := h.acquire("b")
	if _, err := h.m.Pause(ctx, b.ID, PauseHibernate); err != nil {
		t.Fatal(err)
	}
	ended, _ := h.acquire("ended")
	if _, err := h.m.Release(ctx, ended.ID, ""); err != nil {
		t.Fatal(err)
	}

	res, err := h.m.Drain(ctx, DrainRelease, "host maintenance")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a.ID, b.ID}
	slices.Sort(want)
	if !slices.Equal(res.Drained, want) || len(res.Failed) != 0 {
		t.Fatalf("drain = %+v; want drained %v (not the lease that had ended)", res, want)
	}
	for _, l := range []Lease{a, b} {
		got := h.get(l.ID)
		if got.State != StateReleased || got.Transitions[len(got.Transitions)-1].Reason != "host maintenance" && got.Transitions[len(got.Transitions)-2].Reason != "host maintenance" {
			t.Errorf("lease %s: %s %+v; want RELEASED with the drain's reason", l.ID, got.State, got.Transitions)
		}
		if h.rt.exists(l.ContainerID) {
			t.Errorf("lease %s's container is still there", l.ID)
		}
	}
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "a"}); !errdefs.IsUnavailable(err) {
		t.Fatalf("acquire after a release drain = %v; want UNAVAILABLE", err)
	}
}

// A lease that cannot be hibernated is reported with its error and left
// READY, and an acquire of its conversation still returns it while
// draining (it creates nothing).
func TestDrainFailureKeepsLease(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	a, _ := h.acquire("a")
	h.rt.set(func(f *fakeRuntime) { f.stopErr = errors.New("engine says no") })

	res, err := h.m.Drain(ctx, DrainHibernate, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Drained) != 0 || len(res.Failed) != 1 || res.Failed[0].LeaseID != a.ID || !strings.Contains(res.Failed[0].Err.Error(), "engine says no") {
		t.Fatalf("drain = %+v; want lease %s failed with the engine's error", res, a.ID)
	}
	if got := h.get(a.ID); got.State != StateReady {
		t.Fatalf("lease after a failed hibernate: %s, want READY", got.State)
	}
	creates := h.rt.creates()
	l, _, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "a"})
	if err != nil || created || l.ID != a.ID {
		t.Fatalf("acquire of a READY conversation while draining = %s created=%v %v; want the lease returned", l.ID, created, err)
	}
	if h.rt.creates() != creates {
		t.Fatal("the acquire created a sandbox")
	}
	// Once the engine works again, a second drain finishes the job.
	h.rt.set(func(f *fakeRuntime) { f.stopErr = nil })
	if res, err := h.m.Drain(ctx, DrainHibernate, ""); err != nil || len(res.Drained) != 1 || len(res.Failed) != 0 {
		t.Fatalf("second drain = %+v, %v", res, err)
	}
	if got := h.get(a.ID); got.State != StatePaused {
		t.Fatalf("lease after the second drain: %s, want PAUSED", got.State)
	}
}

// A lease whose sandbox is being created when the drain starts is
// hibernated once it is READY; its acquire gets it.
func TestDrainWaitsForPending(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	gate := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.createGate = gate })

	events := h.m.Subscribe(ctx, EventFilter{ConversationID: "slow"})
	type acquired struct {
		l   Lease
		err error
	}
	acq := make(chan acquired, 1)
	go func() {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "slow"})
		acq <- acquired{l, err}
	}()
	ev := <-events // its creation: PENDING, recorded in memory
	if ev.Lease.State != StatePending {
		t.Fatalf("first event %s", ev.Lease.State)
	}
	drained := make(chan DrainResult, 1)
	go func() {
		res, err := h.m.Drain(ctx, DrainHibernate, "")
		if err != nil {
			t.Error(err)
		}
		drained <- res
	}()
	// Drain sets draining and lists the live leases in one step, while the
	// creation still waits at the gate.
	eventually(t, 5*time.Second, "draining", h.m.Draining)
	close(gate)

	a := <-acq
	if a.err != nil {
		t.Fatalf("the pending acquire failed: %v", a.err)
	}
	res := <-drained
	if !slices.Equal(res.Drained, []string{ev.Lease.ID}) || len(res.Failed) != 0 {
		t.Fatalf("drain = %+v; want %s drained", res, ev.Lease.ID)
	}
	if got := h.get(ev.Lease.ID); got.State != StatePaused || got.Paused != PauseHibernate {
		t.Fatalf("the pending lease ended %s (%s), want PAUSED (hibernate)", got.State, got.Paused)
	}
}

// Acquires racing a release drain: those admitted before it (8 held in
// creation, and any of 8 more that got in first) are released by it — the
// acquire either fails as released during creation (FAILED_PRECONDITION)
// or gets its lease READY just before the drain's release reaches it; the
// others are refused with UNAVAILABLE. Once Drain returns nothing is live
// and no sandbox is left.
func TestDrainRacesAcquires(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	gate := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.createGate = gate })
	events := h.m.Subscribe(ctx, EventFilter{})
	var wg sync.WaitGroup
	got := make([]error, 16)
	acquire := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _, got[i] = h.m.Acquire(ctx, AcquireRequest{ConversationID: fmt.Sprintf("c%d", i)})
		}()
	}
	for i := range 8 {
		acquire(i)
	}
	for range 8 { // each one's PENDING record exists
		<-events
	}
	drained := make(chan DrainResult, 1)
	go func() {
		res, err := h.m.Drain(ctx, DrainRelease, "")
		if err != nil {
			t.Error(err)
		}
		drained <- res
	}()
	for i := 8; i < 16; i++ {
		acquire(i)
	}
	eventually(t, 5*time.Second, "draining", h.m.Draining)
	close(gate)
	wg.Wait()
	res := <-drained
	refused := 0
	for i, err := range got {
		switch {
		case errdefs.IsUnavailable(err):
			refused++
		case err == nil, errdefs.IsFailedPrecondition(err): // admitted; released after or while created
		default:
			t.Errorf("acquire c%d: %v; want success, FAILED_PRECONDITION (released) or UNAVAILABLE", i, err)
		}
	}
	t.Logf("%d of 16 acquires refused, %d leases released", refused, len(res.Drained))
	if len(res.Failed) != 0 || len(res.Drained) != 16-refused || len(res.Drained) < 8 {
		t.Fatalf("drain = %+v; %d acquires refused", res, refused)
	}
	live, _, err := h.m.List(ctx, Filter{States: []State{StatePending, StateReady, StatePaused, StateReleasing}})
	if err != nil || len(live) != 0 {
		t.Fatalf("live after drain: %d %v", len(live), err)
	}
	if n := h.rt.count(); n != 0 {
		t.Fatalf("%d sandboxes left after a release drain", n)
	}
}

// Draining empties the warm pools and they stay empty.
func TestDrainEmptiesPools(t *testing.T) {
	h, _ := poolHarness(t, []PoolConfig{{Name: "py", Min: 2, Max: 3}}, nil)
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "py") == 2 })
	if _, err := h.m.Drain(context.Background(), DrainRelease, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "pool emptied", func() bool { return poolReady(h, "py") == 0 && pooledBoxes(h, "py") == 0 })
	// A refill pass (as the pool loop runs every second) creates nothing.
	creates := h.rt.creates()
	h.m.pools.fill(context.Background(), make(chan struct{}, poolCreateConcurrency))
	if h.rt.creates() != creates || poolReady(h, "py") != 0 {
		t.Fatalf("a refill while draining created %d sandboxes", h.rt.creates()-creates)
	}
	if _, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"}); !errdefs.IsUnavailable(err) {
		t.Fatalf("acquire while draining with pools = %v; want UNAVAILABLE", err)
	}
}
