package lease

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/runtime"
)

// blockingConfigurer is a fakeConfigurer whose Configure calls wait for
// release (closed by the test) after signalling entered.
type blockingConfigurer struct {
	*fakeConfigurer
	entered chan string // endpoint
	release chan struct{}
}

func (b *blockingConfigurer) Configure(ctx context.Context, a AgentTarget, token string, env, secrets map[string]string) error {
	b.entered <- a.Endpoint
	<-b.release
	return b.fakeConfigurer.Configure(ctx, a, token, env, secrets)
}

// A warm claim writes its READY record (in PhaseClaiming) while the agent
// is configured, but the lease is READY for nobody until Configure has
// returned; the refill starts only after the claim answered; the final
// record drops the phase.
func TestPoolClaimIsReadyOnlyOnceConfigured(t *testing.T) {
	bc := &blockingConfigurer{fakeConfigurer: &fakeConfigurer{}, entered: make(chan string, 1), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) {
		c.Pools.Pools = []PoolConfig{{Name: "p", Min: 1, Max: 1}}
		c.Pools.AgentConfigurer = bc
	})
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 1 })
	id := h.m.pools.snapshot()["p"][0]
	creates := h.rt.creates()

	type result struct {
		l   Lease
		err error
	}
	res := make(chan result, 1)
	go func() {
		l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c", Env: map[string]string{"A": "1"}})
		res <- result{l, err}
	}()
	select {
	case <-bc.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("Configure was not called")
	}
	eventually(t, 5*time.Second, "claim record written during Configure", func() bool {
		st, err := h.store.Get(id)
		return err == nil && st.State == StateReady && st.Phase == PhaseClaiming && st.Pool == "p"
	})
	if got := h.get(id); got.State != StatePending || got.Phase != PhaseNone {
		t.Fatalf("lease during Configure: %s/%s, want PENDING (READY only once configured)", got.State, got.Phase)
	}
	time.Sleep(200 * time.Millisecond)
	if n := h.rt.creates() - creates; n != 0 {
		t.Fatalf("%d pool refills started while the claim was configuring, want none", n)
	}
	close(bc.release)
	r := <-res
	if r.err != nil || r.l.ID != id || r.l.State != StateReady || r.l.Pool != "p" {
		t.Fatalf("acquire: %+v, %v", r.l, r.err)
	}
	eventually(t, 5*time.Second, "final record without the claiming phase", func() bool {
		st, err := h.store.Get(id)
		return err == nil && st.State == StateReady && st.Phase == PhaseNone
	})
	eventually(t, 5*time.Second, "refilled after the claim", func() bool { return poolReady(h, "p") == 1 })
}

// A restart that finds a claim's READY record still in PhaseClaiming (the
// orchestrator died during Configure) keeps the lease when its agent was
// configured, and fails it and removes its container when it was not.
func TestPoolClaimInterruptedByRestart(t *testing.T) {
	for _, configured := range []bool{true, false} {
		t.Run(map[bool]string{true: "configured", false: "unconfigured"}[configured], func(t *testing.T) {
			h, fc := poolHarness(t, []PoolConfig{{Name: "p", Min: 1, Max: 1}}, nil)
			eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 1 })
			id := h.m.pools.snapshot()["p"][0]
			boxes, _ := h.rt.List(context.Background(), runtime.Selector{runtime.LabelLease: id})
			if len(boxes) != 1 {
				t.Fatalf("member containers: %+v", boxes)
			}
			sb := boxes[0]
			if configured {
				if err := fc.Configure(context.Background(), AgentTarget{Endpoint: sb.Endpoint}, h.m.Tokens().AgentToken(id), map[string]string{"A": "1"}, nil); err != nil {
					t.Fatal(err)
				}
			}
			// The crash: the record a claim writes during Configure, and
			// nothing after it.
			h.stop()
			now := time.Now()
			l := Lease{ID: id, ConversationID: "c", Image: sb.Image, Env: map[string]string{"A": "1"}, CreatedAt: now,
				ContainerID: sb.ID, Endpoint: sb.Endpoint, Pool: "p", TTL: time.Hour,
				ExpiresAt: now.Add(time.Hour), LastActivityAt: now}
			if _, err := l.Transition(StatePending, "acquired", now); err != nil {
				t.Fatal(err)
			}
			if _, err := l.TransitionPhase(StateReady, PhaseClaiming, "claimed from pool p", now); err != nil {
				t.Fatal(err)
			}
			st, err := OpenBolt(h.path)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Put(l); err != nil {
				t.Fatal(err)
			}
			_ = st.Close()
			h.start()

			got := h.get(id)
			if got.Phase != PhaseNone {
				t.Fatalf("the claiming phase is in memory after restart")
			}
			if configured {
				if got.State != StateReady || got.ContainerID != sb.ID || !h.rt.exists(sb.ID) {
					t.Fatalf("configured claim after restart: %+v (container exists=%v), want READY and kept", got, h.rt.exists(sb.ID))
				}
				if rec, _ := h.store.Get(id); rec.Phase != PhaseNone {
					t.Fatalf("stored record still in phase %s", rec.Phase)
				}
			} else {
				if got.State != StateFailed || got.Reason != ReasonRestartedCreating {
					t.Fatalf("unconfigured claim after restart: %s %q, want FAILED (%s)", got.State, got.Reason, ReasonRestartedCreating)
				}
				eventually(t, 5*time.Second, "its container removed", func() bool { return !h.rt.exists(sb.ID) })
			}
			if n := poolReady(h, "p"); n > 1 {
				t.Fatalf("%d pool members, the claimed sandbox went back to the pool", n)
			}
			eventually(t, 5*time.Second, "pool refilled", func() bool { return poolReady(h, "p") == 1 })
			if m := h.m.pools.snapshot()["p"][0]; m == id {
				t.Fatalf("the claimed sandbox is a pool member again")
			}
		})
	}
}

// countingEgress counts fakeEgress.Apply calls per lease.
type countingEgress struct {
	*fakeEgress
	mu sync.Mutex
	n  map[string]int
}

func (c *countingEgress) Apply(ctx context.Context, lease, endpoint string, p egress.Policy) error {
	c.mu.Lock()
	c.n[lease]++
	c.mu.Unlock()
	return c.fakeEgress.Apply(ctx, lease, endpoint, p)
}

func (c *countingEgress) applies(lease string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[lease]
}

func (f *fakeEgress) wasRemoved(lease string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.removed, lease)
}

// Pooled sandboxes get the default network policy when they join their
// pool: a claim that keeps it programs nothing; one with another policy
// has it enforced before READY; a member that leaves its pool unclaimed
// loses its rules.
func TestPoolNetworkPolicyEnforcedAhead(t *testing.T) {
	eg := &countingEgress{fakeEgress: newFakeEgress(), n: map[string]int{}}
	h, _ := poolHarness(t, []PoolConfig{{Name: "p", Min: 2, Max: 2}}, func(c *Config) {
		c.Network.Egress = eg
		c.Network.Default = NetworkPolicy{Mode: NetworkRestricted, Allow: []string{"example.com"}}
	})
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 2 })
	ids := h.m.pools.snapshot()["p"]
	for _, id := range ids {
		if p, ok := eg.policy(id); !ok || p.Mode != egress.ModeRestricted || eg.applies(id) != 1 {
			t.Fatalf("member %s: policy %+v (%v), %d applies; want the default enforced once", id, p, ok, eg.applies(id))
		}
	}
	def, _ := h.acquire("default")
	if def.ID != ids[0] || def.Pool != "p" || eg.applies(def.ID) != 1 {
		t.Fatalf("default claim %s (pool %q): %d applies, want the member's one", def.ID, def.Pool, eg.applies(def.ID))
	}
	other, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "open", Network: &NetworkPolicy{Mode: NetworkOpen}})
	if err != nil || other.ID != ids[1] || other.Pool != "p" {
		t.Fatalf("claim with its own policy: %+v %v", other, err)
	}
	if p, _ := eg.policy(other.ID); p.Mode != egress.ModeOpen || eg.applies(other.ID) != 2 {
		t.Fatalf("claim with an open policy: enforced %+v after %d applies", p, eg.applies(other.ID))
	}
	eventually(t, 5*time.Second, "refilled", func() bool { return poolReady(h, "p") == 2 })
	member := h.m.pools.snapshot()["p"][0]
	boxes, _ := h.rt.List(context.Background(), runtime.Selector{runtime.LabelLease: member})
	h.rt.kill(boxes[0].ID, 137, false)
	eventually(t, 5*time.Second, "a dead member's rules removed", func() bool { return eg.wasRemoved(member) })
}

// A burst of warm claims is answered before the refill creates their
// replacements: while claims are in flight the refill holds back, for at
// most refillHold.
func TestPoolRefillWaitsForTheBurst(t *testing.T) {
	bc := &blockingConfigurer{fakeConfigurer: &fakeConfigurer{}, entered: make(chan string, 3), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) {
		c.Pools.Pools = []PoolConfig{{Name: "p", Min: 3, Max: 3}}
		c.Pools.AgentConfigurer = bc
	})
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 3 })
	creates := h.rt.creates()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "burst-" + string(rune('a'+i))}); err != nil {
				t.Error(err)
			}
		}()
	}
	for range 3 {
		select {
		case <-bc.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("Configure was not called")
		}
	}
	// The claims are in flight: a pass of the refill creates nothing
	// (the hold begins now, whenever the loop's own pass began it).
	h.m.mu.Lock()
	h.m.pools.heldSince = time.Time{}
	h.m.mu.Unlock()
	sem := make(chan struct{}, 8)
	h.m.pools.fill(context.Background(), sem)
	if n := h.rt.creates() - creates; n != 0 {
		t.Fatalf("%d refills started during the burst, want none", n)
	}
	close(bc.release)
	wg.Wait()
	eventually(t, 5*time.Second, "refilled after the burst", func() bool { return poolReady(h, "p") == 3 })
}

// The refill holds back for claims in flight at most refillHold.
func TestPoolRefillHoldIsBounded(t *testing.T) {
	bc := &blockingConfigurer{fakeConfigurer: &fakeConfigurer{}, entered: make(chan string, 1), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) {
		c.Pools.Pools = []PoolConfig{{Name: "p", Min: 1, Max: 1}}
		c.Pools.AgentConfigurer = bc
	})
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 1 })
	creates := h.rt.creates()
	done := make(chan error, 1)
	go func() {
		_, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "stuck"})
		done <- err
	}()
	<-bc.entered
	sem := make(chan struct{}, 8)
	h.m.pools.fill(context.Background(), sem) // starts the hold
	time.Sleep(refillHold)                    // the hold's bound itself, not a race
	h.m.pools.fill(context.Background(), sem)
	eventually(t, 5*time.Second, "refill past the hold", func() bool { return h.rt.creates() > creates })
	close(bc.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
