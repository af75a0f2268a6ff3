package lease

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

func TestAcquireCreatesReadyLease(t *testing.T) {
	h := newHarness(t, nil)
	l, tok, created, err := h.m.Acquire(context.Background(), AcquireRequest{
		ConversationID: "c-1", Owner: "alice", Labels: map[string]string{"team": "a"},
		Env: map[string]string{"FOO": "bar"}, Resources: runtime.Resources{MemoryBytes: 1 << 20},
	})
	if err != nil || !created {
		t.Fatalf("acquire: created=%v err=%v", created, err)
	}
	if l.State != StateReady || l.ContainerID == "" || l.Endpoint == "" || l.Image != "berth/base" || l.TTL != 10*time.Minute {
		t.Fatalf("lease: %+v", l)
	}
	if len(l.Transitions) != 2 || l.Transitions[0].From != StateUnspecified || l.Transitions[0].To != StatePending || l.Transitions[1].To != StateReady {
		t.Fatalf("transitions: %+v", l.Transitions)
	}
	if id, ok := h.m.Tokens().VerifyToken(tok); !ok || id != l.ID {
		t.Fatalf("token %q does not verify", tok)
	}
	spec := h.rt.specs[0]
	if spec.LeaseID != l.ID || spec.InstanceID != "test" || spec.ConversationID != "c-1" || spec.AgentToken != h.m.Tokens().AgentToken(l.ID) ||
		spec.AgentToken == tok || spec.Env["FOO"] != "bar" || spec.Labels["team"] != "a" || spec.Resources.MemoryBytes != 1<<20 || spec.ReadyTimeout != 30*time.Second {
		t.Fatalf("spec: %+v", spec)
	}
	// The record is durable and holds no token.
	stored, err := h.store.Get(l.ID)
	if err != nil || stored.State != StateReady || stored.ContainerID != l.ContainerID {
		t.Fatalf("stored: %+v, %v", stored, err)
	}
	if b, _ := jsonOf(stored); strings.Contains(b, tok[len(l.ID)+1:]) || strings.Contains(b, spec.AgentToken) {
		t.Fatal("a token was persisted")
	}
	// A second acquire returns the same lease and token.
	l2, tok2, created2, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c-1", Owner: "alice"})
	if err != nil || created2 || l2.ID != l.ID || tok2 != tok {
		t.Fatalf("second acquire: %v created=%v same=%v", err, created2, l2.ID == l.ID && tok2 == tok)
	}
	if h.rt.creates() != 1 {
		t.Fatalf("creates = %d", h.rt.creates())
	}
}

func TestAcquireIdempotentConcurrent(t *testing.T) {
	h := newHarness(t, nil)
	h.rt.set(func(f *fakeRuntime) { f.createDelay = 100 * time.Millisecond })
	const n = 10
	var wg sync.WaitGroup
	type res struct {
		l       Lease
		tok     string
		created bool
		err     error
	}
	out := make([]res, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, tok, created, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "same"})
			out[i] = res{l, tok, created, err}
		}()
	}
	wg.Wait()
	createdCount := 0
	for i, r := range out {
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		if r.l.ID != out[0].l.ID || r.tok != out[0].tok || r.l.State != StateReady {
			t.Fatalf("caller %d got a different lease: %+v", i, r.l)
		}
		if r.created {
			createdCount++
		}
	}
	if createdCount != 1 || h.rt.creates() != 1 || h.rt.count() != 1 {
		t.Fatalf("created=%d creates=%d containers=%d, want 1 each", createdCount, h.rt.creates(), h.rt.count())
	}
}

func TestAcquireManyConversations(t *testing.T) {
	h := newHarness(t, nil)
	h.rt.set(func(f *fakeRuntime) { f.createDelay = 20 * time.Millisecond })
	const n = 20
	var wg sync.WaitGroup
	ids := make([]string, n*2)
	errs := make([]error, n*2)
	for i := range n * 2 { // two callers per conversation
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: fmt.Sprintf("c-%d", i%n)})
			ids[i], errs[i] = l.ID, err
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n * 2 {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if ids[i] != ids[(i+n)%(2*n)] {
			t.Fatalf("conversation %d got two leases", i%n)
		}
		seen[ids[i]] = true
	}
	if len(seen) != n || h.rt.creates() != n || h.m.Stats().ByState[StateReady] != n {
		t.Fatalf("leases=%d creates=%d stats=%+v", len(seen), h.rt.creates(), h.m.Stats())
	}
}

// Two owners' identical conversation ids are two independent leases, and
// neither learns anything about the other's.
func TestAcquireSameConversationTwoOwners(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	a, tokA, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	b, tokB, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "bob"})
	if err != nil || !created || b.ID == a.ID || tokB == tokA || b.Owner != "bob" {
		t.Fatalf("bob: created=%v err=%v same lease=%v", created, err, b.ID == a.ID)
	}
	// Each owner's retry gets its own lease back.
	a2, _, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "alice"})
	if err != nil || created || a2.ID != a.ID {
		t.Fatalf("alice again: %v created=%v id=%s want %s", err, created, a2.ID, a.ID)
	}
	// Also while the first is still PENDING: bob does not wait for alice's.
	h.rt.set(func(f *fakeRuntime) { f.createGate = make(chan struct{}) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.m.Acquire(ctx, AcquireRequest{ConversationID: "p", Owner: "alice"})
	}()
	eventually(t, time.Second, "pending lease", func() bool { return h.m.Stats().ByState[StatePending] == 1 })
	bobDone := make(chan error, 1)
	go func() {
		_, _, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "p", Owner: "bob"})
		if err == nil && !created {
			err = errors.New("bob's acquire joined alice's creation")
		}
		bobDone <- err
	}()
	eventually(t, time.Second, "two pending leases", func() bool { return h.m.Stats().ByState[StatePending] == 2 })
	h.rt.set(func(f *fakeRuntime) { close(f.createGate) })
	<-done
	if err := <-bobDone; err != nil {
		t.Fatal(err)
	}
}

func TestAcquireMaxLive(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission.MaxLive = 2 })
	a, _ := h.acquire("a")
	h.acquire("b")
	_, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "retry after") {
		t.Fatalf("err = %v, want ResourceExhausted with a hint", err)
	}
	after, ok := RetryAfter(err)
	if !ok || after < time.Second || after > 30*time.Second {
		t.Fatalf("RetryAfter = %v, %v", after, ok)
	}
	if _, ok := RetryAfter(errors.New("x")); ok {
		t.Fatal("RetryAfter on a plain error")
	}
	// The existing conversations still get their leases at the limit.
	h.acquire("a")
	if _, err := h.m.Release(context.Background(), a.ID, ""); err != nil {
		t.Fatal(err)
	}
	h.acquire("c")
}

func TestAcquireValidation(t *testing.T) {
	h := newHarness(t, nil)
	long := strings.Repeat("x", 257)
	cases := []struct {
		name  string
		req   AcquireRequest
		field string
	}{
		{"empty conversation", AcquireRequest{}, "conversation_id"},
		{"long conversation", AcquireRequest{ConversationID: long}, "conversation_id"},
		{"control char", AcquireRequest{ConversationID: "a\nb"}, "conversation_id"},
		{"bad utf8", AcquireRequest{ConversationID: "a\xffb"}, "conversation_id"},
		{"negative ttl", AcquireRequest{ConversationID: "c", TTL: -time.Second}, "ttl"},
		{"huge ttl", AcquireRequest{ConversationID: "c", TTL: 25 * time.Hour}, "ttl"},
		{"negative idle", AcquireRequest{ConversationID: "c", IdleTimeout: -time.Second}, "idle_timeout"},
		{"bad label key", AcquireRequest{ConversationID: "c", Labels: map[string]string{"a b": "x"}}, "labels"},
		{"empty label key", AcquireRequest{ConversationID: "c", Labels: map[string]string{"": "x"}}, "labels"},
		{"label comma", AcquireRequest{ConversationID: "c", Labels: map[string]string{"k": "a,b"}}, "labels"},
		{"reserved env", AcquireRequest{ConversationID: "c", Env: map[string]string{"BERTH_AGENT_TOKEN": "x"}}, "env"},
		{"bad env name", AcquireRequest{ConversationID: "c", Env: map[string]string{"A=B": "x"}}, "env"},
		{"negative memory", AcquireRequest{ConversationID: "c", Resources: runtime.Resources{MemoryBytes: -1}}, "resources.memory_bytes"},
		{"negative cpus", AcquireRequest{ConversationID: "c", Resources: runtime.Resources{NanoCPUs: -1}}, "resources.cpus"},
		{"bad image", AcquireRequest{ConversationID: "c", Image: "a b"}, "image"},
	}
	for _, c := range cases {
		_, _, _, err := h.m.Acquire(context.Background(), c.req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: err = %v, want InvalidArgument naming %s", c.name, err, c.field)
		}
	}
	if h.rt.creates() != 0 {
		t.Fatalf("invalid requests created %d sandboxes", h.rt.creates())
	}
	// Zero TTL takes the default; the maximum is allowed.
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "max", TTL: 24 * time.Hour})
	if err != nil || l.TTL != 24*time.Hour {
		t.Fatalf("max ttl: %v %v", l.TTL, err)
	}
}

func TestAcquireCreateFailure(t *testing.T) {
	h := newHarness(t, nil)
	h.rt.set(func(f *fakeRuntime) {
		f.createErr = errdefs.NotFound("image %q is not present locally", "nope")
		f.createDelay = 50 * time.Millisecond
	})
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _, errs[i] = h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c", Image: "nope"})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("err = %v, want the runtime's NotFound", err)
		}
	}
	if h.rt.creates() != 1 {
		t.Fatalf("creates = %d", h.rt.creates())
	}
	ls, _, _ := h.m.List(context.Background(), Filter{States: []State{StateFailed}})
	if len(ls) != 1 || !strings.Contains(ls[0].Reason, "not present locally") {
		t.Fatalf("failed leases: %+v", ls)
	}
	eventually(t, 2*time.Second, "failed lease cleaned", func() bool { return h.get(ls[0].ID).Cleaned })
	// The conversation is free again.
	h.rt.set(func(f *fakeRuntime) { f.createErr = nil })
	l, _ := h.acquire("c")
	if l.ID == ls[0].ID || l.State != StateReady {
		t.Fatalf("retry: %+v", l)
	}
}

func TestAcquireCallerGivesUp(t *testing.T) {
	h := newHarness(t, nil)
	gate := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.createGate = gate })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	close(gate) // the creation goes on without the caller
	var l Lease
	eventually(t, time.Second, "lease ready", func() bool {
		ls, _, _ := h.m.List(context.Background(), Filter{ConversationID: "c"})
		if len(ls) == 1 {
			l = ls[0]
		}
		return l.State == StateReady
	})
	l2, _, created, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"})
	if err != nil || created || l2.ID != l.ID || h.rt.creates() != 1 {
		t.Fatalf("retry: %v created=%v creates=%d", err, created, h.rt.creates())
	}
}

func TestRenew(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.m.Renew(ctx, l.ID, time.Hour)
	if err != nil || r.TTL != time.Hour || !r.ExpiresAt.After(l.ExpiresAt.Add(50*time.Minute)) {
		t.Fatalf("renew: %+v, %v", r, err)
	}
	if st, _ := h.store.Get(l.ID); !st.ExpiresAt.Equal(r.ExpiresAt) {
		t.Fatal("renew not persisted")
	}
	r2, err := h.m.Renew(ctx, l.ID, 0) // the lease's own TTL
	if err != nil || r2.TTL != time.Hour {
		t.Fatalf("renew 0: %+v, %v", r2, err)
	}
	for _, bad := range []time.Duration{-time.Second, 25 * time.Hour} {
		if _, err := h.m.Renew(ctx, l.ID, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("renew %s: %v", bad, err)
		}
	}
	if _, err := h.m.Renew(ctx, "nope", 0); !errdefs.IsNotFound(err) {
		t.Errorf("renew unknown: %v", err)
	}

	// Renew after expiry fails, even before the reaper ran.
	s, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "short", TTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if _, err := h.m.Renew(ctx, s.ID, time.Minute); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "EXPIRED") {
		t.Fatalf("renew after expiry: %v", err)
	}
	// And after release.
	if _, err := h.m.Release(ctx, l.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Renew(ctx, l.ID, 0); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "RELEASED") {
		t.Fatalf("renew after release: %v", err)
	}
}

func TestRelease(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _ := h.acquire("c")
	r, err := h.m.Release(ctx, l.ID, "done with it")
	if err != nil || r.State != StateReleased || r.Reason != "done with it" || !r.Cleaned || r.EndedAt.IsZero() {
		t.Fatalf("release: %+v, %v", r, err)
	}
	if h.rt.exists(l.ContainerID) {
		t.Fatal("container not removed")
	}
	var states []State
	for _, tr := range r.Transitions {
		states = append(states, tr.To)
	}
	if fmt.Sprint(states) != "[PENDING READY RELEASING RELEASED]" {
		t.Fatalf("transitions: %v", states)
	}
	again, err := h.m.Release(ctx, l.ID, "again")
	if err != nil || again.Reason != "done with it" || len(again.Transitions) != 4 {
		t.Fatalf("second release changed the lease: %+v, %v", again, err)
	}
	if _, err := h.m.Release(ctx, "nope", ""); !errdefs.IsNotFound(err) {
		t.Fatalf("release unknown: %v", err)
	}
	// A released conversation gets a new lease.
	n, _ := h.acquire("c")
	if n.ID == l.ID {
		t.Fatal("got the released lease back")
	}
}

func TestReleaseWhilePending(t *testing.T) {
	h := newHarness(t, nil)
	gate := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.createGate = gate })
	errc := make(chan error, 1)
	go func() {
		_, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"})
		errc <- err
	}()
	var id string
	eventually(t, time.Second, "pending", func() bool {
		ls, _, _ := h.m.List(context.Background(), Filter{States: []State{StatePending}})
		if len(ls) == 1 {
			id = ls[0].ID
		}
		return id != ""
	})
	done := make(chan Lease, 1)
	go func() {
		l, err := h.m.Release(context.Background(), id, "")
		if err != nil {
			t.Error(err)
		}
		done <- l
	}()
	eventually(t, time.Second, "releasing", func() bool { return h.get(id).State == StateReleasing })
	close(gate)
	if err := <-errc; !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("acquire of a lease released during creation: %v", err)
	}
	l := <-done
	if l.State != StateReleased || !l.Cleaned || h.rt.count() != 0 {
		t.Fatalf("after release: %+v containers=%d", l, h.rt.count())
	}
}

func TestRemovalFailureRetried(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	h.rt.set(func(f *fakeRuntime) { f.removeErr = errdefs.Unavailable("engine down") })
	r, err := h.m.Release(context.Background(), l.ID, "")
	if !errdefs.IsUnavailable(err) || r.State != StateReleasing {
		t.Fatalf("release with engine down: %v %s", err, r.State)
	}
	h.rt.set(func(f *fakeRuntime) { f.removeErr = nil })
	eventually(t, 3*time.Second, "released by the reaper", func() bool {
		l := h.get(l.ID)
		return l.State == StateReleased && l.Cleaned
	})
	if h.rt.exists(l.ContainerID) {
		t.Fatal("container still there")
	}
}

func TestExpiryByTTL(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ReapInterval = 0 }) // the default, 200ms
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c", TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Until(l.ExpiresAt.Add(2*time.Second)), "container gone within 2s of expiry", func() bool {
		return !h.rt.exists(l.ContainerID)
	})
	got := h.get(l.ID)
	if got.State != StateExpired || got.Reason != "ttl of 300ms passed" {
		t.Fatalf("lease: %s %q", got.State, got.Reason)
	}
	eventually(t, time.Second, "cleaned and persisted", func() bool {
		st, _ := h.store.Get(l.ID)
		return h.get(l.ID).Cleaned && st.State == StateExpired && st.Cleaned
	})
}

func TestExpiryByIdle(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ReapInterval = 0 })
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c", IdleTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Activity keeps it alive past the idle timeout.
	for range 12 {
		time.Sleep(50 * time.Millisecond)
		h.m.Touch(l.ID)
	}
	if s := h.get(l.ID).State; s != StateReady {
		t.Fatalf("touched lease is %s", s)
	}
	last := time.Now()
	eventually(t, 2300*time.Millisecond, "idle lease reaped", func() bool { return !h.rt.exists(l.ContainerID) })
	if since := time.Since(last); since < 300*time.Millisecond {
		t.Fatalf("reaped %s after the last activity", since)
	}
	if got := h.get(l.ID); got.State != StateExpired || got.Reason != "idle for 300ms" {
		t.Fatalf("lease: %s %q", got.State, got.Reason)
	}
}

func TestAcquireReplacesExpiredLease(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ReapInterval = time.Hour })
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c", TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(80 * time.Millisecond)
	n, _ := h.acquire("c") // the reaper has not run: Acquire expires it itself
	if n.ID == l.ID || h.get(l.ID).State != StateExpired {
		t.Fatal("acquire returned an expired lease")
	}
}

func TestDiedEvent(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Restart.Limit = -1 }) // no in-place restarts
	a, _ := h.acquire("a")
	b, _ := h.acquire("b")
	h.rt.kill(a.ContainerID, 137, false)
	h.rt.kill(b.ContainerID, 137, true)
	eventually(t, 2*time.Second, "dead containers removed", func() bool {
		return !h.rt.exists(a.ContainerID) && !h.rt.exists(b.ContainerID)
	})
	if got := h.get(a.ID); got.State != StateFailed || got.Reason != "container exited with code 137" {
		t.Fatalf("a: %s %q", got.State, got.Reason)
	}
	if got := h.get(b.ID); got.State != StateFailed || got.Reason != "container exited with code 137 (an OOM kill was reported in it)" {
		t.Fatalf("b: %s %q", got.State, got.Reason)
	}
	eventually(t, time.Second, "cleaned", func() bool { return h.get(a.ID).Cleaned && h.get(b.ID).Cleaned })
}

func TestWatchReconnectResyncs(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	orphan := h.rt.add(runtime.Sandbox{LeaseID: newID(time.Now()), InstanceID: "test"})
	other := h.rt.add(runtime.Sandbox{LeaseID: newID(time.Now()), InstanceID: "another-instance"})
	h.rt.set(func(f *fakeRuntime) { f.watchErr = errdefs.Unavailable("engine restarting") })
	h.rt.vanish(l.ContainerID) // no event: the watch is down
	h.rt.closeWatches()
	eventually(t, 3*time.Second, "vanished container noticed by polling", func() bool { return h.get(l.ID).State == StateFailed })
	if got := h.get(l.ID); got.Reason != ReasonVanished {
		t.Fatalf("reason %q", got.Reason)
	}
	eventually(t, time.Second, "orphan removed", func() bool { return !h.rt.exists(orphan.ID) })
	if !h.rt.exists(other.ID) {
		t.Fatal("removed another instance's container")
	}
	h.rt.set(func(f *fakeRuntime) { f.watchErr = nil })
	eventually(t, 15*time.Second, "watch re-subscribed", func() bool {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return len(h.rt.watchers) == 1
	})
	n, _ := h.acquire("d")
	h.rt.kill(n.ContainerID, 1, false)
	eventually(t, 2*time.Second, "event after reconnect (a restart in place)", func() bool {
		got := h.get(n.ID)
		return got.State == StateReady && got.Restarts == 1
	})
}

func TestReconcileAfterRestart(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	ready, tok := h.acquire("ready")
	vanished, _ := h.acquire("vanished")
	exited, _ := h.acquire("exited")
	releasing, _ := h.acquire("releasing")
	ended, _ := h.acquire("ended")
	if _, err := h.m.Release(ctx, ended.ID, ""); err != nil {
		t.Fatal(err)
	}
	h.stop()

	// While the orchestrator is down: a creation was interrupted (its record
	// is PENDING and its container exists), a release was interrupted, a
	// container vanished, one exited, and an orphan appeared.
	now := time.Now()
	pending := Lease{ID: newID(now), ConversationID: "pending", State: StatePending, CreatedAt: now, TTL: time.Minute,
		ExpiresAt: now.Add(time.Minute), Transitions: []Transition{{To: StatePending, Reason: "acquired", At: now}}}
	pendingBox := h.rt.add(runtime.Sandbox{LeaseID: pending.ID, InstanceID: "test", State: runtime.StateCreated})
	orphan := h.rt.add(runtime.Sandbox{LeaseID: newID(now), InstanceID: "test"})
	unlabelled := h.rt.add(runtime.Sandbox{InstanceID: "test"})
	st, err := OpenBolt(h.path)
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := st.Get(releasing.ID)
	if _, err := rel.Transition(StateReleasing, "released by owner", now); err != nil {
		t.Fatal(err)
	}
	for _, l := range []Lease{pending, rel} {
		if err := st.Put(l); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	h.rt.vanish(vanished.ContainerID)
	h.rt.set(func(f *fakeRuntime) {
		f.boxes[exited.ContainerID].State = runtime.StateExited
		f.boxes[exited.ContainerID].ExitCode = 2
	})

	h.start()

	got := h.get(ready.ID)
	if got.State != StateReady || got.ContainerID != ready.ContainerID || !h.rt.exists(ready.ContainerID) {
		t.Fatalf("ready lease not adopted: %+v", got)
	}
	l2, tok2, created, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "ready"})
	if err != nil || created || l2.ID != ready.ID || tok2 != tok {
		t.Fatalf("acquire after restart: %v created=%v", err, created)
	}
	// The container that exited while the orchestrator was down (as an
	// engine restart leaves them all) is restarted in place.
	eventually(t, 2*time.Second, "exited container restarted", func() bool { return h.get(exited.ID).State == StateReady })
	if got := h.get(exited.ID); got.ContainerID != exited.ContainerID || got.Restarts != 1 || got.Reason != "restarted after exit 2" ||
		got.Endpoint == exited.Endpoint || !h.rt.exists(exited.ContainerID) {
		t.Errorf("exited lease: %s %q restarts %d container %s endpoint %s (was %s)",
			got.State, got.Reason, got.Restarts, got.ContainerID, got.Endpoint, exited.Endpoint)
	} else if tr := got.Transitions[len(got.Transitions)-2]; tr.From != StateReady || tr.To != StatePending ||
		tr.Reason != "container exited with code 2 while the orchestrator was down; restarting" {
		t.Errorf("exited lease: transition %+v", tr)
	}
	checks := []struct {
		id, reason string
		state      State
	}{
		{vanished.ID, ReasonVanishedWhileDown, StateFailed},
		{pending.ID, ReasonRestartedCreating, StateFailed},
		{releasing.ID, "released by owner", StateReleased},
		{ended.ID, "released", StateReleased},
	}
	for _, c := range checks {
		got := h.get(c.id)
		if got.State != c.state || got.Reason != c.reason || !got.Cleaned {
			t.Errorf("lease %s: %s %q cleaned=%v, want %s %q", c.id, got.State, got.Reason, got.Cleaned, c.state, c.reason)
		}
		if st, err := h.store.Get(c.id); err != nil || st.State != c.state {
			t.Errorf("lease %s not persisted: %v %v", c.id, st.State, err)
		}
	}
	for _, id := range []string{pendingBox.ID, orphan.ID, unlabelled.ID, releasing.ContainerID} {
		if h.rt.exists(id) {
			t.Errorf("container %s survived reconcile", id)
		}
	}
	if h.rt.count() != 2 {
		t.Fatalf("%d containers left, want the adopted and the restarted one", h.rt.count())
	}
	// The failed conversations are free again.
	if n, _ := h.acquire("pending"); n.ID == pending.ID {
		t.Fatal("got the failed lease back")
	}
}

func TestPurgeAfterRetention(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Retention = 200 * time.Millisecond })
	l, _ := h.acquire("c")
	keep, _ := h.acquire("keep")
	if _, err := h.m.Release(context.Background(), l.ID, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "purged", func() bool {
		_, err := h.m.Get(context.Background(), l.ID)
		return errdefs.IsNotFound(err)
	})
	if _, err := h.store.Get(l.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("store still has it: %v", err)
	}
	if h.get(keep.ID).State != StateReady {
		t.Fatal("live lease purged")
	}
}

func TestTokens(t *testing.T) {
	h := newHarness(t, nil)
	a, ta := h.acquire("a")
	b, tb := h.acquire("b")
	if id, ok := h.m.Tokens().VerifyToken(ta); !ok || id != a.ID {
		t.Fatal("right token rejected")
	}
	if h.m.Tokens().Token(a.ID) != ta {
		t.Fatal("Token differs from the acquire's")
	}
	sigB := tb[strings.LastIndexByte(tb, '.')+1:]
	other, err := NewTokens([]byte("another secret, long enough"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"empty":            "",
		"no dot":           a.ID,
		"wrong mac":        a.ID + ".AAAA",
		"other lease's":    a.ID + "." + sigB,
		"flipped":          ta[:len(ta)-1] + string('A'+(ta[len(ta)-1]-'A'+1)%26),
		"not base64":       a.ID + ".!!!",
		"agent token":      h.m.Tokens().AgentToken(a.ID),
		"agent as lease":   a.ID + "." + h.m.Tokens().AgentToken(a.ID),
		"other secret":     other.Token(a.ID),
		"garbage id":       "../etc." + sigB,
		"trailing garbage": ta + "x",
	} {
		if _, ok := h.m.Tokens().VerifyToken(tok); ok {
			t.Errorf("%s token %q accepted", name, tok)
		}
	}
	if id, ok := h.m.Tokens().VerifyToken(tb); !ok || id != b.ID {
		t.Fatal("b's token rejected")
	}
}

func TestSubscribe(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	all := h.m.Subscribe(ctx, EventFilter{})
	mine := h.m.Subscribe(ctx, EventFilter{Owner: "alice"})
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	h.acquire("someone else's")
	if _, err := h.m.Renew(ctx, l.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Release(ctx, l.ID, ""); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 5 {
		select {
		case ev := <-mine:
			if ev.Lease.ID != l.ID {
				t.Fatalf("event of another owner: %+v", ev.Lease)
			}
			if ev.Transition == nil {
				got = append(got, "renew")
			} else {
				got = append(got, ev.Transition.To.String())
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("events so far: %v", got)
		}
	}
	if fmt.Sprint(got) != "[PENDING READY renew RELEASING RELEASED]" {
		t.Fatalf("events: %v", got)
	}
	n := 0
	for len(all) > 0 {
		<-all
		n++
	}
	if n != 7 {
		t.Fatalf("unfiltered subscriber saw %d events, want 7", n)
	}
	cancel()
	eventually(t, time.Second, "closed on cancel", func() bool {
		_, ok := <-all
		return !ok
	})

	// A subscriber that does not read is dropped, and transitions go on.
	slow := h.m.Subscribe(context.Background(), EventFilter{})
	for i := range SubscriberBuffer/2 + 1 {
		l, _ := h.acquire(fmt.Sprintf("x%d", i))
		if _, err := h.m.Release(context.Background(), l.ID, ""); err != nil {
			t.Fatal(err)
		}
	}
	n = 0
	for range slow {
		n++
	}
	if n != SubscriberBuffer {
		t.Fatalf("slow subscriber got %d events before being dropped", n)
	}
}

func TestListFiltersAndPagination(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1_700_000_000, 0)
	h := newHarness(t, func(c *Config) {
		c.Now = func() time.Time { // every call a millisecond later: distinct CreatedAt
			mu.Lock()
			defer mu.Unlock()
			clock = clock.Add(time.Millisecond)
			return clock
		}
		c.ReapInterval = time.Hour
	})
	ctx := context.Background()
	var ids []string
	for i := range 25 {
		owner := "alice"
		if i%5 == 0 {
			owner = "bob"
		}
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: fmt.Sprintf("c%02d", i), Owner: owner,
			Labels: map[string]string{"n": fmt.Sprint(i % 2)}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	if _, err := h.m.Release(ctx, ids[3], ""); err != nil {
		t.Fatal(err)
	}

	var pages [][]Lease
	tok := ""
	for {
		page, next, err := h.m.List(ctx, Filter{PageSize: 10, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, page)
		if next == "" {
			break
		}
		tok = next
		// A lease created between pages does not shift later pages.
		if len(pages) == 1 {
			h.acquire("late")
		}
	}
	var got []string
	for _, p := range pages {
		for _, l := range p {
			got = append(got, l.ID)
		}
	}
	var want []string // live, newest first
	for i := len(ids) - 1; i >= 0; i-- {
		if i != 3 {
			want = append(want, ids[i])
		}
	}
	if len(pages) != 3 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages=%d\n got %v\nwant %v", len(pages), got, want)
	}

	count := func(f Filter) int {
		t.Helper()
		ls, _, err := h.m.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return len(ls)
	}
	if n := count(Filter{IncludeEnded: true}); n != 26 {
		t.Errorf("include ended: %d", n)
	}
	if n := count(Filter{States: []State{StateReleased}}); n != 1 {
		t.Errorf("released: %d", n)
	}
	if n := count(Filter{Owner: "bob"}); n != 5 {
		t.Errorf("bob: %d", n)
	}
	if n := count(Filter{Owner: "alice", Labels: map[string]string{"n": "1"}}); n != 9 { // 12 odd i, minus bob's 5 and 15, minus released 3
		t.Errorf("alice n=1: %d", n)
	}
	if n := count(Filter{ConversationID: "c07"}); n != 1 {
		t.Errorf("conversation: %d", n)
	}
	if _, _, err := h.m.List(ctx, Filter{PageToken: "garbage"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad page token: %v", err)
	}
	if _, _, err := h.m.List(ctx, Filter{States: []State{"BOGUS"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad state: %v", err)
	}
	if _, _, err := h.m.List(ctx, Filter{PageSize: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("negative page size: %v", err)
	}
}

func TestReap(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	if _, err := h.m.Reap(ctx, ReapFilter{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty filter: %v", err)
	}
	var ls []Lease
	for i := range 6 {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: fmt.Sprint(i), Labels: map[string]string{"batch": fmt.Sprint(i % 2)}})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	ids, err := h.m.Reap(ctx, ReapFilter{Labels: map[string]string{"batch": "0"}, Reason: "batch done"})
	if err != nil || len(ids) != 3 {
		t.Fatalf("reap by label: %v %v", ids, err)
	}
	for _, id := range ids {
		if l := h.get(id); l.State != StateReleased || l.Reason != "batch done" || !l.Cleaned {
			t.Fatalf("reaped lease: %+v", l)
		}
	}
	ids, err = h.m.Reap(ctx, ReapFilter{IDs: []string{ls[1].ID, ls[0].ID, "unknown"}})
	if err != nil || len(ids) != 1 || ids[0] != ls[1].ID {
		t.Fatalf("reap by ids: %v %v", ids, err)
	}
	ids, err = h.m.Reap(ctx, ReapFilter{All: true})
	if err != nil || len(ids) != 2 || h.rt.count() != 0 {
		t.Fatalf("reap all: %v %v containers=%d", ids, err, h.rt.count())
	}
	if s := h.m.Stats(); s.Live != 0 || s.ByState[StateReleased] != 6 || s.Created != 6 || s.Transitions[StateReady] != 6 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestConfigValidation(t *testing.T) {
	st, rt := &BoltStore{}, newFakeRuntime()
	for name, c := range map[string]Config{
		"no store":       {Runtime: rt, Secret: testSecret},
		"no runtime":     {Store: st, Secret: testSecret},
		"short secret":   {Store: st, Runtime: rt, Secret: []byte("short")},
		"ttl above max":  {Store: st, Runtime: rt, Secret: testSecret, DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour},
		"negative limit": {Store: st, Runtime: rt, Secret: testSecret, Admission: AdmissionConfig{DefaultResources: runtime.Resources{PidsLimit: -1}}},
	} {
		if _, err := New(c); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	m, err := New(Config{Store: st, Runtime: rt, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config()
	if c.DefaultImage != "berth/base" || c.DefaultTTL != 10*time.Minute || c.MaxTTL != 24*time.Hour || c.Admission.MaxLive != 100 ||
		c.Retention != time.Hour || c.ReapInterval != 200*time.Millisecond || c.ReapConcurrency != 4 || c.ReadyTimeout != 30*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if _, _, _, err := m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"}); !errdefs.IsUnavailable(err) {
		t.Fatalf("acquire before start: %v", err)
	}
}

func TestRouteAndTouchPersistence(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Fleet.ActivityFlushInterval = 100 * time.Millisecond })
	l, _ := h.acquire("c")
	r, err := h.m.Route(l.ID)
	if err != nil || r.State != StateReady || r.Endpoint != l.Endpoint {
		t.Fatalf("route: %+v, %v", r, err)
	}
	if _, err := h.m.Route("nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("route unknown: %v", err)
	}
	time.Sleep(20 * time.Millisecond)
	h.m.Touch(l.ID)
	h.m.Touch("nope") // ignored
	touched := h.get(l.ID).LastActivityAt
	if !touched.After(l.LastActivityAt) {
		t.Fatal("touch did not move LastActivityAt")
	}
	eventually(t, time.Second, "activity persisted lazily", func() bool {
		st, _ := h.store.Get(l.ID)
		return st.LastActivityAt.Equal(touched)
	})
}

func TestClose(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	sub := h.m.Subscribe(context.Background(), EventFilter{})
	if err := h.m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-sub; ok {
		t.Fatal("subscription open after Close")
	}
	if _, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "d"}); !errdefs.IsUnavailable(err) {
		t.Fatalf("acquire after close: %v", err)
	}
	if _, err := h.m.Release(context.Background(), l.ID, ""); !errdefs.IsUnavailable(err) {
		t.Fatalf("release after close: %v", err)
	}
	// Close leaves sandboxes running for the next Start to adopt.
	if !h.rt.exists(l.ContainerID) {
		t.Fatal("Close removed a sandbox")
	}
	if err := h.m.Start(context.Background()); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("start after close: %v", err)
	}
}

// failingStore fails writes while fail is set.
type failingStore struct {
	Store
	mu   sync.Mutex
	fail bool
}

func (s *failingStore) Put(l Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errdefs.Unavailable("disk full")
	}
	return s.Store.Put(l)
}

func TestPendingPersistedBeforeCreate(t *testing.T) {
	h := newHarness(t, nil)
	gate := make(chan struct{})
	h.rt.set(func(f *fakeRuntime) { f.createGate = gate })
	done := make(chan error, 1)
	go func() {
		_, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"})
		done <- err
	}()
	eventually(t, time.Second, "create called", func() bool { return h.rt.creates() == 1 })
	var pending []Lease
	_ = h.store.ForEach(func(l Lease) error { pending = append(pending, l); return nil })
	if len(pending) != 1 || pending[0].State != StatePending {
		t.Fatalf("store during creation: %+v", pending)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestAcquireStoreFailure(t *testing.T) {
	st, err := OpenBolt(filepath.Join(t.TempDir(), DBFileName))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fs := &failingStore{Store: st, fail: true}
	rt := newFakeRuntime()
	m, err := New(Config{Store: fs, Runtime: rt, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, _, _, err := m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"}); !errdefs.IsUnavailable(err) {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	if rt.creates() != 0 || m.Stats().Live != 0 {
		t.Fatalf("a lease that was never persisted was created: creates=%d live=%d", rt.creates(), m.Stats().Live)
	}
	fs.mu.Lock()
	fs.fail = false
	fs.mu.Unlock()
	if _, _, created, err := m.Acquire(context.Background(), AcquireRequest{ConversationID: "c"}); err != nil || !created {
		t.Fatalf("after recovery: %v", err)
	}
}
