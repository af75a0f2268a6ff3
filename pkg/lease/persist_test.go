package lease

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// gatedStore is a BoltStore whose writes are counted, whose first write
// waits for release, and whose writes of the record "bad" fail.
type gatedStore struct {
	*BoltStore
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	writes  []int // records per write call, in order
}

var errBadRecord = errors.New("bad record")

func (g *gatedStore) gate(n int) {
	g.once.Do(func() { <-g.release })
	g.mu.Lock()
	g.writes = append(g.writes, n)
	g.mu.Unlock()
}

func (g *gatedStore) Put(l Lease) error {
	g.gate(1)
	if l.ID == "bad" {
		return errBadRecord
	}
	return g.BoltStore.Put(l)
}

func (g *gatedStore) PutAll(ls []Lease) error {
	g.gate(len(ls))
	for _, l := range ls {
		if l.ID == "bad" {
			return errBadRecord
		}
	}
	return g.BoltStore.PutAll(ls)
}

func newCommitManager(t *testing.T) (*Manager, *gatedStore) {
	t.Helper()
	st, err := OpenBolt(filepath.Join(t.TempDir(), DBFileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	g := &gatedStore{BoltStore: st, release: make(chan struct{})}
	return &Manager{store: g, persisted: map[string]uint64{}, log: slog.New(slog.DiscardHandler)}, g
}

// waitWriting waits until a persist call leads a write (it is then in
// the store's gate).
func waitWriting(t *testing.T, m *Manager) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m.commits.mu.Lock()
		writing := m.commits.writing
		m.commits.mu.Unlock()
		if writing {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no persist call leads a write")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitQueued waits until n snapshots wait in the batch being filled.
func waitQueued(t *testing.T, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m.commits.mu.Lock()
		got := 0
		if m.commits.next != nil {
			got = len(m.commits.next.snaps)
		}
		m.commits.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d snapshots queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPersistGroupsConcurrentWrites: while one write is in flight, nine
// more persist calls queue, and they are written in ONE more store call;
// each returns only once its record is in the store.
func TestPersistGroupsConcurrentWrites(t *testing.T) {
	m, g := newCommitManager(t)
	errs := make(chan error, 10)
	go func() { errs <- m.persist(Lease{ID: "first", State: StateReady}, 1) }()
	waitWriting(t, m)
	for i := range 9 {
		go func() { errs <- m.persist(Lease{ID: fmt.Sprintf("l%d", i), State: StateReady}, 1) }()
	}
	waitQueued(t, m, 9)
	close(g.release)
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	writes := append([]int(nil), g.writes...)
	g.mu.Unlock()
	if len(writes) != 2 || writes[0] != 1 || writes[1] != 9 {
		t.Fatalf("store writes (records each) = %v, want [1 9]", writes)
	}
	for _, id := range []string{"first", "l0", "l8"} {
		if _, err := g.Get(id); err != nil {
			t.Errorf("record %s: %v", id, err)
		}
	}
}

// TestPersistBatchFailureIsPerLease: a batch whose transaction fails is
// written one record at a time, so only the bad record's caller fails.
func TestPersistBatchFailureIsPerLease(t *testing.T) {
	m, g := newCommitManager(t)
	errs := map[string]chan error{}
	for _, id := range []string{"lead", "bad", "ok1", "ok2"} {
		errs[id] = make(chan error, 1)
	}
	go func() { errs["lead"] <- m.persist(Lease{ID: "lead", State: StateReady}, 1) }()
	waitWriting(t, m)
	for _, id := range []string{"bad", "ok1", "ok2"} {
		go func() { errs[id] <- m.persist(Lease{ID: id, State: StateReady}, 1) }()
	}
	waitQueued(t, m, 3)
	close(g.release)
	for id, ch := range errs {
		err := <-ch
		if id == "bad" {
			if !errors.Is(err, errBadRecord) {
				t.Errorf("persist %s = %v, want the store's error", id, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("persist %s = %v, want nil", id, err)
		}
		if _, err := g.Get(id); err != nil {
			t.Errorf("record %s: %v", id, err)
		}
	}
	if _, err := g.Get("bad"); err == nil {
		t.Error("the bad record was written")
	}
}

// TestPersistKeepsNewestRevision: an older snapshot persisted after a
// newer one of the same lease does not overwrite it.
func TestPersistKeepsNewestRevision(t *testing.T) {
	m, g := newCommitManager(t)
	close(g.release)
	if err := m.persist(Lease{ID: "a", State: StateReady, ContainerID: "new"}, 2); err != nil {
		t.Fatal(err)
	}
	if err := m.persist(Lease{ID: "a", State: StatePending, ContainerID: "old"}, 1); err != nil {
		t.Fatal(err)
	}
	l, err := g.Get("a")
	if err != nil || l.ContainerID != "new" {
		t.Fatalf("record = %+v, %v; want the newer snapshot", l, err)
	}
}
