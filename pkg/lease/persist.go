package lease

import "sync"

// groupCommit batches the store writes of concurrent persist calls: a call
// that arrives while a write is in flight joins the next batch, and that
// batch is written as one transaction (Store.PutAll: one fsync with the
// bbolt store) as soon as the write in flight ends. A lone call writes at
// once, as before; ten concurrent claims wait for about two writes instead
// of queueing for ten. Every call still returns only once its snapshot, or
// a newer one of the same lease, is durable.
type groupCommit struct {
	mu      sync.Mutex
	next    *writeBatch // filling; nil when no call waits
	writing bool        // a batch is being written
}

// writeBatch is one group commit: the newest snapshot of each lease whose
// persist calls arrived while the previous batch was being written.
type writeBatch struct {
	snaps map[string]snap
	done  chan struct{} // closed when written; errs is then final
	errs  map[string]error
}

// persist writes a snapshot unless a newer revision of the same lease was
// already written (snapshots are taken under mu but written outside it, so
// two writers can race; the revision keeps the store monotonic). Calls
// that overlap are written together (groupCommit).
func (m *Manager) persist(l Lease, rev uint64) error {
	gc := &m.commits
	gc.mu.Lock()
	b := gc.next
	if b == nil {
		b = &writeBatch{snaps: map[string]snap{}, done: make(chan struct{})}
		gc.next = b
	}
	if s, ok := b.snaps[l.ID]; !ok || s.rev < rev {
		b.snaps[l.ID] = snap{l, rev}
	}
	lead := !gc.writing
	if lead {
		gc.writing, gc.next = true, nil
	}
	gc.mu.Unlock()
	if lead {
		m.commit(b)
	}
	<-b.done
	return b.errs[l.ID]
}

// commit writes batch b, then hands the batch that filled meanwhile, if
// any, to a goroutine of its own (so that b's callers return now).
func (m *Manager) commit(b *writeBatch) {
	m.writeBatch(b)
	close(b.done)
	gc := &m.commits
	gc.mu.Lock()
	next := gc.next
	gc.next = nil
	if next == nil {
		gc.writing = false
	}
	gc.mu.Unlock()
	if next != nil {
		go m.commit(next)
	}
}

// writeBatch writes the snapshots of b that are newer than what the store
// holds, in one PutAll; when that fails, one Put each, so that every
// caller gets its own lease's outcome and one bad record fails no other.
func (m *Manager) writeBatch(b *writeBatch) {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	var ls []Lease
	var revs []uint64
	for id, s := range b.snaps {
		if last, ok := m.persisted[id]; ok && last >= s.rev {
			continue
		}
		ls, revs = append(ls, s.l), append(revs, s.rev)
	}
	switch {
	case len(ls) == 0:
		return
	case len(ls) == 1:
		// One record: Put, whose error names the lease.
	default:
		if err := m.store.PutAll(ls); err == nil {
			for i, l := range ls {
				m.persisted[l.ID] = revs[i]
			}
			return
		}
	}
	b.errs = map[string]error{}
	for i, l := range ls {
		if err := m.store.Put(l); err != nil {
			m.log.Error("persist lease", "lease_id", l.ID, "state", l.State.String(), "err", err)
			b.errs[l.ID] = err
			continue
		}
		m.persisted[l.ID] = revs[i]
	}
}
