package lease

import (
	"context"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/periodic"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Several replicas, one fleet (Config.Store is a SharedStore; docs/kubernetes.md):
//
//   - every replica holds every record in memory: its own writes, and the
//     others' through SharedStore.Subscribe (applyRemote), so each one
//     routes, renews, releases and lists every lease;
//   - a lease's home (Lease.Instance, the replica that created it) is the
//     only one that acts on its sandbox's runtime events, restarts it,
//     measures its disk and reconciles it at start (homeLocked); a
//     replica restarted under its instance id takes its leases back;
//   - the elected replica (Config.Elect) expires, reaps and purges every
//     lease; the others only write the activity they saw (runReaper);
//   - one live lease per conversation fleet-wide: the creator takes the
//     conversation's lock before it records the lease, and a replica that
//     finds the lock taken joins the holder's lease (acquireShared).

// remoteJoinWait bounds how long an acquire waits for the record of a lease
// another replica locked the conversation for: past it, a lock whose
// record never appeared is taken over (its replica died between the lock
// and the record).
var remoteJoinWait = 10 * time.Second

// homeLocked reports whether this replica is e's home: always without a
// SharedStore. Called with mu held.
func (m *Manager) homeLocked(e *entry) bool {
	return m.shared == nil || e.l.Instance == "" || e.l.Instance == m.cfg.InstanceID
}

// acquireShared is Acquire's path for a conversation with no live lease in
// memory when the store is shared: it locks the conversation for a new
// lease id, then creates the lease (startCreate) — or, when another lease
// holds the lock, waits for that lease to appear in memory (another
// replica's, through Subscribe) and reports retry, so that Acquire looks
// again and joins it. A lock left by a lease that ended, or whose record
// never appears, is taken over. Called without mu.
func (m *Manager) acquireShared(ctx context.Context, req AcquireRequest) (l Lease, retry bool, err error) {
	id := newID(m.now())
	holder, err := m.shared.LockConversation(ctx, req.Owner, req.ConversationID, id)
	if err != nil {
		return Lease{}, false, wrapf(err, "acquire: lock conversation %q", req.ConversationID)
	}
	if holder != id {
		took, err := m.awaitHolder(ctx, req, holder, id)
		if err != nil || !took {
			return Lease{}, !took, err
		}
	}
	m.mu.Lock()
	if err := m.usableLocked(); err != nil {
		m.mu.Unlock()
		m.unlockConversation(req.Owner, req.ConversationID, id)
		return Lease{}, false, err
	}
	if e := m.byConv[convKey(req.Owner, req.ConversationID)]; e != nil {
		// A lease of this conversation appeared in memory meanwhile (fed
		// from a replica that took the lock before it was ours): join it.
		m.mu.Unlock()
		m.unlockConversation(req.Owner, req.ConversationID, id)
		return Lease{}, true, nil
	}
	l, err = m.startCreateID(ctx, req, id)
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		// Nothing was created, or the lease FAILED: free the conversation.
		if _, gerr := m.Get(ctx, id); gerr != nil {
			m.unlockConversation(req.Owner, req.ConversationID, id)
		}
	}
	return l, false, err
}

// awaitHolder waits until the lease holder (which holds the conversation's
// lock) is live in memory, then reports took=false: the caller looks the
// conversation up again and joins it. A holder that is ended, or whose
// record does not appear within remoteJoinWait, left a stale lock: it is
// replaced by id (took=true) unless a third replica replaced it first.
func (m *Manager) awaitHolder(ctx context.Context, req AcquireRequest, holder, id string) (took bool, err error) {
	deadline := time.Now().Add(remoteJoinWait)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		m.mu.Lock()
		e := m.leases[holder]
		live := e != nil && holdsConversation(e.l.State)
		ended := e != nil && !live
		m.mu.Unlock()
		switch {
		case live:
			return false, nil
		case ended || time.Now().After(deadline):
			if e == nil {
				// Not in memory yet: ask the store before calling it stale.
				if sl, gerr := m.store.Get(holder); gerr == nil && holdsConversation(sl.State) {
					m.applyRemote(sl, false)
					return false, nil
				}
			}
			ok, err := m.shared.TakeConversation(ctx, req.Owner, req.ConversationID, holder, id)
			if err != nil {
				return false, wrapf(err, "acquire: take over the lock of conversation %q from lease %s", req.ConversationID, holder)
			}
			if ok {
				m.log.Info("took over a stale conversation lock", "conversation_id", req.ConversationID, "stale_lease_id", holder, "lease_id", id)
			}
			return ok, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
		}
	}
}

// unlockConversation frees the conversation's lock held by lease id, in the
// background and bounded (a lock left behind is taken over by the next
// acquire of the conversation).
func (m *Manager) unlockConversation(owner, conversation, id string) {
	if m.shared == nil {
		return
	}
	m.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.shared.UnlockConversation(ctx, owner, conversation, id); err != nil {
			m.log.Warn("freeing the conversation lock failed; the next acquire takes it over", "lease_id", id, "conversation_id", conversation, "err", err)
		}
	})
}

// subscribeShared feeds the records other replicas write into memory
// until ctx ends, re-subscribing with backoff when the feed fails.
func (m *Manager) subscribeShared(ctx context.Context) {
	bo := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := m.shared.Subscribe(ctx, m.applyRemote)
		if ctx.Err() != nil {
			return
		}
		m.log.Warn("lease feed from the other replicas ended; re-subscribing", "err", err, "retry_in", bo)
		select {
		case <-ctx.Done():
			return
		case <-time.After(bo):
		}
		bo = min(bo*2, 10*time.Second)
	}
}

// applyRemote puts a record another replica wrote (or deleted) into
// memory, with the bookkeeping a local transition does: counts, the
// conversation index, the ended channel, Watch subscribers.
func (m *Manager) applyRemote(l Lease, deleted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.leases[l.ID]
	if deleted {
		if e == nil || e.call != nil || e.cleaning != nil || e.pause != nil {
			return // unknown, or work of ours in flight on it
		}
		delete(m.leases, l.ID)
		m.counts[e.l.State]--
		m.admit.trackLiveLocked(e.l.Owner, e.l.State, StateUnspecified)
		if key := convKey(e.l.Owner, e.l.ConversationID); m.byConv[key] == e {
			delete(m.byConv, key)
		}
		if !e.l.State.Ended() {
			close(e.ended)
		}
		m.pmu.Lock()
		delete(m.persisted, l.ID)
		m.pmu.Unlock()
		return
	}
	if !l.State.Valid() {
		m.log.Warn("skipping another replica's lease record with unknown state", "lease_id", l.ID, "state", string(l.State))
		return
	}
	from := StateUnspecified
	if e == nil {
		e = &entry{ended: make(chan struct{})}
		m.leases[l.ID] = e
	} else {
		from = e.l.State
	}
	if e.call != nil {
		// Being created here: our creation writes the outcome (a
		// release from another replica meanwhile is seen at READY).
		return
	}
	if l.TransitionCount() < e.l.TransitionCount() {
		// Older than what we hold (histories only grow): a replica wrote
		// a snapshot taken before our last transition reached it.
		return
	}
	e.l = l
	e.l.Claiming = false
	e.rev++
	m.pmu.Lock()
	m.persisted[l.ID] = e.rev // what the store holds
	m.pmu.Unlock()
	if from == l.State && from != StateUnspecified {
		return
	}
	m.counts[from]--
	if from == StateUnspecified {
		delete(m.counts, StateUnspecified)
	}
	m.counts[l.State]++
	m.admit.trackLiveLocked(l.Owner, from, l.State)
	if l.State == StateReady || l.State == StatePaused {
		m.seq++
		e.readySeq = m.seq
	}
	key := convKey(l.Owner, l.ConversationID)
	switch {
	case holdsConversation(l.State):
		if other := m.byConv[key]; other == nil || other == e || !holdsConversation(other.l.State) {
			m.byConv[key] = e
		}
	case m.byConv[key] == e:
		delete(m.byConv, key)
	}
	if l.State.Ended() && (from == StateUnspecified || !from.Ended()) {
		close(e.ended)
	}
	var t *Transition
	if n := len(l.Transitions); n > 0 {
		t = &l.Transitions[n-1]
	}
	m.emitLocked(e, t)
}

// refreshShared reads lease id from the shared store and applies it, so a
// home replica acting on a runtime event sees a release or expiry another
// replica wrote but whose feed has not arrived yet.
func (m *Manager) refreshShared(id string) {
	if m.shared == nil || id == "" {
		return
	}
	l, err := m.store.Get(id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
	case err != nil:
		m.log.Warn("reading a lease record before acting on its sandbox's event failed", "lease_id", id, "err", err)
	case l.Instance != "" && l.Instance != m.cfg.InstanceID, l.State != StateReady:
		m.applyRemote(l, false)
	}
}

// flushActivityLoop writes, on a replica that is not elected, the activity
// its proxy recorded (Touch): the elected replica's idle timeouts read it
// from the store. It runs until ctx ends; a pass does nothing while this
// replica leads (the reaper flushes then).
func (m *Manager) flushActivityLoop(ctx context.Context) {
	periodic.Run(ctx, m.cfg.ReapInterval, func(context.Context) {
		if m.leading.Load() {
			return
		}
		real := time.Now()
		var snaps []snap
		m.mu.Lock()
		for _, e := range m.leases {
			if e.l.State == StateReady && e.activityDirty && real.Sub(e.activityWritten) >= m.cfg.ActivityFlushInterval {
				e.activityDirty, e.activityWritten = false, real
				e.rev++
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			}
		}
		m.mu.Unlock()
		m.persistAll(snaps)
	})
}

// awaitRemotePending waits until lease id, which another replica is
// creating, is no longer PENDING here (its outcome arrived through the
// feed), bounded by twice Config.ReadyTimeout.
func (m *Manager) awaitRemotePending(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*m.cfg.ReadyTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		m.mu.Lock()
		e := m.leases[id]
		pending := e != nil && e.l.State == StatePending
		m.mu.Unlock()
		if !pending {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return errdefs.Unavailable("lease %s is still being created by another replica after %s", id, 2*m.cfg.ReadyTimeout)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}
