package lease

import (
	"context"
	"slices"
	"time"

	"github.com/berth-dev/berth/internal/periodic"
)

// reapLoop runs reapOnce every ReapInterval until ctx ends: always, or
// with FleetConfig.Elect only while this replica is the elected one
// (fleet.runReaper, replicas.go).
func (m *Manager) reapLoop(ctx context.Context) {
	periodic.Run(ctx, m.cfg.ReapInterval, func(context.Context) { m.reapOnce() })
}

// reapOnce is one reaper pass. Under the mutex it only updates memory:
// READY leases past their TTL or idle timeout, and PAUSED leases past
// Config.Pause.PausedRetention, become EXPIRED (an idle lease whose IdlePolicy is
// freeze or hibernate is paused instead, in the background), containers
// due for removal are queued for the workers, dirty activity is snapshotted
// and purgeable records are dropped. Store writes and runtime calls happen
// after the mutex is released, so Acquire never waits for them.
func (m *Manager) reapOnce() {
	now, real := m.now(), time.Now()
	var snaps []snap
	var purge []string
	var pauses []func(context.Context)
	m.mu.Lock()
	runCtx := m.runCtx
	for id, e := range m.leases {
		switch {
		case e.l.State == StateReady:
			if e.uses > 0 {
				// A request or stream is in flight (Use, use.go): the
				// lease is not idle, whatever the proxy's touches say.
				e.l.LastActivityAt = now
				e.activityDirty = true
			}
			if reason := expiryReason(&e.l, now); reason != "" {
				_ = m.transitionLocked(e, StateExpired, reason)
				m.enqueueCleanLocked(e)
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			} else if why := idleReason(&e.l, now); why != "" && e.op == nil {
				// The idle policy pauses it (IdleFreeze, IdleHibernate).
				pauses = append(pauses, m.pauser.idlePauseLocked(e, why))
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			} else if e.activityDirty && real.Sub(e.activityWritten) >= m.cfg.Fleet.ActivityFlushInterval {
				e.activityDirty, e.activityWritten = false, real
				e.rev++
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			}
		case e.l.State == StatePaused:
			if reason := m.pauser.cfg.pausedExpiryReason(&e.l, now); reason != "" && e.op == nil {
				_ = m.transitionLocked(e, StateExpired, reason)
				m.enqueueCleanLocked(e)
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			}
		case m.disk.keptLocked(e, now):
			// A stopped container kept for the operator (disk limit):
			// removed once its time is up.
		case e.needsClean():
			if !real.Before(e.retryAt) {
				m.enqueueCleanLocked(e)
			}
		case m.purgeable(e, now):
			purge = append(purge, id)
		}
	}
	if excess := m.admit.excessEndedLocked(); len(excess) > 0 {
		purge = append(purge, excess...)
		slices.Sort(purge)
		purge = slices.Compact(purge)
	}
	m.mu.Unlock()
	m.persistAll(snaps)
	for _, pause := range pauses {
		m.goBackground(func() { pause(runCtx) })
	}
	if len(purge) == 0 {
		return
	}
	// Purge: the store first, so a record that could not be deleted stays
	// visible and is retried on the next pass.
	m.pmu.Lock()
	err := m.store.Delete(purge...)
	if err == nil {
		for _, id := range purge {
			delete(m.persisted, id)
		}
	}
	m.pmu.Unlock()
	if err != nil {
		m.log.Warn("purging ended lease records failed", "count", len(purge), "err", err)
		return
	}
	m.mu.Lock()
	for _, id := range purge {
		if e := m.leases[id]; e != nil && e.droppable() {
			delete(m.leases, id)
			m.counts[e.l.State]--
		}
	}
	m.mu.Unlock()
	m.log.Debug("purged ended lease records", "count", len(purge))
}

// purgeable reports whether e is an ended, cleaned record older than
// Config.Retention that no operation holds. Called with mu held.
func (m *Manager) purgeable(e *entry, now time.Time) bool {
	return e.l.State.Ended() && e.l.Cleaned && m.cfg.Retention >= 0 && now.Sub(e.l.EndedAt) >= m.cfg.Retention &&
		e.op == nil
}
