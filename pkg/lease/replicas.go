package lease

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
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
//   - the elected replica (FleetConfig.Elect) expires, reaps and purges
//     every lease; the others only write the activity they saw
//     (runReaper, flushActivityLoop);
//   - one live lease per conversation fleet-wide: the creator takes the
//     conversation's lock before it records the lease, and a replica that
//     finds the lock taken joins the holder's lease (acquireShared).
//
// The fleet does it; Config.Fleet configures it.

// FleetConfig configures how a Manager serves one fleet with other
// replicas (replicas.go): the election of the replica that runs the
// reaper, and the writes of activity. Zero fields take the defaults
// (DefaultFleetConfig).
type FleetConfig struct {
	// Elect, when set, runs the reaper (expiry, idle pauses, the removal
	// queue, purging) only while this replica is elected among the
	// orchestrators that serve one fleet: Elect calls lead while this
	// replica leads, with a context that ends when it stops leading, and
	// returns when ctx ends (kubernetes.Runtime.RunLeader). Default nil:
	// the reaper always runs.
	Elect func(ctx context.Context, lead func(ctx context.Context)) error
	// ActivityFlushInterval is the least time between two writes of a
	// lease's LastActivityAt caused by Touch: by the reaper (a lone
	// replica, or the elected one) and, with a SharedStore, by the
	// replicas that are not elected. Default 5s.
	ActivityFlushInterval time.Duration
}

// DefaultFleetConfig returns the defaults of FleetConfig.
func DefaultFleetConfig() FleetConfig {
	return FleetConfig{ActivityFlushInterval: 5 * time.Second}
}

// withDefaults returns c with its zero fields taken from
// DefaultFleetConfig, validated.
func (c FleetConfig) withDefaults() (FleetConfig, error) {
	d := DefaultFleetConfig()
	if c.ActivityFlushInterval == 0 {
		c.ActivityFlushInterval = d.ActivityFlushInterval
	}
	return c, c.Validate()
}

// Validate reports the first field that cannot work (an
// errdefs.ErrInvalidArgument naming it): ActivityFlushInterval must not be
// negative.
func (c FleetConfig) Validate() error {
	if c.ActivityFlushInterval < 0 {
		return errdefs.InvalidArgument("interval", "durations must not be negative")
	}
	return nil
}

// remoteJoinWait bounds how long an acquire waits for the record of a lease
// another replica locked the conversation for: past it, a lock whose
// record never appeared is taken over (its replica died between the lock
// and the record).
var remoteJoinWait = 10 * time.Second

// fleetHost is what the fleet needs from the Manager; *Manager implements
// it. Every method ending in Locked is called with the Manager's mu held;
// the others without it.
type fleetHost interface {
	// applyRemote puts a record another replica wrote (or deleted) into
	// memory (below: the Manager's side of the fleet). Takes mu.
	applyRemote(l Lease, deleted bool)
	// usableLocked reports why no acquire may start now (manager.go).
	usableLocked() error
	// Get returns a lease (manager.go).
	Get(ctx context.Context, id string) (Lease, error)
	// persistAll writes snapshots of leases (manager.go).
	persistAll(snaps []snap)
	// goBackground runs f in a goroutine Close waits for (manager.go).
	goBackground(f func())
	// now is the lease clock (manager.go).
	now() time.Time
}

// fleet is a Manager's part in a fleet of replicas (see the top of this
// file): without a SharedStore (shared nil) it only runs the reaper,
// under FleetConfig.Elect when set, and every lease is at home here.
//
// Locking is the Manager's: mu is the Manager's mu, which guards leases
// and byConv (the Manager's maps, read and written with mu held). Every
// method ending in Locked is called with mu held and does not release it;
// the others are called without mu and take it themselves (startCreateID
// is entered with mu held, as Acquire does, and releases it).
type fleet struct {
	cfg FleetConfig
	// shared is the Manager's Store when it is a SharedStore (several
	// replicas, one fleet); nil otherwise.
	shared SharedStore
	host   fleetHost
	log    *slog.Logger
	// startCreateID creates lease id for req (the acquirer's, acquire.go).
	// Takes mu, which the caller holds: it returns with mu released.
	startCreateID func(ctx context.Context, req AcquireRequest, id string, c *claim) (Lease, error)
	// releaseClaim gives up a warm claim no lease took (the pools',
	// poolshared.go). New sets it.
	releaseClaim func(c *claim)
	// instanceID is Config.InstanceID (homeLocked); readyTimeout
	// Config.ReadyTimeout (awaitRemotePending); reapInterval
	// Config.ReapInterval (flushActivityLoop).
	instanceID                 string
	readyTimeout, reapInterval time.Duration
	// leading is set while this replica runs the reaper (always without
	// Elect).
	leading atomic.Bool

	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, read with mu held
	byConv map[string]*entry // the Manager's, read with mu held
}

// newFleet returns the fleet part of a Manager: cfg has its defaults
// applied; startCreateID is its acquirer's; mu, leases and byConv are the
// Manager's. Warm pools with a SharedStore need a Runtime that is a
// MemberClaimer (poolshared.go).
func newFleet(cfg Config, host fleetHost, startCreateID func(ctx context.Context, req AcquireRequest, id string, c *claim) (Lease, error),
	mu *sync.Mutex, leases, byConv map[string]*entry) (*fleet, error) {
	f := &fleet{cfg: cfg.Fleet, host: host, log: cfg.Logger, startCreateID: startCreateID, instanceID: cfg.InstanceID,
		readyTimeout: cfg.ReadyTimeout, reapInterval: cfg.ReapInterval, mu: mu, leases: leases, byConv: byConv}
	if ss, ok := cfg.Store.(SharedStore); ok {
		if _, ok := cfg.Runtime.(MemberClaimer); !ok && len(cfg.Pools.Pools) > 0 {
			return nil, errdefs.InvalidArgument("pools", "warm pools with a lease store shared by several replicas need a runtime whose pool members can be claimed atomically (the kubernetes runtime)")
		}
		f.shared = ss
	}
	return f, nil
}

// start starts the loops of a shared store (the feed from the other
// replicas, the activity writes) until ctx ends; nothing without one.
func (f *fleet) start(ctx context.Context) {
	if f.shared == nil {
		return
	}
	f.host.goBackground(func() { f.subscribeShared(ctx) })
	f.host.goBackground(func() { f.flushActivityLoop(ctx) })
}

// runReaper runs reapLoop until ctx ends: always, or with
// FleetConfig.Elect only while this replica is the elected one.
func (f *fleet) runReaper(ctx context.Context, reapLoop func(context.Context)) {
	if f.cfg.Elect == nil {
		f.leading.Store(true)
		reapLoop(ctx)
		return
	}
	lead := func(ctx context.Context) {
		f.log.Info("elected: this replica runs expiry and reaping")
		f.leading.Store(true)
		reapLoop(ctx)
		f.leading.Store(false)
		f.log.Info("no longer elected: expiry and reaping stopped here")
	}
	if err := f.cfg.Elect(ctx, lead); err != nil && ctx.Err() == nil {
		f.log.Error("leader election ended: expiry and reaping do not run on this replica", "err", err)
	}
}

// homeLocked reports whether this replica is e's home: always without a
// SharedStore. Called with mu held.
func (f *fleet) homeLocked(e *entry) bool {
	return f.shared == nil || e.l.Instance == "" || e.l.Instance == f.instanceID
}

// acquireShared is Acquire's path for a conversation with no live lease in
// memory when the store is shared: it locks the conversation for a new
// lease id, then creates the lease (startCreate) — or, when another lease
// holds the lock, waits for that lease to appear in memory (another
// replica's, through Subscribe) and reports retry, so that Acquire looks
// again and joins it. A lock left by a lease that ended, or whose record
// never appears, is taken over. c, when not nil, is a warm pool's member
// this replica claimed for the acquire (poolshared.go): the lock names its
// pre-allocated lease id, and a claim no lease takes is given up
// (releaseClaim). Called without mu.
func (f *fleet) acquireShared(ctx context.Context, req AcquireRequest, c *claim) (l Lease, retry bool, err error) {
	id := newID(f.host.now())
	if c != nil {
		id = c.m.id
	}
	holder, err := f.shared.LockConversation(ctx, req.Owner, req.ConversationID, id)
	if err != nil {
		f.releaseClaim(c)
		return Lease{}, false, wrapf(err, "acquire: lock conversation %q", req.ConversationID)
	}
	if holder != id {
		took, err := f.awaitHolder(ctx, req, holder, id)
		if err != nil || !took {
			f.releaseClaim(c)
			return Lease{}, !took, err
		}
	}
	f.mu.Lock()
	if err := f.host.usableLocked(); err != nil {
		f.mu.Unlock()
		f.unlockConversation(req.Owner, req.ConversationID, id)
		f.releaseClaim(c)
		return Lease{}, false, err
	}
	if e := f.byConv[convKey(req.Owner, req.ConversationID)]; e != nil {
		// A lease of this conversation appeared in memory meanwhile (fed
		// from a replica that took the lock before it was ours): join it.
		f.mu.Unlock()
		f.unlockConversation(req.Owner, req.ConversationID, id)
		f.releaseClaim(c)
		return Lease{}, true, nil
	}
	l, err = f.startCreateID(ctx, req, id, c) // releases mu; takes c
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		// Nothing was created, or the lease FAILED: free the conversation.
		if _, gerr := f.host.Get(ctx, id); gerr != nil {
			f.unlockConversation(req.Owner, req.ConversationID, id)
		}
	}
	return l, false, err
}

// awaitHolder waits until the lease holder (which holds the conversation's
// lock) is live in memory, then reports took=false: the caller looks the
// conversation up again and joins it. A holder that is ended, or whose
// record does not appear within remoteJoinWait, left a stale lock: it is
// replaced by id (took=true) unless a third replica replaced it first.
func (f *fleet) awaitHolder(ctx context.Context, req AcquireRequest, holder, id string) (took bool, err error) {
	deadline := time.Now().Add(remoteJoinWait)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		f.mu.Lock()
		e := f.leases[holder]
		live := e != nil && holdsConversation(e.l.State)
		ended := e != nil && !live
		f.mu.Unlock()
		switch {
		case live:
			return false, nil
		case ended || time.Now().After(deadline):
			if e == nil {
				// Not in memory yet: ask the store before calling it stale.
				if sl, gerr := f.shared.Get(holder); gerr == nil && holdsConversation(sl.State) {
					f.host.applyRemote(sl, false)
					return false, nil
				}
			}
			ok, err := f.shared.TakeConversation(ctx, req.Owner, req.ConversationID, holder, id)
			if err != nil {
				return false, wrapf(err, "acquire: take over the lock of conversation %q from lease %s", req.ConversationID, holder)
			}
			if ok {
				f.log.Info("took over a stale conversation lock", "conversation_id", req.ConversationID, "stale_lease_id", holder, "lease_id", id)
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
// acquire of the conversation). Nothing without a SharedStore.
func (f *fleet) unlockConversation(owner, conversation, id string) {
	if f.shared == nil {
		return
	}
	f.host.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.shared.UnlockConversation(ctx, owner, conversation, id); err != nil {
			f.log.Warn("freeing the conversation lock failed; the next acquire takes it over", "lease_id", id, "conversation_id", conversation, "err", err)
		}
	})
}

// subscribeShared feeds the records other replicas write into memory
// until ctx ends, re-subscribing with backoff when the feed fails.
func (f *fleet) subscribeShared(ctx context.Context) {
	bo := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := f.shared.Subscribe(ctx, f.host.applyRemote)
		if ctx.Err() != nil {
			return
		}
		f.log.Warn("lease feed from the other replicas ended; re-subscribing", "err", err, "retry_in", bo)
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
// conversation index, the ended channel, Watch subscribers. It is the
// Manager's side of the fleet (fleetHost): the Manager's own memory, which
// the fleet feeds. Called without mu.
func (m *Manager) applyRemote(l Lease, deleted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.leases[l.ID]
	if deleted {
		if e == nil || e.op != nil {
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
	if e.op != nil && (e.op.kind == opCreate || e.op.kind == opRestart) {
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
	if e.l.Phase == PhaseClaiming { // only ever in a record (pool.go)
		_ = e.l.SetPhase(PhaseNone)
	}
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
	m.hub.emitLocked(e, t)
}

// refreshShared reads lease id from the shared store and applies it, so a
// home replica acting on a runtime event sees a release or expiry another
// replica wrote but whose feed has not arrived yet.
func (f *fleet) refreshShared(id string) {
	if f.shared == nil || id == "" {
		return
	}
	l, err := f.shared.Get(id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
	case err != nil:
		f.log.Warn("reading a lease record before acting on its sandbox's event failed", "lease_id", id, "err", err)
	case l.Instance != "" && l.Instance != f.instanceID, l.State != StateReady:
		f.host.applyRemote(l, false)
	}
}

// flushActivityLoop writes, on a replica that is not elected, the activity
// its proxy recorded (Touch): the elected replica's idle timeouts read it
// from the store. It runs until ctx ends; a pass does nothing while this
// replica leads (the reaper flushes then).
func (f *fleet) flushActivityLoop(ctx context.Context) {
	periodic.Run(ctx, f.reapInterval, func(context.Context) {
		if f.leading.Load() {
			return
		}
		real := time.Now()
		var snaps []snap
		f.mu.Lock()
		for _, e := range f.leases {
			if e.l.State == StateReady && e.activityDirty && real.Sub(e.activityWritten) >= f.cfg.ActivityFlushInterval {
				e.activityDirty, e.activityWritten = false, real
				e.rev++
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			}
		}
		f.mu.Unlock()
		f.host.persistAll(snaps)
	})
}

// remotePendingWait bounds how long a request to a lease that another
// replica recorded as PENDING waits here for its next record (Manager.Use):
// the feed lags the store, so the replica that answered an acquire READY
// may not be the one the client's next request reaches.
var remotePendingWait = 5 * time.Second

// homedElsewhere reports whether lease id is here only through another
// replica's records: the store is shared, the lease's home is another
// replica and no operation of this replica's is in flight on it. It does
// not look at the state: the caller saw PENDING a moment before, and a
// record that arrived in between is what it waits for (Manager.Use).
func (f *fleet) homedElsewhere(id string) bool {
	if f.shared == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.leases[id]
	return e != nil && e.op == nil && !f.homeLocked(e)
}

// awaitRemotePending waits until lease id, which another replica is
// creating, is no longer PENDING here (its outcome arrived through the
// feed), bounded by within.
func (f *fleet) awaitRemotePending(ctx context.Context, id string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		f.mu.Lock()
		e := f.leases[id]
		pending := e != nil && e.l.State == StatePending
		f.mu.Unlock()
		if !pending {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return errdefs.Unavailable("lease %s is still being created by another replica after %s", id, within)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}
