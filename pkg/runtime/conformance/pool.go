package conformance

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// memberClaimer is the optional interface of a runtime whose warm pools
// several orchestrators share (lease.MemberClaimer, declared there).
type memberClaimer interface {
	ClaimMember(ctx context.Context, sandboxID, claimant string) error
	MarkMemberReady(ctx context.Context, sandboxID string) error
}

// testPool checks what warm pools need of every runtime: a sandbox created
// for a pool (Spec.Pool, Spec.PoolProfile) carries the pool's labels and
// is found by them. On a runtime whose members can be claimed
// (memberClaimer) it also checks the claim: of concurrent claims of one
// member exactly one succeeds and the others get ErrConflict, as does any
// later claim and a ready mark after it; the claimed member carries the
// claim and the claimant's instance label, and List finds it under that
// instance.
func (s *suite) testPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	spec := s.spec(s.images.Empty)
	spec.Pool, spec.PoolProfile = "conformance", "profile-"+s.runID
	sb := s.create(t, spec)
	sel := runtime.Selector{runtime.LabelPool: spec.Pool, runtime.LabelPoolProfile: spec.PoolProfile}
	got, err := s.rt.List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != sb.ID || got[0].InstanceID != s.instance {
		t.Fatalf("List(%v) = %+v, want the one member %s of instance %s", sel, got, sb.ID, s.instance)
	}
	mc, ok := s.rt.(memberClaimer)
	if !ok {
		t.Logf("%T cannot claim pool members (one orchestrator per pool): the claim is not checked", s.rt)
		return
	}
	if err := mc.MarkMemberReady(ctx, sb.ID); err != nil {
		t.Fatalf("MarkMemberReady: %v", err)
	}
	if got, err := s.rt.Get(ctx, sb.ID); err != nil || got.Labels[runtime.LabelPoolReady] != "true" {
		t.Fatalf("after MarkMemberReady: %+v, %v: want %s=true", got.Labels, err, runtime.LabelPoolReady)
	}
	const claimers = 6
	errs := make([]error, claimers)
	names := make([]string, claimers)
	var wg sync.WaitGroup
	for i := range claimers {
		names[i] = s.instance + "-claimer-" + string(rune('a'+i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = mc.ClaimMember(ctx, sb.ID, names[i])
		}()
	}
	wg.Wait()
	winner := ""
	for i, err := range errs {
		switch {
		case err == nil && winner == "":
			winner = names[i]
		case err == nil:
			t.Fatalf("two claims of member %s succeeded: %s and %s", sb.ID, winner, names[i])
		case !errdefs.IsConflict(err):
			t.Errorf("claim by %s: %v, want success or ErrConflict", names[i], err)
		}
	}
	if winner == "" {
		t.Fatalf("no claim of member %s succeeded: %v", sb.ID, errs)
	}
	got2, err := s.rt.List(ctx, runtime.Selector{runtime.LabelInstance: winner, runtime.LabelPool: spec.Pool})
	if err != nil {
		t.Fatal(err)
	}
	if len(got2) != 1 || got2[0].ID != sb.ID || got2[0].Labels[runtime.LabelPoolClaim] != winner || got2[0].InstanceID != winner {
		t.Fatalf("List by the claimant's instance = %+v, want member %s claimed by %s", got2, sb.ID, winner)
	}
	if err := mc.ClaimMember(ctx, sb.ID, "late"); !errdefs.IsConflict(err) {
		t.Errorf("claim of a claimed member: %v, want ErrConflict", err)
	}
	if err := mc.MarkMemberReady(ctx, sb.ID); !errdefs.IsConflict(err) {
		t.Errorf("ready mark of a claimed member: %v, want ErrConflict", err)
	}
	if err := s.healthz(sb, 10*time.Second); err != nil {
		t.Errorf("healthz of the claimed member: %v", err)
	}
}
