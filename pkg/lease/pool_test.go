package lease

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// fakeConfigurer records Configure calls and refuses a second one for the
// same endpoint, as the agent does.
type fakeConfigurer struct {
	mu    sync.Mutex
	calls []configureCall
	err   error
	seen  map[string]bool
}

type configureCall struct {
	endpoint, token string
	env, secrets    map[string]string
}

func (f *fakeConfigurer) Configure(_ context.Context, a AgentTarget, token string, env, secrets map[string]string) error {
	endpoint := a.Endpoint
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if f.seen == nil {
		f.seen = map[string]bool{}
	}
	if f.seen[endpoint] {
		return errdefs.FailedPrecondition("configured already")
	}
	f.seen[endpoint] = true
	f.calls = append(f.calls, configureCall{endpoint, token, maps.Clone(env), maps.Clone(secrets)})
	return nil
}

func (f *fakeConfigurer) callsCopy() []configureCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]configureCall(nil), f.calls...)
}

// poolHarness starts a Manager with pools and a fake configurer.
func poolHarness(t *testing.T, pools []PoolConfig, tweak func(*Config)) (*harness, *fakeConfigurer) {
	t.Helper()
	fc := &fakeConfigurer{}
	h := newHarness(t, func(c *Config) {
		c.Pools.Pools = pools
		c.Pools.AgentConfigurer = fc
		if tweak != nil {
			tweak(c)
		}
	})
	return h, fc
}

func poolReady(h *harness, name string) int { return len(h.m.pools.snapshot()[name]) }

func poolStat(h *harness, name string) PoolStats {
	for _, p := range h.m.PoolStats() {
		if p.Name == name {
			return p
		}
	}
	h.t.Fatalf("no pool %s", name)
	return PoolStats{}
}

// pooledBoxes counts the fake runtime's containers of pool name.
func pooledBoxes(h *harness, name string) int {
	boxes, _ := h.rt.List(context.Background(), runtime.Selector{runtime.LabelPool: name})
	return len(boxes)
}

func TestPoolClaimAppliesTheLeaseAndRefills(t *testing.T) {
	h, fc := poolHarness(t, []PoolConfig{{Name: "py", Min: 2, Max: 3}}, nil)
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "py") == 2 })
	ready := h.m.pools.snapshot()["py"]

	l, tok, created, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1", Labels: map[string]string{"team": "a"},
		Env: map[string]string{"A": "1"}, Secrets: map[string]string{"S": "secret-value"}, TTL: time.Hour, IdleTimeout: time.Minute})
	if err != nil || !created {
		t.Fatalf("acquire: %v created=%v", err, created)
	}
	if l.Pool != "py" || l.ID != ready[0] || l.State != StateReady {
		t.Fatalf("lease %s pool %q state %s, want the oldest pooled id %s from py, READY", l.ID, l.Pool, l.State, ready[0])
	}
	if id, ok := h.m.Tokens().VerifyToken(tok); !ok || id != l.ID {
		t.Fatalf("token does not verify for the lease")
	}
	if l.Labels["team"] != "a" || l.TTL != time.Hour || l.IdleTimeout != time.Minute || l.Env["A"] != "1" || len(l.SecretNames) != 1 {
		t.Fatalf("the request's fields are not the lease's: %+v", l)
	}
	calls := fc.callsCopy()
	if len(calls) != 1 || calls[0].endpoint != l.Endpoint || calls[0].token != h.m.Tokens().AgentToken(l.ID) ||
		calls[0].env["A"] != "1" || calls[0].secrets["S"] != "secret-value" {
		t.Fatalf("configure calls %+v", calls)
	}
	sb, err := h.rt.Get(context.Background(), l.ContainerID)
	if err != nil || sb.LeaseID != l.ID || sb.Labels[runtime.LabelPool] != "py" {
		t.Fatalf("container %+v (%v): want the pooled one, labelled with the lease id", sb, err)
	}
	// The secret's value is never stored.
	st, _ := h.store.Get(l.ID)
	if s, _ := jsonOf(st); strings.Contains(s, "secret-value") {
		t.Fatalf("store holds the secret: %s", s)
	}
	eventually(t, 5*time.Second, "pool refilled", func() bool { return poolReady(h, "py") == 2 })
	if ps := poolStat(h, "py"); ps.Hits != 1 || ps.Misses != 0 || ps.RefillCount != 3 {
		t.Fatalf("stats %+v", ps)
	}
	// The lease's container is the lease's: a resync keeps it and the pool.
	h.m.ctrl.resync(context.Background())
	if !h.rt.exists(l.ContainerID) || poolReady(h, "py") != 2 {
		t.Fatalf("resync removed the claimed or pooled containers")
	}
	if _, err := h.m.Release(context.Background(), l.ID, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "claimed container removed", func() bool { return !h.rt.exists(l.ContainerID) })
}

func TestPoolNeverHandsOutASandboxTwice(t *testing.T) {
	h, fc := poolHarness(t, []PoolConfig{{Name: "p", Min: 5, Max: 5}}, nil)
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 5 })
	h.rt.set(func(f *fakeRuntime) { f.createDelay = 200 * time.Millisecond })
	const n = 20
	var wg sync.WaitGroup
	leases := make([]Lease, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], _, _, errs[i] = h.m.Acquire(context.Background(), AcquireRequest{ConversationID: fmt.Sprintf("c%d", i)})
		}()
	}
	wg.Wait()
	containers, ids := map[string]bool{}, map[string]bool{}
	warm := 0
	for i, l := range leases {
		if errs[i] != nil {
			t.Fatalf("acquire %d: %v", i, errs[i])
		}
		if containers[l.ContainerID] || ids[l.ID] {
			t.Fatalf("container %s or id %s handed out twice", l.ContainerID, l.ID)
		}
		containers[l.ContainerID], ids[l.ID] = true, true
		if l.Pool != "" {
			warm++
		}
	}
	// At least the 5 ready ones were claimed (a slow goroutine may find a
	// refilled one), each once; the others missed.
	ps := poolStat(h, "p")
	if warm < 5 || uint64(warm) != ps.Hits || ps.Hits+ps.Misses != n || len(fc.callsCopy()) != warm {
		t.Fatalf("warm %d, stats %+v, configure calls %d: want >= 5 hits, one Configure each, hits+misses = %d", warm, ps, len(fc.callsCopy()), n)
	}
}

func TestPoolMissAndOtherProfilesCreateCold(t *testing.T) {
	h, _ := poolHarness(t, []PoolConfig{{Name: "small", Min: 1, Max: 1, Resources: runtime.Resources{MemoryBytes: 256 << 20}}}, nil)
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "small") == 1 })
	// Another profile never claims.
	l, _ := h.acquire("other")
	if l.Pool != "" {
		t.Fatalf("a default acquire claimed from a pool of another profile")
	}
	// The pool's profile: the first claims, the next finds the pool empty
	// (its refill is slow) and creates one cold.
	h.rt.set(func(f *fakeRuntime) { f.createDelay = 300 * time.Millisecond })
	req := AcquireRequest{ConversationID: "a", Resources: runtime.Resources{MemoryBytes: 256 << 20}}
	a, _, _, err := h.m.Acquire(context.Background(), req)
	if err != nil || a.Pool != "small" {
		t.Fatalf("first acquire: %v pool %q", err, a.Pool)
	}
	req.ConversationID = "b"
	b, _, _, err := h.m.Acquire(context.Background(), req)
	if err != nil || b.Pool != "" || b.State != StateReady {
		t.Fatalf("second acquire: %v pool %q state %s, want a cold READY lease", err, b.Pool, b.State)
	}
	if ps := poolStat(h, "small"); ps.Hits != 1 || ps.Misses != 1 {
		t.Fatalf("stats %+v", ps)
	}
	// Pooled sandboxes were created without a conversation and with the
	// pool's labels; cold ones without.
	h.rt.set(func(f *fakeRuntime) {
		for _, sp := range f.specs {
			if (sp.Pool != "") == (sp.ConversationID != "") {
				t.Errorf("spec %+v: a pooled spec has no conversation, a cold one no pool", sp)
			}
		}
	})
}

func TestPoolConfigureFailureFallsBackToCold(t *testing.T) {
	h, fc := poolHarness(t, []PoolConfig{{Name: "p", Min: 1, Max: 1}}, nil)
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 1 })
	pooled := h.m.pools.snapshot()["p"][0]
	fc.mu.Lock()
	fc.err = errdefs.Unavailable("agent gone")
	fc.mu.Unlock()
	l, _ := h.acquire("c")
	if l.Pool != "" || l.ID != pooled || l.State != StateReady {
		t.Fatalf("lease %+v: want a cold sandbox under the claimed id", l)
	}
	boxes, _ := h.rt.List(context.Background(), runtime.Selector{runtime.LabelLease: l.ID})
	if len(boxes) != 1 || boxes[0].ID != l.ContainerID || boxes[0].Labels[runtime.LabelPool] != "" {
		t.Fatalf("containers of the lease %+v: want only the cold one", boxes)
	}
}

func TestPoolLimitIsSeparateFromLeaseQuotas(t *testing.T) {
	h, _ := poolHarness(t, []PoolConfig{{Name: "a", Min: 3, Max: 3}, {Name: "b", Min: 3, Max: 3, Resources: runtime.Resources{PidsLimit: 64}}},
		func(c *Config) { c.Pools.MaxPooled = 4; c.Admission.MaxLive = 1 })
	eventually(t, 5*time.Second, "pools filled to the limit", func() bool { return poolReady(h, "a")+poolReady(h, "b") == 4 })
	time.Sleep(200 * time.Millisecond)
	if n := poolReady(h, "a") + poolReady(h, "b"); n != 4 || h.rt.count() != 4 {
		t.Fatalf("%d pooled (%d containers), the limit is 4", n, h.rt.count())
	}
	// Pooled sandboxes are not leases: MaxLive 1 still admits one.
	if st := h.m.Stats(); st.Live != 0 {
		t.Fatalf("live %d with only pooled sandboxes", st.Live)
	}
	l, _ := h.acquire("one")
	if l.Pool != "a" {
		t.Fatalf("lease pool %q", l.Pool)
	}
	if _, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "two"}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("second lease: %v, want RESOURCE_EXHAUSTED (MaxLive 1)", err)
	}
}

func TestPoolAdoptedAfterRestart(t *testing.T) {
	pools := []PoolConfig{{Name: "p", Min: 2, Max: 3}, {Name: "gone", Min: 1, Max: 1, Resources: runtime.Resources{PidsLimit: 64}}}
	h, _ := poolHarness(t, pools, nil)
	eventually(t, 5*time.Second, "pools filled", func() bool { return poolReady(h, "p") == 2 && poolReady(h, "gone") == 1 })
	l, _ := h.acquire("kept")
	eventually(t, 5*time.Second, "refilled", func() bool { return poolReady(h, "p") == 2 })
	before := map[string]bool{}
	for _, id := range h.m.pools.snapshot()["p"] {
		before[id] = true
	}
	creates := h.rt.creates()

	// Restart with pool "gone" no longer configured.
	h.cfg.Pools.Pools = pools[:1]
	h.restart()
	if got := h.get(l.ID); got.State != StateReady || got.ContainerID != l.ContainerID || got.Pool != "p" {
		t.Fatalf("claimed lease after restart: %+v", got)
	}
	after := h.m.pools.snapshot()["p"]
	if len(after) != 2 || !before[after[0]] || !before[after[1]] {
		t.Fatalf("adopted %v, want the two ready members %v", after, before)
	}
	if pooledBoxes(h, "gone") != 0 {
		t.Fatalf("members of an unconfigured pool were not removed")
	}
	time.Sleep(300 * time.Millisecond)
	if h.rt.creates() != creates {
		t.Fatalf("%d creations after restart, want none (adopted)", h.rt.creates()-creates)
	}

	// A smaller max: the excess goes. Another profile: all are replaced.
	h.cfg.Pools.Pools = []PoolConfig{{Name: "p", Min: 1, Max: 1}}
	h.restart()
	if got := h.m.pools.snapshot()["p"]; len(got) != 1 || !before[got[0]] {
		t.Fatalf("after restart with max 1: %v", got)
	}
	if n := pooledBoxes(h, "p"); n != 2 { // the member and the lease's
		t.Fatalf("%d containers labelled p, want 2 (one member, one claimed)", n)
	}
	h.cfg.Pools.Pools = []PoolConfig{{Name: "p", Min: 1, Max: 1, Resources: runtime.Resources{PidsLimit: 99}}}
	h.restart()
	eventually(t, 5*time.Second, "refilled with the new profile", func() bool {
		got := h.m.pools.snapshot()["p"]
		return len(got) == 1 && !before[got[0]]
	})
	if !h.rt.exists(l.ContainerID) {
		t.Fatalf("the claimed lease's container was removed")
	}
}

func TestPoolReplacesADeadMember(t *testing.T) {
	h, _ := poolHarness(t, []PoolConfig{{Name: "p", Min: 1, Max: 1}}, nil)
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 1 })
	id := h.m.pools.snapshot()["p"][0]
	boxes, _ := h.rt.List(context.Background(), runtime.Selector{runtime.LabelLease: id})
	h.rt.kill(boxes[0].ID, 137, false)
	eventually(t, 5*time.Second, "replaced", func() bool {
		got := h.m.pools.snapshot()["p"]
		return len(got) == 1 && got[0] != id && !h.rt.exists(boxes[0].ID)
	})
}

func TestPoolConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		pools []PoolConfig
		field string
	}{
		{[]PoolConfig{{Name: "Bad Name", Max: 1}}, "pools[0].name"},
		{[]PoolConfig{{Name: "a", Max: 1}, {Name: "a", Max: 1}}, "pools[1].name"},
		{[]PoolConfig{{Name: "a", Min: 2, Max: 1}}, "pools[0].max"},
		{[]PoolConfig{{Name: "a", Max: 1, Resources: runtime.Resources{PidsLimit: -1}}}, "resources"},
	} {
		st, err := OpenBolt(filepath.Join(t.TempDir(), DBFileName))
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(Config{Store: st, Runtime: newFakeRuntime(), Secret: testSecret, Pools: PoolsConfig{Pools: tc.pools}})
		st.Close()
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("pools %+v: %v, want INVALID_ARGUMENT naming %s", tc.pools, err, tc.field)
		}
	}
}

// TestPoolConfiguredMemberIsNeverReused: a crash between a claim's
// Configure and its READY record leaves a configured sandbox with no
// record; it is adopted back, but the next claim finds its agent
// configured (the agent's Configure is one-shot), removes it and creates
// a sandbox cold.
func TestPoolConfiguredMemberIsNeverReused(t *testing.T) {
	h, fc := poolHarness(t, []PoolConfig{{Name: "p", Min: 1, Max: 1}}, nil)
	eventually(t, 5*time.Second, "pool filled", func() bool { return poolReady(h, "p") == 1 })
	id := h.m.pools.snapshot()["p"][0]
	boxes, _ := h.rt.List(context.Background(), runtime.Selector{runtime.LabelLease: id})
	if err := fc.Configure(context.Background(), AgentTarget{Endpoint: boxes[0].Endpoint}, h.m.Tokens().AgentToken(id), map[string]string{"A": "tenant-1"}, nil); err != nil {
		t.Fatal(err)
	}
	h.restart()
	if got := h.m.pools.snapshot()["p"]; len(got) != 1 || got[0] != id {
		t.Fatalf("after restart: %v, want %s adopted", got, id)
	}
	l, _ := h.acquire("tenant-2")
	if l.Pool != "" || l.ContainerID == boxes[0].ID || h.rt.exists(boxes[0].ID) {
		t.Fatalf("lease %+v: want a cold sandbox and the configured one removed", l)
	}
}
