package lease

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The work queue's client-go semantics: an id is queued once however often
// it is added, an id added while handed out comes back after done, and
// shutDown wakes a waiting get.
func TestWorkQueueSemantics(t *testing.T) {
	q := newWorkQueue()
	q.add("a")
	q.add("b")
	q.add("a")
	id, ok := q.get()
	if !ok || id != "a" {
		t.Fatalf("get = %q, %v; want a", id, ok)
	}
	if !q.has("a") {
		t.Fatal("a handed out but has(a) is false")
	}
	q.add("a") // while handed out: not queued twice, not handed out twice
	if id, _ := q.get(); id != "b" {
		t.Fatalf("second get = %q; want b (a is still handed out)", id)
	}
	q.done("b")
	if q.has("b") {
		t.Fatal("b done and not added again, but has(b)")
	}
	q.done("a") // added meanwhile: queued again
	if id, _ := q.get(); id != "a" {
		t.Fatalf("after done: get = %q; want a again", id)
	}
	q.done("a")
	if q.has("a") {
		t.Fatal("a done twice over, but has(a)")
	}

	got := make(chan bool)
	go func() {
		_, ok := q.get()
		got <- ok
	}()
	q.shutDown()
	if ok := <-got; ok {
		t.Fatal("get after shutDown reported an id")
	}
	q.add("c")
	if q.has("c") {
		t.Fatal("add after shutDown queued")
	}
}

// Under -race: many adders and workers, and no id is ever handled by two
// workers at once; every id added is handled at least once after its
// last add.
func TestWorkQueueNeverTwiceAtOnce(t *testing.T) {
	q := newWorkQueue()
	const ids, adds, workers = 5, 2000, 4
	var (
		mu       sync.Mutex
		busy     = map[string]bool{}
		handled  = map[string]int{} // handlings that began after the last add
		lastAdd  = map[string]int{}
		addCount atomic.Int64
	)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				id, ok := q.get()
				if !ok {
					return
				}
				mu.Lock()
				if busy[id] {
					mu.Unlock()
					t.Errorf("%s handed to two workers at once", id)
					return
				}
				busy[id] = true
				seen := lastAdd[id]
				mu.Unlock()
				time.Sleep(time.Microsecond)
				mu.Lock()
				busy[id] = false
				if seen == lastAdd[id] {
					handled[id] = seen
				}
				mu.Unlock()
				q.done(id)
			}
		}()
	}
	var adders sync.WaitGroup
	for a := range 4 {
		adders.Add(1)
		go func() {
			defer adders.Done()
			for i := range adds {
				id := fmt.Sprintf("l%d", (i+a)%ids)
				mu.Lock()
				lastAdd[id] = int(addCount.Add(1))
				mu.Unlock()
				q.add(id)
			}
		}()
	}
	adders.Wait()
	eventually(t, 10*time.Second, "every id handled after its last add", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id, n := range lastAdd {
			if handled[id] != n {
				return false
			}
		}
		return true
	})
	q.shutDown()
	wg.Wait()
}

// One operation per lease: a died event that comes while a snapshot holds
// the lease neither restarts the sandbox under the snapshot nor is lost —
// the lease is marked dirty, and once the snapshot lets go a worker looks
// at it and restarts the sandbox in place (no resync needed: the interval
// is an hour).
func TestEventWhileHeldIsHandledWhenReleased(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ResyncInterval = time.Hour })
	l, _ := h.acquire("conv")
	_, release, err := h.m.pauser.holdForSnapshot(context.Background(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	h.rt.kill(l.ContainerID, 137, false)
	eventually(t, 10*time.Second, "the died event marks the held lease dirty", func() bool {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		return h.m.leases[l.ID].dirty
	})
	if n := h.rt.restartCount(); n != 0 {
		t.Fatalf("the sandbox was restarted %d times while the snapshot held the lease", n)
	}
	if g := h.get(l.ID); g.State != StateReady {
		t.Fatalf("while held: %s %q; want READY", g.State, g.Reason)
	}
	release()
	eventually(t, 10*time.Second, "the lease restarted in place once the snapshot let go", func() bool {
		g := h.get(l.ID)
		return g.State == StateReady && g.Restarts == 1
	})
	if n := h.rt.restartCount(); n != 1 {
		t.Fatalf("restarts = %d; want 1", n)
	}
}

// A release that comes while a pause holds the lease waits for the pause
// and then removes the sandbox: the removal never runs beside the pause,
// and the lease ends RELEASED with its container gone.
func TestReleaseWhilePausingRemovesAfterThePause(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("conv")
	// Hold the lease with a pause fix (a pause held open by the test).
	h.m.mu.Lock()
	e := h.m.leases[l.ID]
	o := beginOpLocked(e, opPause)
	h.m.mu.Unlock()

	done := make(chan error, 1)
	go func() {
		_, err := h.m.Release(context.Background(), l.ID, "")
		done <- err
	}()
	eventually(t, 10*time.Second, "the release recorded while the pause holds the lease", func() bool {
		return h.get(l.ID).State == StateReleasing
	})
	if !h.rt.exists(l.ContainerID) {
		t.Fatal("the container was removed while the pause held the lease")
	}
	h.m.mu.Lock()
	h.m.endOpLocked(e, o, nil)
	h.m.mu.Unlock()
	o.finish()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("release did not end after the pause let go")
	}
	if g := h.get(l.ID); g.State != StateReleased || !g.Cleaned || h.rt.exists(l.ContainerID) {
		t.Fatalf("after release: %s cleaned=%v, container left=%v", g.State, g.Cleaned, h.rt.exists(l.ContainerID))
	}
}
