package lease

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// startPoolReplica is startReplica with warm pools pcfg, its Config
// changed by tweak.
// poolPair is two replicas of one fleet sharing the pool "p": a, elected,
// and b, with the runtime, election and agent configurer they share.
type poolPair struct {
	rt   *fakeRuntime
	el   *election
	cf   *fakeConfigurer
	a, b *replica
}

// startPoolPair starts a poolPair whose pool keeps n members (Min and Max;
// claimGrace its PoolsConfig.ClaimGrace, 0 the default) and waits until
// both replicas see the n members ready.
func startPoolPair(t *testing.T, n int, claimGrace time.Duration, tweak ...func(*Config)) poolPair {
	t.Helper()
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("a")
	cf := &fakeConfigurer{}
	pc := PoolsConfig{Pools: []PoolConfig{{Name: "p", Min: n, Max: n}}, AgentConfigurer: cf, ClaimGrace: claimGrace}
	a := startPoolReplica(t, f, rt, el, "a", pc, tweak...)
	b := startPoolReplica(t, f, rt, el, "b", pc, tweak...)
	eventually(t, 5*time.Second, fmt.Sprintf("both replicas see %d ready members", n), func() bool {
		return readyOn(a, "p") == n && readyOn(b, "p") == n
	})
	return poolPair{rt: rt, el: el, cf: cf, a: a, b: b}
}

func startPoolReplica(t *testing.T, f *memFleet, rt *fakeRuntime, el *election, name string, pcfg PoolsConfig, tweak ...func(*Config)) *replica {
	t.Helper()
	cfg := Config{InstanceID: name, Secret: testSecret, Store: f.view(name), Runtime: rt,
		ReapInterval: 20 * time.Millisecond, Restart: RestartConfig{Delay: 10 * time.Millisecond},
		Fleet: FleetConfig{Elect: el.elect(name), ActivityFlushInterval: 10 * time.Millisecond},
		Pools: pcfg}
	for _, f := range tweak {
		f(&cfg)
	}
	m, cancel := startManager(t, cfg)
	r := &replica{m: m, cancel: cancel}
	t.Cleanup(r.stop)
	return r
}

// readyOn is pool name's Ready figure on replica r.
func readyOn(r *replica, name string) int {
	for _, s := range r.m.PoolStats() {
		if s.Name == name {
			return s.Ready
		}
	}
	return -1
}

// sharedMembers returns the fake runtime's sandboxes of pool name.
func sharedMembers(rt *fakeRuntime, name string) []runtime.Sandbox {
	sbs, _ := rt.List(context.Background(), runtime.Selector{runtime.LabelPool: name})
	return sbs
}

// checkNoLeak fails unless every sandbox of the fake runtime is either a
// live lease's (on replica r) or an unclaimed member of a pool in r's view.
func checkNoLeak(t *testing.T, rt *fakeRuntime, r *replica) {
	t.Helper()
	eventually(t, 5*time.Second, "every sandbox a lease's or an unclaimed member's", func() bool {
		sbs, _ := rt.List(context.Background(), nil)
		idle := map[string]bool{}
		for _, ids := range r.m.pools.snapshot() {
			for _, id := range ids {
				idle[id] = true
			}
		}
		for _, sb := range sbs {
			l, err := r.m.Get(context.Background(), sb.LeaseID)
			switch {
			case err == nil && !l.State.Ended() && l.ContainerID == sb.ID:
			case idle[sb.LeaseID] && sb.Labels[runtime.LabelPoolClaim] == "":
			default:
				return false
			}
		}
		return true
	})
}

// Concurrent acquires on two replicas of a fleet claim each warm member
// once: no two leases share a sandbox, every agent is configured once,
// only the elected replica creates members, and the hits of both replicas
// add up to the leases that came from the pool.
func TestSharedPoolConcurrentClaims(t *testing.T) {
	pp := startPoolPair(t, 6, 0)
	rt, cf, a, b := pp.rt, pp.cf, pp.a, pp.b
	for _, sb := range sharedMembers(rt, "p") {
		if sb.InstanceID != "a" {
			t.Fatalf("member %s created by %q, want the elected replica a", sb.ID, sb.InstanceID)
		}
	}

	const n = 16
	leases := make([]Lease, n)
	for i, g := range acquireOnBoth(t, a, b, n, func(i int) AcquireRequest {
		return AcquireRequest{ConversationID: fmt.Sprintf("c%d", i), Env: map[string]string{"I": fmt.Sprint(i)}}
	}) {
		leases[i] = g.l
	}
	byContainer := map[string]string{}
	warm := 0
	for _, l := range leases {
		if l.State != StateReady {
			t.Fatalf("lease %s is %s", l.ID, l.State)
		}
		if other, ok := byContainer[l.ContainerID]; ok {
			t.Fatalf("leases %s and %s share sandbox %s", other, l.ID, l.ContainerID)
		}
		byContainer[l.ContainerID] = l.ID
		if l.Pool == "p" {
			warm++
		}
	}
	var hits uint64
	for _, r := range []*replica{a, b} {
		hits += r.m.PoolStats()[0].Hits
	}
	if warm == 0 || uint64(warm) != hits {
		t.Fatalf("%d leases from the pool, hits %d", warm, hits)
	}
	if calls := len(cf.callsCopy()); calls != warm {
		t.Fatalf("%d Configure calls for %d warm leases", calls, warm)
	}
	for _, l := range leases {
		sb, err := rt.Get(context.Background(), l.ContainerID)
		if err != nil {
			t.Fatalf("lease %s: %v", l.ID, err)
		}
		if l.Pool == "p" && (sb.Labels[runtime.LabelPoolClaim] != l.Instance || sb.InstanceID != l.Instance) {
			t.Fatalf("warm lease %s (home %s): sandbox labels claim=%q instance=%q", l.ID, l.Instance, sb.Labels[runtime.LabelPoolClaim], sb.InstanceID)
		}
	}
	eventually(t, 5*time.Second, "the pool refilled", func() bool { return readyOn(a, "p") == 6 && readyOn(b, "p") == 6 })
	checkNoLeak(t, rt, a)
	checkNoLeak(t, rt, b)
	for _, sb := range sharedMembers(rt, "p") {
		if sb.Labels[runtime.LabelPoolClaim] == "" && sb.InstanceID != "a" {
			t.Fatalf("member %s created by %q, want the elected replica a", sb.ID, sb.InstanceID)
		}
	}
}

// Acquires of one conversation on both replicas at once give one lease;
// a member claimed by the acquire that lost the conversation is removed,
// never handed out again nor left behind.
func TestSharedPoolSameConversation(t *testing.T) {
	pp := startPoolPair(t, 4, 0)
	rt, a, b := pp.rt, pp.a, pp.b
	for round := range 4 {
		conv := fmt.Sprintf("same-%d", round)
		var ids []string
		for _, g := range acquireOnBoth(t, a, b, 4, func(int) AcquireRequest { return AcquireRequest{ConversationID: conv} }) {
			ids = append(ids, g.l.ID)
		}
		for _, id := range ids {
			if id != ids[0] {
				t.Fatalf("round %d: leases %v for one conversation", round, ids)
			}
		}
	}
	eventually(t, 5*time.Second, "the pool refilled", func() bool { return readyOn(a, "p") == 4 && readyOn(b, "p") == 4 })
	checkNoLeak(t, rt, a)
	checkNoLeak(t, rt, b)
}

// A member claimed by a replica that died before it recorded the lease
// (kill -9 mid-claim) is never handed out again, and the elected replica
// removes it once PoolsConfig.ClaimGrace has passed; the pool refills.
func TestSharedPoolStaleClaimRemoved(t *testing.T) {
	pp := startPoolPair(t, 2, 200*time.Millisecond)
	rt, a, b := pp.rt, pp.a, pp.b
	victim := sharedMembers(rt, "p")[0]
	// The claim of a replica "dead" that never wrote its record.
	if err := rt.ClaimMember(context.Background(), victim.ID, "dead"); err != nil {
		t.Fatal(err)
	}
	if err := rt.ClaimMember(context.Background(), victim.ID, "other"); !errdefs.IsConflict(err) {
		t.Fatalf("second claim: %v, want Conflict", err)
	}
	eventually(t, 5*time.Second, "the claimed member is out of both views", func() bool {
		for _, r := range []*replica{a, b} {
			for _, id := range r.m.pools.snapshot()["p"] {
				if id == victim.LeaseID {
					return false
				}
			}
		}
		return true
	})
	for i := range 2 {
		l, _, _, err := b.m.Acquire(context.Background(), AcquireRequest{ConversationID: fmt.Sprintf("c%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if l.ID == victim.LeaseID || l.ContainerID == victim.ID {
			t.Fatalf("the member claimed by the dead replica was handed out: %+v", l)
		}
	}
	eventually(t, 5*time.Second, "the elected replica removed the stale claim", func() bool { return !rt.exists(victim.ID) })
	eventually(t, 5*time.Second, "the pool refilled", func() bool { return readyOn(a, "p") == 2 && readyOn(b, "p") == 2 })
	checkNoLeak(t, rt, a)
}

// Only the elected replica fills the pools; when it stops, the newly
// elected one refills.
func TestSharedPoolRefillMovesWithLeader(t *testing.T) {
	pp := startPoolPair(t, 2, 0)
	rt, el, a, b := pp.rt, pp.el, pp.a, pp.b
	a.stop()
	el.set("b")
	for i := range 2 {
		l, _, _, err := b.m.Acquire(context.Background(), AcquireRequest{ConversationID: fmt.Sprintf("c%d", i)})
		if err != nil || l.Pool != "p" {
			t.Fatalf("acquire %d: pool %q, %v", i, l.Pool, err)
		}
	}
	eventually(t, 5*time.Second, "b refilled", func() bool { return readyOn(b, "p") == 2 })
	n := 0
	for _, sb := range sharedMembers(rt, "p") {
		if sb.Labels[runtime.LabelPoolClaim] == "" {
			n++
			if sb.InstanceID != "b" {
				t.Fatalf("refilled member %s created by %q, want b", sb.ID, sb.InstanceID)
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d unclaimed members, want 2", n)
	}
	checkNoLeak(t, rt, b)
}

// Without a MemberClaimer runtime, pools with a shared store are refused.
func TestSharedPoolNeedsClaimer(t *testing.T) {
	f := newMemFleet()
	_, err := New(Config{InstanceID: "a", Secret: testSecret, Store: f.view("a"), Runtime: plainRuntime{newFakeRuntime()},
		Pools: PoolsConfig{Pools: []PoolConfig{{Name: "p", Max: 1}}}})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New: %v, want InvalidArgument", err)
	}
}

// plainRuntime hides the fake runtime's ClaimMember.
type plainRuntime struct{ Runtime }

// A member not marked ready (its creator has not seen its agent answer, or
// died before) is handed out by no replica; the elected replica removes it
// once the ready timeout and the claim grace have passed.
func TestSharedPoolUnreadyMember(t *testing.T) {
	short := func(c *Config) { c.ReadyTimeout = 300 * time.Millisecond }
	pp := startPoolPair(t, 1, 100*time.Millisecond, short)
	rt, a, b := pp.rt, pp.a, pp.b
	marked := sharedMembers(rt, "p")[0]
	// A member of a creator that died before marking it (same profile).
	unready := rt.add(runtime.Sandbox{LeaseID: "unready-1", InstanceID: "gone", State: runtime.StateRunning, Labels: map[string]string{
		runtime.LabelManaged: "true", runtime.LabelLease: "unready-1", runtime.LabelInstance: "gone",
		runtime.LabelPool: "p", runtime.LabelPoolProfile: marked.Labels[runtime.LabelPoolProfile]}})
	for i := range 2 {
		l, _, _, err := b.m.Acquire(context.Background(), AcquireRequest{ConversationID: fmt.Sprintf("c%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if l.ContainerID == unready.ID {
			t.Fatalf("the unready member was handed out: %+v", l)
		}
	}
	eventually(t, 5*time.Second, "the elected replica removed the unready member", func() bool { return !rt.exists(unready.ID) })
	eventually(t, 5*time.Second, "the pool refilled", func() bool { return readyOn(a, "p") == 1 && readyOn(b, "p") == 1 })
	checkNoLeak(t, rt, a)
}
