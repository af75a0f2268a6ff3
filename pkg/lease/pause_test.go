package lease

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Pause and Resume make fakeRuntime a runtime.Freezer.
func (f *fakeRuntime) Pause(ctx context.Context, id string) error {
	return f.setFrozen(id, runtime.StateRunning, runtime.StatePaused)
}

func (f *fakeRuntime) Resume(ctx context.Context, id string) error {
	return f.setFrozen(id, runtime.StatePaused, runtime.StateRunning)
}

func (f *fakeRuntime) setFrozen(id string, from, to runtime.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.boxes[id]
	switch {
	case !ok:
		return errdefs.NotFound("container %s", id)
	case sb.State != from:
		return errdefs.FailedPrecondition("container %s is %s", id, sb.State)
	}
	sb.State = to
	return nil
}

func (f *fakeRuntime) state(id string) runtime.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.boxes[id]; ok {
		return sb.State
	}
	return ""
}

func lastReason(l Lease) string { return l.Transitions[len(l.Transitions)-1].Reason }

// pausedAcross acquires a lease, pauses it with mode, stops the Manager,
// sets its container's engine state to st (as a crash or an engine restart
// would leave it), starts the Manager again and returns the lease as it
// was at the pause.
func (h *harness) pausedAcross(mode PauseMode, st runtime.State) Lease {
	h.t.Helper()
	l, _ := h.acquire("c1")
	if _, err := h.m.Pause(context.Background(), l.ID, mode); err != nil {
		h.t.Fatal(err)
	}
	h.stop()
	h.rt.set(func(f *fakeRuntime) { f.boxes[l.ContainerID].State = st })
	h.start()
	return l
}

func TestPauseFreezeResume(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _ := h.acquire("c1")
	p, err := h.m.Pause(ctx, l.ID, PauseFreeze)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != StatePaused || p.Paused != PauseFreeze || p.PausedAt.IsZero() || lastReason(p) != ReasonFrozen {
		t.Fatalf("paused lease: %+v", p)
	}
	if st := h.rt.state(l.ContainerID); st != runtime.StatePaused {
		t.Fatalf("container is %s, want paused", st)
	}
	if again, err := h.m.Pause(ctx, l.ID, PauseFreeze); err != nil || again.State != StatePaused {
		t.Fatalf("pause again: %v %v", again.State, err)
	}
	if _, err := h.m.Pause(ctx, l.ID, PauseHibernate); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("hibernate a frozen lease: %v", err)
	}
	// A renewal (a workspace's background loop) keeps a paused lease
	// paused.
	if rn, err := h.m.Renew(ctx, l.ID, 0); err != nil || rn.State != StatePaused {
		t.Fatalf("renew a paused lease: %v %v, want it renewed and still paused", rn.State, err)
	}
	r, err := h.m.Resume(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateReady || r.Paused != "" || lastReason(r) != ReasonThawed || r.Endpoint != l.Endpoint {
		t.Fatalf("resumed lease: %+v", r)
	}
	if st := h.rt.state(l.ContainerID); st != runtime.StateRunning {
		t.Fatalf("container is %s, want running", st)
	}
	if again, err := h.m.Resume(ctx, l.ID); err != nil || again.State != StateReady {
		t.Fatalf("resume a ready lease: %v %v", again.State, err)
	}
}

func TestPauseHibernateResume(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _ := h.acquire("c1")
	p, err := h.m.Pause(ctx, l.ID, PauseHibernate)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != StatePaused || p.Paused != PauseHibernate || !strings.Contains(lastReason(p), "processes are gone") {
		t.Fatalf("paused lease: %+v", p)
	}
	if st := h.rt.state(l.ContainerID); st != runtime.StateExited {
		t.Fatalf("container is %s, want exited", st)
	}
	// The stop's died event is not a crash: no restart, no failure.
	time.Sleep(150 * time.Millisecond)
	if n := h.rt.restartCount(); n != 0 {
		t.Fatalf("%d restarts after a deliberate stop", n)
	}
	if g := h.get(l.ID); g.State != StatePaused {
		t.Fatalf("lease is %s", g.State)
	}
	r, err := h.m.Resume(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateReady || r.Restarts != 0 || lastReason(r) != ReasonWoken || r.Endpoint == l.Endpoint {
		t.Fatalf("resumed lease: %+v", r)
	}
	if st := h.rt.state(l.ContainerID); st != runtime.StateRunning {
		t.Fatalf("container is %s, want running", st)
	}
}

func TestPauseWithoutFreezer(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c1")
	h.stop()
	st, err := OpenBolt(h.path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := h.cfg
	cfg.Store, cfg.Runtime = st, struct{ Runtime }{h.rt}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Pause(context.Background(), l.ID, PauseFreeze); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cannot freeze") {
		t.Fatalf("freeze without a Freezer: %v", err)
	}
	if _, err := m.Pause(context.Background(), l.ID, PauseHibernate); err != nil {
		t.Fatalf("hibernate without a Freezer: %v", err)
	}
}

func TestResumeOnce(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _ := h.acquire("c1")
	if _, err := h.m.Pause(ctx, l.ID, PauseHibernate); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.restartGate = gate })
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := h.m.Resume(ctx, l.ID)
			if err == nil && r.State != StateReady {
				err = errdefs.FailedPrecondition("state %s", r.State)
			}
			errs <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := h.rt.restartCount(); n != 1 {
		t.Fatalf("%d restarts for 8 concurrent resumes, want 1", n)
	}
}

func TestAcquireResumesPaused(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c1")
	if _, err := h.m.Pause(context.Background(), l.ID, PauseFreeze); err != nil {
		t.Fatal(err)
	}
	again, _ := h.acquire("c1")
	if again.ID != l.ID || again.State != StateReady || h.rt.creates() != 1 {
		t.Fatalf("acquire of a paused conversation: %s %s, %d creates", again.ID, again.State, h.rt.creates())
	}
}

func TestPausedRetention(t *testing.T) {
	// The lease clock is the test's (the reaper's passes are called
	// directly), so a loaded machine cannot idle-expire the lease between
	// its acquire and its pause.
	var mu sync.Mutex
	clock := time.Unix(1_700_000_000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	h := newHarness(t, func(c *Config) { c.Now = now; c.Pause.PausedRetention = 10 * time.Minute })
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1", TTL: time.Hour, IdleTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Pause(context.Background(), l.ID, PauseFreeze); err != nil {
		t.Fatal(err)
	}
	advance(5 * time.Minute) // past the idle timeout, within the paused retention
	h.m.reaper.once()
	if g := h.get(l.ID); g.State != StatePaused {
		t.Fatalf("paused lease idle-expired: %s %s", g.State, g.Reason)
	}
	advance(6 * time.Minute) // past the paused retention
	h.m.reaper.once()
	eventually(t, 2*time.Second, "paused lease expires", func() bool { return h.get(l.ID).State == StateExpired })
	if r := h.get(l.ID).Reason; !strings.Contains(r, "paused retention") {
		t.Fatalf("reason %q", r)
	}
	eventually(t, 2*time.Second, "container removed", func() bool { return !h.rt.exists(l.ContainerID) })
}

func TestReleasePaused(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c1")
	if _, err := h.m.Pause(context.Background(), l.ID, PauseFreeze); err != nil {
		t.Fatal(err)
	}
	r, err := h.m.Release(context.Background(), l.ID, "")
	if err != nil || r.State != StateReleased || h.rt.exists(l.ContainerID) {
		t.Fatalf("release of a paused lease: %s %v", r.State, err)
	}
}

func TestPauseSurvivesRestart(t *testing.T) {
	for _, mode := range []PauseMode{PauseFreeze, PauseHibernate} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, nil)
			l, _ := h.acquire("c1")
			if _, err := h.m.Pause(context.Background(), l.ID, mode); err != nil {
				t.Fatal(err)
			}
			want := h.rt.state(l.ContainerID)
			h.restart()
			time.Sleep(100 * time.Millisecond)
			g := h.get(l.ID)
			if g.State != StatePaused || g.Paused != mode || !h.rt.exists(l.ContainerID) || h.rt.state(l.ContainerID) != want || h.rt.restartCount() != 0 {
				t.Fatalf("after restart: %s %s, container %s (want %s), %d restarts", g.State, g.Paused, h.rt.state(l.ContainerID), want, h.rt.restartCount())
			}
			if r, err := h.m.Resume(context.Background(), l.ID); err != nil || r.State != StateReady {
				t.Fatalf("resume after restart: %v", err)
			}
		})
	}
}

// A crash between a pause's store write and its runtime call (or a
// resume's runtime call and its store write) leaves a PAUSED lease with a
// running container: reconcile pauses it again.
func TestReconcileRepauses(t *testing.T) {
	for _, mode := range []PauseMode{PauseFreeze, PauseHibernate} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, nil)
			l := h.pausedAcross(mode, runtime.StateRunning)
			want := runtime.StatePaused
			if mode == PauseHibernate {
				want = runtime.StateExited
			}
			if st := h.rt.state(l.ContainerID); st != want || h.get(l.ID).State != StatePaused {
				t.Fatalf("container %s (want %s), lease %s", st, want, h.get(l.ID).State)
			}
		})
	}
}

// A frozen sandbox stopped while the orchestrator was away (an engine
// restart) is hibernated now, and says so.
func TestReconcileFreezeLost(t *testing.T) {
	h := newHarness(t, nil)
	l := h.pausedAcross(PauseFreeze, runtime.StateExited)
	g := h.get(l.ID)
	if g.State != StatePaused || g.Paused != PauseHibernate || g.Reason != ReasonFreezeLost {
		t.Fatalf("lease %s %s %q", g.State, g.Paused, g.Reason)
	}
	if r, err := h.m.Resume(context.Background(), l.ID); err != nil || r.State != StateReady {
		t.Fatalf("resume: %v", err)
	}
}

func TestParsePauseMode(t *testing.T) {
	for in, want := range map[string]PauseMode{"": PauseFreeze, "Freeze": PauseFreeze, "hibernate": PauseHibernate} {
		if got, err := ParsePauseMode("mode", in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	if _, err := ParsePauseMode("mode", "sleep"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("sleep: %v", err)
	}
}

func TestIdlePolicyPauses(t *testing.T) {
	for _, p := range []IdlePolicy{IdleFreeze, IdleHibernate} {
		t.Run(string(p), func(t *testing.T) {
			h := newHarness(t, nil)
			l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1", IdleTimeout: 100 * time.Millisecond, IdlePolicy: p})
			if err != nil || l.IdlePolicy != p {
				t.Fatalf("acquire: %v %v", l.IdlePolicy, err)
			}
			eventually(t, 2*time.Second, "idle lease paused", func() bool {
				g := h.get(l.ID)
				return g.State == StatePaused && g.Paused == PauseMode(p)
			})
			if r := h.get(l.ID).Reason; !strings.HasPrefix(r, "idle for 100ms; paused ("+string(p)+")") {
				t.Fatalf("reason %q", r)
			}
			// A later acquire of the conversation resumes it.
			again, _ := h.acquire("c1")
			if again.ID != l.ID || again.State != StateReady {
				t.Fatalf("acquire after idle pause: %s %s", again.ID, again.State)
			}
		})
	}
}

func TestDefaultIdlePolicy(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Pause.DefaultIdlePolicy = IdleHibernate })
	l, _ := h.acquire("c1")
	if l.IdlePolicy != IdleHibernate {
		t.Fatalf("idle policy %q", l.IdlePolicy)
	}
	if _, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c2", IdlePolicy: "nap"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("unknown policy: %v", err)
	}
	// Without a Freezer, freeze is refused at New and at acquire.
	cfg := h.cfg
	cfg.Store, cfg.Runtime, cfg.Pause.DefaultIdlePolicy = h.store, struct{ Runtime }{h.rt}, IdleFreeze
	if _, err := New(cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "cannot freeze") {
		t.Fatalf("New with default freeze and no Freezer: %v", err)
	}
	cfg.Pause.DefaultIdlePolicy = ""
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.cfg.Pause.idlePolicy(m.rt, "idle_policy", IdleFreeze); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("freeze policy without a Freezer: %v", err)
	}
	if p, err := ParseIdlePolicy("idle_policy", " Hibernate"); err != nil || p != IdleHibernate {
		t.Fatalf("parse: %v %v", p, err)
	}
}

// Pause and resume are events with their transitions (the Watch stream).
func TestPauseEvents(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := h.m.Subscribe(ctx, EventFilter{})
	if _, err := h.m.Pause(ctx, l.ID, PauseHibernate); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Resume(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		select {
		case ev := <-ch:
			if ev.Transition != nil && ev.Lease.ID == l.ID {
				got = append(got, ev.Transition.From.String()+"->"+ev.Transition.To.String())
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("events: %v", got)
		}
	}
	if got[0] != "READY->PAUSED" || got[1] != "PAUSED->READY" {
		t.Fatalf("events: %v", got)
	}
}

// A READY lease past its TTL is expired by Pause, not paused.
func TestPauseExpiredLease(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ReapInterval = time.Hour })
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1", TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := h.m.Pause(context.Background(), l.ID, PauseFreeze); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("pause past the ttl: %v", err)
	}
	if g := h.get(l.ID); g.State != StateExpired || h.rt.state(l.ContainerID) == runtime.StatePaused {
		t.Fatalf("lease %s, container %s", g.State, h.rt.state(l.ContainerID))
	}
}

// A paused lease's container found running after reconcile (a resume the
// previous process had sent finished in the engine later) is paused again
// by resync.
func TestResyncRepauses(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ResyncInterval = 50 * time.Millisecond })
	l, _ := h.acquire("c1")
	if _, err := h.m.Pause(context.Background(), l.ID, PauseHibernate); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	h.rt.set(func(f *fakeRuntime) { f.boxes[l.ContainerID].State = runtime.StateRunning })
	eventually(t, 2*time.Second, "container stopped again", func() bool { return h.rt.state(l.ContainerID) == runtime.StateExited })
	if g := h.get(l.ID); g.State != StatePaused || g.Restarts != 0 {
		t.Fatalf("lease %s, %d restarts", g.State, g.Restarts)
	}
	if r, err := h.m.Resume(context.Background(), l.ID); err != nil || r.State != StateReady {
		t.Fatalf("resume: %v", err)
	}
}

// TestPauseConfigDefaults: zero fields take DefaultPauseConfig's, a
// negative PausedRetention stays (keep paused leases), an unknown default
// idle policy is refused naming default_idle_policy.
func TestPauseConfigDefaults(t *testing.T) {
	if got, err := (PauseConfig{}).withDefaults(); err != nil || got != DefaultPauseConfig() {
		t.Fatalf("zero config: %+v %v, want %+v", got, err, DefaultPauseConfig())
	}
	if got, err := (PauseConfig{PausedRetention: -1}).withDefaults(); err != nil || got.PausedRetention != -1 || got.DefaultIdlePolicy != IdleExpire {
		t.Fatalf("negative retention: %+v %v", got, err)
	}
	if err := (PauseConfig{DefaultIdlePolicy: "nap"}).Validate(); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "default_idle_policy") {
		t.Fatalf("unknown policy: %v", err)
	}
}

// hibernatingRuntime is fakeRuntime with a Hibernate (a hibernator): it
// stops the sandbox, then leaves it without a task, as the containerd
// backend does (created).
type hibernatingRuntime struct {
	*fakeRuntime
	hibernated []string
}

func (r *hibernatingRuntime) Hibernate(ctx context.Context, id string, grace time.Duration) error {
	if err := r.Stop(ctx, id, grace); err != nil {
		return err
	}
	r.set(func(f *fakeRuntime) { f.boxes[id].State = runtime.StateCreated })
	r.mu.Lock()
	r.hibernated = append(r.hibernated, id)
	r.mu.Unlock()
	return nil
}

// A Runtime with a Hibernate is hibernated with it; its task-less sandbox
// (created) stays PAUSED across a restart of the Manager and wakes with
// Restart.
func TestPauseHibernateWithHibernator(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c1")
	h.stop()
	hr := &hibernatingRuntime{fakeRuntime: h.rt}
	// open starts a Manager on hr over the harness's store; closing it
	// also closes the store.
	open := func() (*Manager, func()) {
		st, err := OpenBolt(h.path)
		if err != nil {
			t.Fatal(err)
		}
		cfg := h.cfg
		cfg.Store, cfg.Runtime = st, hr
		m, cancel := startManager(t, cfg)
		var once sync.Once
		closeAll := func() { once.Do(func() { cancel(); m.Close(); st.Close() }) }
		t.Cleanup(closeAll)
		return m, closeAll
	}
	m, closeM := open()
	ctx := context.Background()
	if _, err := m.Pause(ctx, l.ID, PauseHibernate); err != nil {
		t.Fatal(err)
	}
	hr.mu.Lock()
	calls := append([]string(nil), hr.hibernated...)
	hr.mu.Unlock()
	if len(calls) != 1 || calls[0] != l.ContainerID || h.rt.state(l.ContainerID) != runtime.StateCreated {
		t.Fatalf("Hibernate calls %v, container %s; want one for %s, created", calls, h.rt.state(l.ContainerID), l.ContainerID)
	}
	closeM()
	m, _ = open()
	g, err := m.Get(ctx, l.ID)
	if err != nil || g.State != StatePaused || g.Paused != PauseHibernate || g.Restarts != 0 {
		t.Fatalf("after a restart of the Manager: %+v, %v; want PAUSED hibernate", g, err)
	}
	r, err := m.Resume(ctx, l.ID)
	if err != nil || r.State != StateReady || h.rt.state(l.ContainerID) != runtime.StateRunning {
		t.Fatalf("resume: %+v, %v; container %s", r, err, h.rt.state(l.ContainerID))
	}
}
