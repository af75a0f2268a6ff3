package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
)

// pausePending reports whether a Pause of e is waiting for its requests.
func (h *harness) pausePending(id string) bool {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	e := h.m.leases[id]
	return e != nil && e.op != nil && e.op.kind == opPause && e.l.State == StateReady
}

// An explicit pause waits until the requests admitted before it were
// answered; a request that comes meanwhile waits for the pause and then
// resumes the lease: it is admitted, never refused.
func TestPauseWaitsForAdmittedRequests(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c1")
	ctx := context.Background()
	rt, first, err := h.m.Use(ctx, l.ID)
	if err != nil || first == nil || rt.State != StateReady || rt.Endpoint == "" {
		t.Fatalf("use: %+v %v %v", rt, first, err)
	}
	paused := make(chan error, 1)
	go func() {
		_, err := h.m.Pause(ctx, l.ID, PauseFreeze)
		paused <- err
	}()
	eventually(t, 5*time.Second, "pause waiting for the admitted request", func() bool { return h.pausePending(l.ID) })
	second := useAsync(ctx, h.m, l.ID)
	// The pause has not touched the sandbox while the request is unanswered.
	if st := h.rt.state(l.ContainerID); st != runtime.StateRunning {
		t.Fatalf("container %s while a request is unanswered", st)
	}
	first.Answered()
	if err := <-paused; err != nil {
		t.Fatalf("pause: %v", err)
	}
	a := <-second
	if a.err != nil || a.hold == nil || a.rt.State != StateReady {
		t.Fatalf("request that raced the pause: %+v %v %v", a.rt, a.hold, a.err)
	}
	a.hold.Done()
	first.Done()
	first.Done() // twice is harmless
	var states []State
	for _, tr := range h.get(l.ID).Transitions {
		states = append(states, tr.To)
	}
	if n := len(states); n < 2 || states[n-2] != StatePaused || states[n-1] != StateReady {
		t.Fatalf("transitions %v: want the pause, then the racing request's resume", states)
	}
	if st := h.rt.state(l.ContainerID); st != runtime.StateRunning {
		t.Fatalf("container %s after the resume", st)
	}
}

// A pause whose context ends while a request is unanswered gives up: the
// lease stays READY and takes requests.
func TestPauseGivesUpWaiting(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c1")
	_, hold, err := h.m.Use(context.Background(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Done()
	ctx, cancel := context.WithCancel(context.Background())
	paused := make(chan error, 1)
	go func() {
		_, err := h.m.Pause(ctx, l.ID, PauseFreeze)
		paused <- err
	}()
	eventually(t, 5*time.Second, "pause waiting for the admitted request", func() bool { return h.pausePending(l.ID) })
	cancel()
	if err := <-paused; !errors.Is(err, context.Canceled) {
		t.Fatalf("pause: %v, want context.Canceled", err)
	}
	if g := h.get(l.ID); g.State != StateReady {
		t.Fatalf("lease %s after the abandoned pause", g.State)
	}
	rt, again, err := h.m.Use(context.Background(), l.ID)
	if err != nil || again == nil || rt.State != StateReady {
		t.Fatalf("use after the abandoned pause: %+v %v", rt, err)
	}
	again.Done()
}

// The idle policy does not pause a lease while a request is in flight
// (a long exec, a stream), however long ago it was last touched; once
// the request ended, the idle timeout runs from its end.
func TestIdlePauseSkipsLeaseInUse(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1_700_000_000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	h := newHarness(t, func(c *Config) { c.Now = now })
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1", TTL: time.Hour, IdleTimeout: time.Minute, IdlePolicy: IdleFreeze})
	if err != nil {
		t.Fatal(err)
	}
	_, hold, err := h.m.Use(context.Background(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	hold.Answered() // the stream is under way
	advance(5 * time.Minute)
	h.m.reaper.once()
	if g := h.get(l.ID); g.State != StateReady {
		t.Fatalf("lease %s with a request in flight: %s", g.State, g.Reason)
	}
	hold.Done()
	advance(30 * time.Second)
	h.m.reaper.once()
	if g := h.get(l.ID); g.State != StateReady {
		t.Fatalf("lease %s 30s after its request ended: %s", g.State, g.Reason)
	}
	advance(time.Minute)
	h.m.reaper.once()
	eventually(t, 5*time.Second, "idle lease paused once its request ended", func() bool { return h.get(l.ID).State == StatePaused })
}

// A request that stays unanswered past the grace does not hold a pause
// off for ever: the lease is paused anyway.
func TestPauseGraceForUnansweredRequests(t *testing.T) {
	h := newHarness(t, nil)
	h.m.pauser.requestGrace = 200 * time.Millisecond
	l, _ := h.acquire("c1")
	_, hold, err := h.m.Use(context.Background(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := h.m.Pause(ctx, l.ID, PauseFreeze)
	if err != nil || got.State != StatePaused {
		t.Fatalf("pause with a request unanswered past the grace: %v %v", got.State, err)
	}
}

// admitted is the outcome of one Manager.Use.
type admitted struct {
	rt   Route
	hold *Hold
	err  error
}

// useAsync calls m.Use(ctx, id) in a goroutine; its outcome comes on the
// returned channel.
func useAsync(ctx context.Context, m *Manager, id string) <-chan admitted {
	out := make(chan admitted, 1)
	go func() {
		rt, hold, err := m.Use(ctx, id)
		out <- admitted{rt, hold, err}
	}()
	return out
}
