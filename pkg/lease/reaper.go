package lease

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/periodic"
)

// reaperHost is what the reaper needs from the Manager (implemented by
// *Manager): the state machine, the removal queue, the store writes and
// the purge of records. Its Locked methods are called with the Manager's
// mu held, the others without it.
type reaperHost interface {
	now() time.Time
	// transitionLocked moves e to a state (manager.go).
	transitionLocked(e *entry, to State, reason string) error
	// persistAll writes a batch of snapshots (manager.go).
	persistAll(snaps []snap)
	// purge drops ended records from the store and memory (below).
	purge(ids []string)
}

var _ reaperHost = (*Manager)(nil)

// reaper is the Manager's periodic pass over its leases (see Reaper in
// the package documentation). It shares the Manager's mu and leases map.
type reaper struct {
	host reaperHost
	// Of the Manager's Config: interval is ReapInterval, retention
	// Retention, activityFlush Fleet.ActivityFlushInterval.
	interval, retention, activityFlush time.Duration
	// goBackground runs a func in the background (Close waits for it).
	goBackground func(func())

	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, read with mu held
	// The components a pass goes through: idle pauses and the paused
	// retention (pause.go), the disk limit's kept containers (disk.go) and
	// the limit on ended records (limits.go).
	pauser *pauser
	disk   *diskEnforcer
	admit  *admission
	queue  *workQueue // removals (work.go)
	// runCtx is the context Start runs the Manager in, which the idle
	// pauses run in (the loop's own ends when this replica loses the
	// election). Start sets it; guarded by mu.
	runCtx context.Context
}

// newReaper returns the reaper of a Manager configured by cfg (defaults
// applied): host is the Manager, goBackground its own, mu and leases its
// own, pauser, disk and admit its components.
func newReaper(cfg Config, host reaperHost, goBackground func(func()), mu *sync.Mutex, leases map[string]*entry,
	pauser *pauser, disk *diskEnforcer, admit *admission) *reaper {
	return &reaper{host: host, interval: cfg.ReapInterval, retention: cfg.Retention, activityFlush: cfg.Fleet.ActivityFlushInterval,
		goBackground: goBackground, mu: mu, leases: leases, pauser: pauser, disk: disk, admit: admit}
}

// loop runs a pass (once) every ReapInterval until ctx ends: always, or
// with FleetConfig.Elect only while this replica is the elected one
// (fleet.runReaper, replicas.go).
func (r *reaper) loop(ctx context.Context) {
	periodic.Run(ctx, r.interval, func(context.Context) { r.once() })
}

// once is one reaper pass. Under the mutex it only updates memory:
// READY leases past their TTL or idle timeout, and PAUSED leases past
// Config.Pause.PausedRetention, become EXPIRED (an idle lease whose IdlePolicy is
// freeze or hibernate is paused instead, in the background), containers
// due for removal are queued for the workers, dirty activity is snapshotted
// and purgeable records are dropped. Store writes and runtime calls happen
// after the mutex is released, so Acquire never waits for them.
func (r *reaper) once() {
	now, real := r.host.now(), time.Now()
	var snaps []snap
	var purge []string
	var pauses []func(context.Context)
	r.mu.Lock()
	runCtx := r.runCtx
	for id, e := range r.leases {
		switch {
		case e.l.State == StateReady:
			if e.uses > 0 {
				// A request or stream is in flight (Use, use.go): the
				// lease is not idle, whatever the proxy's touches say.
				e.l.LastActivityAt = now
				e.activityDirty = true
			}
			if reason := expiryReason(&e.l, now); reason != "" {
				_ = r.host.transitionLocked(e, StateExpired, reason)
				r.queue.addRemovalLocked(e)
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			} else if why := idleReason(&e.l, now); why != "" && e.op == nil {
				// The idle policy pauses it (IdleFreeze, IdleHibernate).
				pauses = append(pauses, r.pauser.idlePauseLocked(e, why))
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			} else if e.activityDirty && real.Sub(e.activityWritten) >= r.activityFlush {
				e.activityDirty, e.activityWritten = false, real
				e.rev++
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			}
		case e.l.State == StatePaused:
			if reason := r.pauser.cfg.pausedExpiryReason(&e.l, now); reason != "" && e.op == nil {
				_ = r.host.transitionLocked(e, StateExpired, reason)
				r.queue.addRemovalLocked(e)
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			}
		case r.disk.keptLocked(e, now):
			// A stopped container kept for the operator (disk limit):
			// removed once its time is up.
		case e.needsClean():
			if !real.Before(e.retryAt) {
				r.queue.addRemovalLocked(e)
			}
		case r.purgeable(e, now):
			purge = append(purge, id)
		}
	}
	if excess := r.admit.excessEndedLocked(); len(excess) > 0 {
		purge = append(purge, excess...)
		slices.Sort(purge)
		purge = slices.Compact(purge)
	}
	r.mu.Unlock()
	r.host.persistAll(snaps)
	for _, pause := range pauses {
		r.goBackground(func() { pause(runCtx) })
	}
	if len(purge) == 0 {
		return
	}
	r.host.purge(purge)
}

// purge drops the ended records ids (purgeable, or past
// AdmissionConfig's limit on ended records): the store first, so a record that could not be deleted stays visible and is
// retried on the next pass, then memory.
func (m *Manager) purge(ids []string) {
	m.pmu.Lock()
	err := m.store.Delete(ids...)
	if err == nil {
		for _, id := range ids {
			delete(m.persisted, id)
		}
	}
	m.pmu.Unlock()
	if err != nil {
		m.log.Warn("purging ended lease records failed", "count", len(ids), "err", err)
		return
	}
	m.mu.Lock()
	for _, id := range ids {
		if e := m.leases[id]; e != nil && e.droppable() {
			delete(m.leases, id)
			m.counts[e.l.State]--
		}
	}
	m.mu.Unlock()
	m.log.Debug("purged ended lease records", "count", len(ids))
}

// purgeable reports whether e is an ended, cleaned record older than
// Config.Retention that no operation holds. Called with mu held.
func (r *reaper) purgeable(e *entry, now time.Time) bool {
	return e.l.State.Ended() && e.l.Cleaned && r.retention >= 0 && now.Sub(e.l.EndedAt) >= r.retention &&
		e.op == nil
}
