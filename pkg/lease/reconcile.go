package lease

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Reasons recorded by reconcile and the event watch.
const (
	ReasonVanishedWhileDown = "container vanished while the orchestrator was down"
	ReasonRestartedCreating = "orchestrator restarted during creation"
	ReasonVanished          = "container vanished"
	ReasonOOMKilled         = "container was OOM-killed"
	ReasonRemovedOutside    = "container was removed outside berth"
)

func alive(sb runtime.Sandbox) bool {
	return sb.State == runtime.StateRunning || sb.State == runtime.StatePaused
}

func (m *Manager) selector() runtime.Selector {
	return runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID}
}

// reconcile makes the loaded records and this instance's containers agree.
// It runs once in Start, before any client call is accepted:
//
//   - READY with a running container: adopted (stays READY; container id
//     and endpoint refreshed from the runtime);
//   - READY whose container is missing or not running: FAILED
//     (ReasonVanishedWhileDown, or how it died);
//   - PENDING: FAILED (ReasonRestartedCreating) — a half-created sandbox is
//     not trusted; so is a READY record a warm claim wrote while its agent
//     was being configured (Lease.Claiming) when the agent was not
//     configured (pool.go);
//   - PAUSED: its container is kept and brought back to the paused state
//     the lease records (frozen, or stopped when hibernated) — it is never
//     treated as dead; a frozen container found stopped makes the lease
//     hibernated (ReasonFreezeLost); a missing one fails it;
//   - RELEASING: the release is finished (RELEASED);
//   - a container with a pool label and no lease record is an unclaimed
//     pooled sandbox: adopted back into its pool when it runs and the pool
//     is still configured with the same profile (pool.go); a pooled
//     container that a lease claimed has that lease's id in its labels and
//     is handled as that lease's above;
//   - every container that is not an adopted lease's or pool's — those of
//     the leases above, of ended leases, and orphans with no lease at all —
//     is removed.
//
// Ended leases whose containers are all gone are marked Cleaned; a removal
// that fails leaves its lease uncleaned (or RELEASING) for the reaper.
func (m *Manager) reconcile(ctx context.Context) error {
	boxes, err := m.rt.List(ctx, m.selector())
	if err != nil {
		return wrapf(err, "lease manager: reconcile: list containers")
	}
	byID := map[string]runtime.Sandbox{}
	byLease := map[string][]runtime.Sandbox{}
	for _, sb := range boxes {
		byID[sb.ID] = sb
		byLease[sb.LeaseID] = append(byLease[sb.LeaseID], sb)
	}
	keep := map[string]bool{}
	var fixes []pauseFix
	unconfigured := m.unconfiguredClaims(ctx, byID, byLease) // pool.go

	m.mu.Lock()
	for _, e := range m.leases {
		if !m.homeLocked(e) {
			continue // another replica's (replicas.go)
		}
		switch e.l.State {
		case StateReady:
			if e.l.Claiming { // written during a warm claim (pool.go)
				e.l.Claiming = false
				e.rev++
				if unconfigured[e.l.ID] {
					_ = m.transitionLocked(e, StateFailed, ReasonRestartedCreating)
					continue
				}
			}
			sb, ok := byID[e.l.ContainerID]
			if !ok { // container id unknown or changed: look by label
				for _, c := range byLease[e.l.ID] {
					if !ok || alive(c) {
						sb, ok = c, true
					}
				}
			}
			switch {
			case !ok:
				_ = m.transitionLocked(e, StateFailed, ReasonVanishedWhileDown)
			case !alive(sb):
				// Died while berth was away (an engine restart stops every
				// container): restart it in place, files kept.
				why, after := deadText(sb)
				if j, ok := m.sandboxExitedLocked(e, sb.ID, why+" while the orchestrator was down", after); ok {
					keep[sb.ID] = true
					e.l.ContainerID = sb.ID
					m.toRestart = append(m.toRestart, j)
				}
			default:
				keep[sb.ID] = true
				e.l.ContainerID, e.l.Endpoint = sb.ID, sb.Endpoint
				e.rev++
				m.seq++
				e.readySeq = m.seq
				m.log.Info("adopted lease", "lease_id", e.l.ID, "container_id", sb.ID, "endpoint", sb.Endpoint)
			}
		case StatePaused:
			sb, ok := byID[e.l.ContainerID]
			if !ok {
				for _, c := range byLease[e.l.ID] {
					sb, ok = c, true
				}
			}
			if ok {
				keep[sb.ID] = true
			}
			if f, ok := m.reconcilePausedLocked(e, sb, ok); ok {
				fixes = append(fixes, f)
			}
		case StatePending:
			if sb, ok := byID[e.l.ContainerID]; ok && restarting(e) {
				// The previous process was restarting it in place: go on.
				keep[sb.ID] = true
				m.toRestart = append(m.toRestart, m.resumeRestartLocked(e, sb.ID))
				continue
			}
			_ = m.transitionLocked(e, StateFailed, ReasonRestartedCreating)
			m.interrupted = true
		default:
			if m.keptLocked(e, m.now()) { // stopped past its disk limit, kept for the operator
				for _, c := range byLease[e.l.ID] {
					keep[c.ID] = true
				}
			}
		}
	}
	// Unclaimed pooled sandboxes (a pool label, no lease record) are
	// adopted back into their pools, or removed below (pool.go).
	for id := range m.adoptPooledLocked(boxes) {
		keep[id] = true
	}
	m.mu.Unlock()
	m.applyPauseFixes(ctx, fixes)

	// Remove every container that is not adopted.
	var (
		mu     sync.Mutex
		failed = map[string]bool{} // lease ids with a container left behind
		wg     sync.WaitGroup
		sem    = make(chan struct{}, m.cfg.ReapConcurrency)
	)
	for _, sb := range boxes {
		if keep[sb.ID] {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			rctx, cancel := detached(ctx, m.cfg.RemoveTimeout)
			defer cancel()
			if err := m.rt.Remove(rctx, sb.ID); err != nil {
				m.log.Warn("reconcile: removing container failed; will retry", "lease_id", sb.LeaseID, "container_id", sb.ID, "err", err)
				mu.Lock()
				failed[sb.LeaseID] = true
				mu.Unlock()
				return
			}
			m.log.Info("reconcile: removed container", "lease_id", sb.LeaseID, "container_id", sb.ID)
		}()
	}
	wg.Wait()

	var snaps []snap
	m.mu.Lock()
	for id, e := range m.leases {
		switch {
		case !m.homeLocked(e):
			continue // another replica's (replicas.go)
		case failed[id]:
			// left for the reaper (RELEASING or ended and uncleaned)
		case m.keptLocked(e, m.now()):
			// its stopped container is kept until its time is up
		case e.l.State == StateReleasing:
			_ = m.transitionLocked(e, StateReleased, e.l.Reason)
			e.l.Cleaned = true
		case e.l.State.Ended() && !e.l.Cleaned:
			e.l.Cleaned = true
			e.rev++
		}
		if e.rev > 0 { // changed since load
			l, rev := e.snapshot()
			snaps = append(snaps, snap{l, rev})
		}
	}
	m.mu.Unlock()
	m.persistAll(snaps)
	return nil
}

// watchLoop follows the runtime's events until ctx ends. When the event
// channel closes or Watch fails it re-subscribes with backoff (100ms doubling
// to 10s) and resyncs after every (re)subscription, so events missed in
// between are caught; while Watch keeps failing, those resyncs are the
// polling fallback. It also resyncs every ResyncInterval.
func (m *Manager) watchLoop(ctx context.Context) {
	const minBackoff, maxBackoff = 100 * time.Millisecond, 10 * time.Second
	bo := minBackoff
	resyncT := time.NewTicker(m.cfg.ResyncInterval)
	defer resyncT.Stop()
	// A creation the previous process had in flight when it died may still
	// finish in the engine after reconcile and the first resync listed the
	// containers (the engine keeps creating after its client is gone): when
	// reconcile found one, resync again 1s and 5s after start rather than
	// leave its container to the next periodic resync.
	var settle *time.Timer
	var settleC <-chan time.Time
	settleAfter := []time.Duration{time.Second, 4 * time.Second}
	m.mu.Lock()
	interrupted := m.interrupted
	m.mu.Unlock()
	if interrupted {
		settle = time.NewTimer(settleAfter[0])
		defer settle.Stop()
		settleC, settleAfter = settle.C, settleAfter[1:]
	}
	sleep := func() bool {
		t := time.NewTimer(bo)
		defer t.Stop()
		bo = min(bo*2, maxBackoff)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		ch, err := m.rt.Watch(ctx)
		m.watchDown.Store(err != nil)
		if err != nil {
			m.log.Warn("watching runtime events failed; polling", "err", err, "retry_in", bo)
			m.resync(ctx)
			if !sleep() {
				return
			}
			continue
		}
		m.resync(ctx)
		since := time.Now()
	events:
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-ch:
				if !ok {
					m.watchDown.Store(true)
					break events
				}
				m.handleEvent(ctx, ev)
			case <-resyncT.C:
				m.resync(ctx)
			case <-settleC:
				m.resync(ctx)
				if len(settleAfter) > 0 {
					settle.Reset(settleAfter[0])
					settleAfter = settleAfter[1:]
				} else {
					settleC = nil
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(since) > time.Minute {
			bo = minBackoff
		}
		m.log.Warn("runtime event watch ended; re-subscribing", "retry_in", bo)
		if !sleep() {
			return
		}
	}
}

// handleEvent acts on the runtime's events for READY leases. An oom event
// (the kernel killed a process of the sandbox; the agent reports it to the
// command's caller) is only logged and counted: the sandbox lives on. A
// died event (the container exited: agent crash, OOM kill of the agent,
// kill from outside, engine stopping) restarts the container in place
// within the restart budget, else fails the lease and queues the
// container's removal. A removed event fails the lease.
func (m *Manager) handleEvent(ctx context.Context, ev runtime.Event) {
	switch ev.Kind {
	case runtime.EventOOM:
		m.mu.Lock()
		m.oomEvents++
		m.mu.Unlock()
		m.log.Info("a process in a sandbox was OOM-killed; the sandbox lives on", "lease_id", ev.LeaseID, "container_id", ev.ID)
		return
	case runtime.EventDied, runtime.EventRemoved:
		if m.poolEvent(ctx, ev) { // an unclaimed pooled sandbox (pool.go)
			return
		}
	default:
		return
	}
	find := func() *entry {
		e := m.leases[ev.LeaseID]
		if e == nil && ev.LeaseID == "" {
			for _, x := range m.leases {
				if x.l.ContainerID == ev.ID {
					e = x
					break
				}
			}
		}
		if e == nil || e.l.State != StateReady || e.l.ContainerID != ev.ID || !m.homeLocked(e) {
			return nil
		}
		return e
	}
	m.mu.Lock()
	e := find()
	m.mu.Unlock()
	if e == nil {
		return
	}
	// Another replica may have released or expired it (and removed its
	// sandbox) with the feed still on its way (replicas.go).
	m.refreshShared(ev.LeaseID)
	reason, after := ReasonRemovedOutside, ""
	if ev.Kind == runtime.EventDied {
		oom := false
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		sb, err := m.rt.Get(gctx, ev.ID)
		cancel()
		if err == nil {
			if alive(sb) {
				return // a stale event: it runs again (restarted already)
			}
			oom = sb.OOMKilled
		}
		reason, after = exitText(ev.ExitCode, oom)
	}
	m.mu.Lock()
	if e = find(); e == nil {
		m.mu.Unlock()
		return
	}
	var job restartJob
	restart := false
	switch ev.Kind {
	case runtime.EventRemoved:
		_ = m.transitionLocked(e, StateFailed, reason)
		e.l.Cleaned = true
	default:
		if job, restart = m.sandboxExitedLocked(e, ev.ID, reason, after); !restart {
			m.enqueueCleanLocked(e)
		}
		job.settle = true
	}
	l, rev := e.snapshot()
	m.mu.Unlock()
	_ = m.persist(l, rev)
	if restart {
		m.goRestart(ctx, job)
	}
}

// resync compares READY leases with the runtime's containers, failing those
// whose container is gone or dead (PAUSED leases: gone, or found running —
// paused again), and removes containers of this instance
// that no live lease owns (orphans). Leases that became READY after the
// list was taken are left for the next resync.
func (m *Manager) resync(ctx context.Context) {
	m.mu.Lock()
	seq := m.seq
	m.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, m.cfg.RemoveTimeout)
	boxes, err := m.rt.List(lctx, m.selector())
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("resync: listing containers failed", "err", err)
		}
		return
	}
	byID := make(map[string]runtime.Sandbox, len(boxes))
	for _, sb := range boxes {
		byID[sb.ID] = sb
	}
	var snaps []snap
	var orphans []runtime.Sandbox
	var restarts []restartJob
	var fixes []pauseFix
	m.mu.Lock()
	for _, e := range m.leases {
		if !m.homeLocked(e) {
			continue // its home replica resyncs it (replicas.go)
		}
		if e.l.State == StatePaused {
			if e.pause != nil || e.readySeq > seq {
				continue // pausing or resuming, or paused after the list
			}
			sb, ok := byID[e.l.ContainerID]
			switch {
			case !ok:
				_ = m.transitionLocked(e, StateFailed, ReasonVanished)
				m.enqueueCleanLocked(e)
				l, rev := e.snapshot()
				snaps = append(snaps, snap{l, rev})
			case sb.State == runtime.StateRunning:
				// Started by a resume of a process that died (the engine
				// finished it after reconcile), or from outside.
				fixes = append(fixes, m.pauseFixLocked(e, sb.ID))
			}
			continue
		}
		if e.l.State != StateReady || e.readySeq > seq || e.pause != nil {
			continue
		}
		sb, ok := byID[e.l.ContainerID]
		switch {
		case !ok:
			_ = m.transitionLocked(e, StateFailed, ReasonVanished)
			m.enqueueCleanLocked(e)
		case !alive(sb):
			// Exited without an event reaching us (e.g. the engine
			// restarted): restart it in place within the budget.
			why, after := deadText(sb)
			if j, ok := m.sandboxExitedLocked(e, sb.ID, why, after); ok {
				restarts = append(restarts, j)
			} else {
				m.enqueueCleanLocked(e)
			}
		default:
			continue
		}
		l, rev := e.snapshot()
		snaps = append(snaps, snap{l, rev})
	}
	poolGone := m.resyncPoolsLocked(byID, seq) // pool.go
	for _, sb := range boxes {
		e := m.leases[sb.LeaseID]
		switch {
		case e == nil && m.pooledLocked(sb):
			continue // an unclaimed pooled sandbox, ready or being created
		case e == nil:
		case e.l.State == StatePending, e.l.State == StateReady && (e.l.ContainerID == sb.ID || e.readySeq > seq),
			e.l.State == StatePaused && e.l.ContainerID == sb.ID:
			continue // being created, in use, or paused
		case e.needsClean():
			continue // its own removal is under way, or it is kept (keptLocked)
		}
		orphans = append(orphans, sb)
	}
	m.mu.Unlock()
	m.persistAll(snaps)
	for _, mb := range poolGone {
		_ = m.dropMember(ctx, mb)
	}
	m.applyPauseFixes(ctx, fixes)
	for _, j := range restarts {
		m.goRestart(ctx, j)
	}
	for _, sb := range orphans {
		rctx, cancel := detached(ctx, m.cfg.RemoveTimeout)
		err := m.rt.Remove(rctx, sb.ID)
		cancel()
		if err != nil {
			m.log.Warn("resync: removing orphan container failed", "lease_id", sb.LeaseID, "container_id", sb.ID, "err", err)
			continue
		}
		m.log.Info("resync: removed orphan container", "lease_id", sb.LeaseID, "container_id", sb.ID)
	}
}
