package lease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestOOMEventKeepsLease: the kernel OOM-killing a process of a sandbox
// (the engine's oom event, the container still running) changes nothing
// about the lease; the event is counted.
func TestOOMEventKeepsLease(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	h.rt.emit(runtime.Event{Kind: runtime.EventOOM, ID: l.ContainerID, LeaseID: l.ID, At: time.Now()})
	eventually(t, 2*time.Second, "oom event counted", func() bool { return h.m.Stats().OOMEvents == 1 })
	time.Sleep(100 * time.Millisecond)
	if got := h.get(l.ID); got.State != StateReady || len(got.Transitions) != len(l.Transitions) || got.Restarts != 0 {
		t.Fatalf("after an oom event: %s %q restarts %d, want READY and unchanged", got.State, got.Reason, got.Restarts)
	}
	if h.rt.restartCount() != 0 || !h.rt.exists(l.ContainerID) {
		t.Fatal("the sandbox was touched")
	}
}

// TestDiedRestartsInPlace: a container that exits (agent crash, kill from
// outside, the agent OOM-killed) is restarted in place: same container, the
// endpoint re-read, READY → PENDING → READY with the reasons, Restarts
// counted, persisted.
func TestDiedRestartsInPlace(t *testing.T) {
	h := newHarness(t, nil)
	a, tok := h.acquire("a")
	b, _ := h.acquire("b")
	h.rt.kill(a.ContainerID, 137, false)
	h.rt.kill(b.ContainerID, 137, true) // the agent itself OOM-killed
	for _, c := range []struct {
		l           Lease
		why, after  string
		wantOOMStat bool
	}{
		{a, "container exited with code 137; restarting", "restarted after exit 137", false},
		{b, "container exited with code 137 (an OOM kill was reported in it); restarting", "restarted after exit 137", true},
	} {
		eventually(t, 2*time.Second, "restarted", func() bool { got := h.get(c.l.ID); return got.State == StateReady && got.Restarts == 1 })
		got := h.get(c.l.ID)
		if got.ContainerID != c.l.ContainerID || got.Endpoint == c.l.Endpoint || got.Endpoint == "" || got.Reason != c.after {
			t.Errorf("%s: container %s endpoint %s reason %q; want the same container %s at a new endpoint, %q",
				c.l.ConversationID, got.ContainerID, got.Endpoint, got.Reason, c.l.ContainerID, c.after)
		}
		n := len(got.Transitions)
		if n < 2 || got.Transitions[n-2].From != StateReady || got.Transitions[n-2].To != StatePending || got.Transitions[n-2].Reason != c.why ||
			got.Transitions[n-1].To != StateReady {
			t.Errorf("%s: transitions %+v", c.l.ConversationID, got.Transitions)
		}
		// The store is written right after memory changes.
		eventually(t, 2*time.Second, "persisted", func() bool { st, _ := h.store.Get(c.l.ID); return st.State == StateReady })
		if st, _ := h.store.Get(c.l.ID); st.State != StateReady || st.Restarts != 1 || st.Endpoint != got.Endpoint {
			t.Errorf("%s: stored %s restarts %d endpoint %s", c.l.ConversationID, st.State, st.Restarts, st.Endpoint)
		}
	}
	if s := h.m.Stats(); s.OOMEvents != 1 || s.Restarts != 2 || s.RestartFailures != 0 {
		t.Errorf("stats: oom %d restarts %d failures %d", s.OOMEvents, s.Restarts, s.RestartFailures)
	}
	// The conversation still has its lease and token.
	l2, tok2, created, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "a"})
	if err != nil || created || l2.ID != a.ID || tok2 != tok {
		t.Fatalf("acquire after the restart: %v created=%v", err, created)
	}
}

// TestRestartBudget: Restart.Limit restarts within Restart.Window; one more
// exit fails the lease with the reason and removes the container. Restarts
// older than the window do not count.
func TestRestartBudget(t *testing.T) {
	clock := time.Now()
	var mu = make(chan struct{}, 1)
	now := func() time.Time { mu <- struct{}{}; defer func() { <-mu }(); return clock }
	advance := func(d time.Duration) { mu <- struct{}{}; clock = clock.Add(d); <-mu }
	h := newHarness(t, func(c *Config) {
		c.Restart.Limit, c.Restart.Window, c.Now = 2, time.Hour, now
		c.DefaultTTL, c.MaxTTL = 48*time.Hour, 48*time.Hour
	})
	l, _ := h.acquire("c")
	die := func(want int) {
		t.Helper()
		h.rt.kill(l.ContainerID, 137, false)
		eventually(t, 2*time.Second, "restarted", func() bool { got := h.get(l.ID); return got.State == StateReady && got.Restarts == want })
	}
	die(1)
	die(2)
	advance(61 * time.Minute) // the first two leave the window
	die(3)
	die(4)
	h.rt.kill(l.ContainerID, 137, false) // a third within the hour
	eventually(t, 2*time.Second, "failed and removed", func() bool { return h.get(l.ID).State == StateFailed && !h.rt.exists(l.ContainerID) })
	if got := h.get(l.ID); got.Reason != "container exited with code 137; restart limit reached (2 restarts within 1h0m0s)" || got.Restarts != 4 {
		t.Fatalf("reason %q restarts %d", got.Reason, got.Restarts)
	}
	if n, _ := h.acquire("c"); n.ID == l.ID {
		t.Fatal("got the failed lease back")
	}
}

// TestRestartFailureFails: a restart the runtime keeps refusing fails the
// lease (with the error) after restartAttempts tries and removes the
// container.
func TestRestartFailureFails(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	h.rt.set(func(f *fakeRuntime) { f.restartErr = errdefs.FailedPrecondition("agent does not start") })
	h.rt.kill(l.ContainerID, 1, false)
	eventually(t, 10*time.Second, "failed and removed (after 3 attempts)", func() bool { return h.get(l.ID).State == StateFailed && !h.rt.exists(l.ContainerID) })
	got := h.get(l.ID)
	if !strings.HasPrefix(got.Reason, "restart after exit 1 failed: ") || !strings.Contains(got.Reason, "agent does not start") {
		t.Fatalf("reason %q", got.Reason)
	}
	if s := h.m.Stats(); s.RestartFailures != 1 || h.rt.restartCount() != restartAttempts {
		t.Errorf("restart failures %d, Restart calls %d (want 1 and %d)", s.RestartFailures, h.rt.restartCount(), restartAttempts)
	}
}

// TestRestartWaitsForRuntime: while the runtime is unavailable (an engine
// restarting) the restart is retried, and the lease stays PENDING.
func TestRestartWaitsForRuntime(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	h.rt.set(func(f *fakeRuntime) { f.restartErr = errdefs.Unavailable("engine restarting") })
	h.rt.kill(l.ContainerID, 143, false)
	eventually(t, 2*time.Second, "restart attempted", func() bool { return h.rt.restartCount() >= 1 })
	if got := h.get(l.ID); got.State != StatePending {
		t.Fatalf("while the runtime is down: %s %q", got.State, got.Reason)
	}
	h.rt.set(func(f *fakeRuntime) { f.restartErr = nil })
	eventually(t, 5*time.Second, "restarted once the runtime is back", func() bool { return h.get(l.ID).State == StateReady })
	if got := h.get(l.ID); got.Restarts != 1 || got.Reason != "restarted after exit 143" {
		t.Fatalf("%s %q restarts %d", got.State, got.Reason, got.Restarts)
	}
}

// TestAcquireWaitsForRestart: an acquire of a conversation whose sandbox is
// being restarted waits and gets the lease with its new endpoint; a
// release during the restart ends the lease once the restart is over.
func TestAcquireWaitsForRestart(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _ := h.acquire("c")
	gate := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.restartGate = gate })
	h.rt.kill(l.ContainerID, 137, false)
	eventually(t, 2*time.Second, "restarting", func() bool { return h.get(l.ID).State == StatePending })
	type res struct {
		l       Lease
		created bool
		err     error
	}
	done := make(chan res, 1)
	go func() {
		got, _, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c"})
		done <- res{got, created, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("acquire returned during the restart: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	r := <-done
	if r.err != nil || r.created || r.l.ID != l.ID || r.l.State != StateReady || r.l.Endpoint == l.Endpoint {
		t.Fatalf("acquire after the restart: %+v", r)
	}

	// Released while restarting.
	gate2 := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.restartGate = gate2 })
	h.rt.kill(l.ContainerID, 137, false)
	eventually(t, 2*time.Second, "restarting again", func() bool { return h.get(l.ID).State == StatePending })
	relDone := make(chan error, 1)
	go func() { _, err := h.m.Release(ctx, l.ID, ""); relDone <- err }()
	eventually(t, 2*time.Second, "releasing", func() bool { return h.get(l.ID).State == StateReleasing })
	close(gate2)
	if err := <-relDone; err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "released and removed", func() bool { return h.get(l.ID).State == StateReleased && !h.rt.exists(l.ContainerID) })
}

// TestResyncRestarts: a container found exited by a resync (no event: the
// watch was down, as when the engine restarts) is restarted in place.
func TestResyncRestarts(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ResyncInterval = 50 * time.Millisecond })
	l, _ := h.acquire("c")
	h.rt.set(func(f *fakeRuntime) {
		f.boxes[l.ContainerID].State, f.boxes[l.ContainerID].ExitCode = runtime.StateExited, 143
	})
	eventually(t, 2*time.Second, "restarted by resync", func() bool { got := h.get(l.ID); return got.State == StateReady && got.Restarts == 1 })
	if got := h.get(l.ID); got.Reason != "restarted after exit 143" {
		t.Fatalf("reason %q", got.Reason)
	}
}

// TestReconcileResumesRestart: a restart the previous process had begun
// (PENDING from READY) is resumed by the next Start, not failed as an
// interrupted creation.
func TestReconcileResumesRestart(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	h.stop()
	st, err := OpenBolt(h.path)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := st.Get(l.ID)
	if _, err := rec.TransitionPhase(StatePending, PhaseRestarting, "container exited with code 137; restarting", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(rec); err != nil {
		t.Fatal(err)
	}
	st.Close()
	h.rt.set(func(f *fakeRuntime) {
		f.boxes[l.ContainerID].State, f.boxes[l.ContainerID].ExitCode = runtime.StateExited, 137
	})
	h.start()
	eventually(t, 2*time.Second, "restart resumed", func() bool { return h.get(l.ID).State == StateReady })
	if got := h.get(l.ID); got.Reason != "restarted after container exited with code 137" || got.Restarts != 1 || got.ContainerID != l.ContainerID {
		t.Fatalf("%q restarts %d container %s", got.Reason, got.Restarts, got.ContainerID)
	}
}

// TestRestartWaitsForEventStream: a died event followed by the end of the
// event stream (an engine shutting down stops every container, then goes
// away) does not restart anything until the stream is back.
//
// The kill waits for the watch loop's first resync (reconcile listed once
// before it): a resync that lists the exited container restarts it at once,
// as an exit whose event was missed, and on a loaded CI machine the first
// one ran after the kill. The stream's end is read after the died event, so
// the check also waits for the Manager to see the stream down, well within
// Restart.Delay.
func TestRestartWaitsForEventStream(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	const delay = time.Second
	h := newHarness(t, func(c *Config) { c.Restart.Delay = delay })
	l, _ := h.acquire("c")
	eventually(t, 5*time.Second, "the first resync", func() bool {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return h.rt.listCalls >= 2
	})
	killed := time.Now()
	h.rt.kill(l.ContainerID, 143, false)
	h.rt.set(func(f *fakeRuntime) { f.watchErr = errdefs.Unavailable("engine restarting") })
	h.rt.closeWatches()
	eventually(t, delay, "the Manager sees the stream down", func() bool { return h.m.ctrl.watchDown.Load() })
	time.Sleep(time.Until(killed.Add(delay + 700*time.Millisecond)))
	if n, got := h.rt.restartCount(), h.get(l.ID); n != 0 || got.State != StatePending {
		t.Fatalf("while the event stream is down: %d restarts tried, lease %s (%s)", n, got.State, got.Reason)
	}
	h.rt.set(func(f *fakeRuntime) { f.watchErr = nil })
	eventually(t, 15*time.Second, "restarted once the stream is back", func() bool { return h.get(l.ID).State == StateReady })
	if n := h.rt.restartCount(); n != 1 {
		t.Errorf("%d restarts tried, want 1", n)
	}
}

// TestRestartConfigDefaults: zero fields take DefaultRestartConfig's, a
// Limit above MaxTransitions/2-1 is lowered to it, a negative one stays
// (never restart), and a negative Window or Delay is refused naming
// restart_window.
func TestRestartConfigDefaults(t *testing.T) {
	if got, err := (RestartConfig{}).withDefaults(); err != nil || got != DefaultRestartConfig() {
		t.Fatalf("zero config: %+v %v, want %+v", got, err, DefaultRestartConfig())
	}
	got, err := RestartConfig{Limit: 100, Window: time.Hour}.withDefaults()
	if err != nil || got.Limit != MaxTransitions/2-1 || got.Window != time.Hour || got.Delay != DefaultRestartConfig().Delay {
		t.Fatalf("limit 100, window 1h: %+v %v", got, err)
	}
	if got, err := (RestartConfig{Limit: -1}).withDefaults(); err != nil || got.Limit != -1 {
		t.Fatalf("limit -1: %+v %v", got, err)
	}
	for _, c := range []RestartConfig{{Window: -time.Second}, {Delay: -time.Second}} {
		if err := c.Validate(); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "restart_window") {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
