package lease

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// fakeEgress records what the Manager asks of its egress enforcer.
type fakeEgress struct {
	mu      sync.Mutex
	applied map[string]egress.Policy // lease → last policy
	at      map[string]string        // lease → endpoint
	removed []string
	pruned  []string
}

func newFakeEgress() *fakeEgress {
	return &fakeEgress{applied: map[string]egress.Policy{}, at: map[string]string{}}
}

func (f *fakeEgress) Apply(_ context.Context, lease, endpoint string, p egress.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied[lease], f.at[lease] = p, endpoint
	return nil
}

func (f *fakeEgress) Remove(_ context.Context, lease string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.applied, lease)
	f.removed = append(f.removed, lease)
	return nil
}

func (f *fakeEgress) Prune(_ context.Context, keep func(string) bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for l := range f.applied {
		if !keep(l) {
			delete(f.applied, l)
			f.pruned = append(f.pruned, l)
		}
	}
	return nil
}

func (f *fakeEgress) DNS() []string { return []string{egress.DNSAddress} }

func (f *fakeEgress) policy(lease string) (egress.Policy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.applied[lease]
	return p, ok
}

// TestNetworkPolicyLifecycle: an acquire's policy (or the operator's
// default) is enforced before the lease is READY, recorded with the lease,
// changed by SetNetwork, re-applied after a restart of the manager and
// removed with the sandbox.
func TestNetworkPolicyLifecycle(t *testing.T) {
	eg := newFakeEgress()
	h := newHarness(t, func(c *Config) {
		c.Network.Egress = eg
		c.Network.Default = NetworkPolicy{Mode: NetworkRestricted, Allow: []string{"Example.COM"}}
	})
	ctx := context.Background()
	def, _ := h.acquire("default")
	if got := def.Network; got.Mode != NetworkRestricted || !slices.Equal(got.Allow, []string{"example.com"}) {
		t.Fatalf("default policy: %+v", got)
	}
	if p, ok := eg.policy(def.ID); !ok || p.Mode != egress.ModeRestricted {
		t.Fatalf("enforced: %+v %v", p, ok)
	}
	if dns := h.rt.specs[0].DNS; !slices.Equal(dns, []string{egress.DNSAddress}) {
		t.Errorf("spec DNS = %v", dns)
	}
	own, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "own", Network: &NetworkPolicy{Mode: NetworkNone}})
	if err != nil {
		t.Fatal(err)
	}
	if own.Network.Mode != NetworkNone {
		t.Fatalf("own policy: %+v", own.Network)
	}
	// Bad input names the field.
	for _, p := range []NetworkPolicy{{Mode: "closed"}, {Allow: []string{"10.0.0.0/33"}}, {Deny: []string{"a..b"}}} {
		if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "bad", Network: &p}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("acquire with %+v: %v, want invalid argument", p, err)
		}
		if _, err := h.m.SetNetwork(ctx, own.ID, p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("SetNetwork %+v: %v, want invalid argument", p, err)
		}
	}
	// A change applies at once and is recorded.
	l, err := h.m.SetNetwork(ctx, own.ID, NetworkPolicy{Mode: NetworkOpen, Deny: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Network.Mode != NetworkOpen || h.stored(own.ID).Network.Deny[0] != "10.0.0.0/8" {
		t.Fatalf("after SetNetwork: %+v / stored %+v", l.Network, h.stored(own.ID).Network)
	}
	if p, _ := eg.policy(own.ID); p.Mode != egress.ModeOpen || len(p.Deny) != 1 {
		t.Fatalf("enforced after SetNetwork: %+v", p)
	}
	if _, err := h.m.SetNetwork(ctx, "nope", NetworkPolicy{}); !errdefs.IsNotFound(err) {
		t.Errorf("SetNetwork of a missing lease: %v", err)
	}
	// After a restart of the manager the policies are enforced again.
	h.stop()
	eg.mu.Lock()
	eg.applied = map[string]egress.Policy{"stale": {}}
	eg.mu.Unlock()
	h.start()
	if p, ok := eg.policy(own.ID); !ok || p.Mode != egress.ModeOpen {
		t.Errorf("after restart: %+v %v", p, ok)
	}
	if _, ok := eg.policy("stale"); ok {
		t.Error("the rules of a lease that is gone survived the restart")
	}
	// Releasing removes the rules.
	if _, err := h.m.Release(ctx, own.ID, ""); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := eg.policy(own.ID); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rules still there after release")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := h.m.SetNetwork(ctx, own.ID, NetworkPolicy{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("SetNetwork of a released lease: %v", err)
	}
}

// TestNetworkPolicyNeedsEnforcer: without an enforcer only open policies
// without a deny list are accepted.
func TestNetworkPolicyNeedsEnforcer(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "r", Network: &NetworkPolicy{Mode: NetworkRestricted}}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("restricted without enforcer: %v", err)
	}
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "o", Network: &NetworkPolicy{Mode: NetworkOpen}})
	if err != nil || l.Network.Mode != NetworkOpen {
		t.Fatalf("open without enforcer: %+v %v", l.Network, err)
	}
	if len(h.rt.specs[0].DNS) != 0 {
		t.Errorf("spec DNS without enforcer: %v", h.rt.specs[0].DNS)
	}
}

// TestNetworkPolicyHibernate: a hibernated sandbox's rules go (its address
// is free for another sandbox); a change while it sleeps is recorded, not
// applied; the wake applies it.
func TestNetworkPolicyHibernate(t *testing.T) {
	eg := newFakeEgress()
	h := newHarness(t, func(c *Config) { c.Network.Egress = eg })
	ctx := context.Background()
	l, _ := h.acquire("sleepy")
	if _, ok := eg.policy(l.ID); !ok {
		t.Fatal("no policy enforced at acquire")
	}
	if _, err := h.m.Pause(ctx, l.ID, PauseHibernate); err != nil {
		t.Fatal(err)
	}
	if _, ok := eg.policy(l.ID); ok {
		t.Error("rules kept for a hibernated sandbox")
	}
	if _, err := h.m.SetNetwork(ctx, l.ID, NetworkPolicy{Mode: NetworkNone}); err != nil {
		t.Fatal(err)
	}
	if _, ok := eg.policy(l.ID); ok {
		t.Error("a change was applied to a hibernated sandbox's old address")
	}
	if _, err := h.m.Resume(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if p, ok := eg.policy(l.ID); !ok || p.Mode != egress.ModeNone {
		t.Errorf("after the wake: %+v %v, want mode none", p, ok)
	}
}

// TestNetworkCeiling: requests above the operator's ceiling are refused
// (PERMISSION_DENIED naming the field), the always-denied entries are
// enforced on top of every policy without being recorded, and a policy
// recorded before the ceiling was lowered is enforced lowered after a
// restart.
func TestNetworkCeiling(t *testing.T) {
	eg := newFakeEgress()
	h := newHarness(t, func(c *Config) { c.Network.Egress = eg })
	ctx := context.Background()
	wide, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "wide", Network: &NetworkPolicy{Mode: NetworkOpen}})
	if err != nil {
		t.Fatal(err)
	}
	h.stop()
	h.cfg.Network.Ceiling = NetworkCeiling{MaxMode: egress.ModeRestricted, AlwaysDeny: []string{"10.0.0.0/8"},
		AllowCeiling: []string{"*.example.com"}}
	h.cfg.Network.Default = NetworkPolicy{Mode: NetworkRestricted}
	h.start()
	if p, _ := eg.policy(wide.ID); p.Mode != egress.ModeRestricted || len(p.Allow) != 0 || !slices.Equal(p.Deny, []string{"10.0.0.0/8"}) {
		t.Errorf("a lease recorded open, after the ceiling was lowered: enforced %+v", p)
	}
	if got := h.get(wide.ID).Network; got.Mode != NetworkOpen {
		t.Errorf("the recorded policy changed: %+v", got)
	}
	for field, p := range map[string]NetworkPolicy{
		"network.mode":     {Mode: NetworkOpen},
		"network.allow[1]": {Mode: NetworkRestricted, Allow: []string{"a.example.com", "example.org"}},
	} {
		_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "above", Network: &p})
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), field) {
			t.Errorf("acquire %+v: %v, want permission denied naming %s", p, err, field)
		}
		if _, err := h.m.SetNetwork(ctx, wide.ID, p); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), field) {
			t.Errorf("SetNetwork %+v: %v, want permission denied naming %s", p, err, field)
		}
	}
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "under",
		Network: &NetworkPolicy{Mode: NetworkRestricted, Allow: []string{"api.example.com"}, Deny: []string{"bad.example.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Network.Deny, []string{"bad.example.com"}) {
		t.Errorf("recorded deny list: %v (the operator's is not recorded)", l.Network.Deny)
	}
	if p, _ := eg.policy(l.ID); !slices.Equal(p.Allow, []string{"api.example.com"}) || !slices.Equal(p.Deny, []string{"bad.example.com", "10.0.0.0/8"}) {
		t.Errorf("enforced: %+v", p)
	}
	// A client replacing its deny list cannot drop the operator's.
	if _, err := h.m.SetNetwork(ctx, l.ID, NetworkPolicy{Mode: NetworkNone}); err != nil {
		t.Fatal(err)
	}
	if p, _ := eg.policy(l.ID); p.Mode != egress.ModeNone || !slices.Equal(p.Deny, []string{"10.0.0.0/8"}) {
		t.Errorf("enforced after SetNetwork: %+v", p)
	}
}
