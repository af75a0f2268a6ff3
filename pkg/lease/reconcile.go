package lease

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
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
// It runs once in Start, before any client call is accepted. What happens
// to each lease is plan's decision (plan.go), the same rules the event
// stream and resync apply; at startup nothing of this process is in
// progress, so:
//
//   - READY with a running container: adopted (container id and endpoint
//     refreshed from the runtime); with a dead one: restarted in place
//     within the restart budget; with none: FAILED
//     (ReasonVanishedWhileDown); a READY record a warm claim wrote while
//     its agent was being configured (PhaseClaiming) fails when the agent
//     was not configured (pool.go);
//   - PENDING: FAILED (ReasonRestartedCreating) — a half-created sandbox
//     is not trusted — unless it was being restarted in place
//     (PhaseRestarting) and its container is there: the restart goes on;
//   - PAUSED: its container is kept and brought back to the paused state
//     the lease records (frozen, or stopped when hibernated) — it is never
//     treated as dead; a frozen container found stopped makes the lease
//     hibernated (ReasonFreezeLost); a missing one fails it;
//   - RELEASING: the release is finished (RELEASED);
//   - a container with a pool label and no lease record is an unclaimed
//     pooled sandbox: adopted back into its pool when it runs and the pool
//     is still configured with the same profile (pool.go);
//   - every container that no lease or pool keeps — those of the leases
//     above, of ended leases, and orphans with no lease at all — is
//     removed.
//
// Ended leases whose containers are all gone are marked Cleaned; a removal
// that fails leaves its lease uncleaned (or RELEASING) for the reaper.
func (m *Manager) reconcile(ctx context.Context) error {
	boxes, err := m.rt.List(ctx, m.selector())
	if err != nil {
		return wrapf(err, "lease manager: reconcile: list containers")
	}
	byLease := map[string][]runtime.Sandbox{}
	for _, sb := range boxes {
		byLease[sb.LeaseID] = append(byLease[sb.LeaseID], sb)
	}
	keep := map[string]bool{}
	var fx effects
	unconfigured := m.pools.unconfiguredClaims(ctx, byLease) // pool.go

	m.mu.Lock()
	now := m.now()
	for _, e := range m.leases {
		if !m.fleet.homeLocked(e) {
			continue // another replica's (replicas.go)
		}
		a := plan(&e.l, observed{
			trigger:      trigStartup,
			boxes:        byLease[e.l.ID],
			unconfigured: unconfigured[e.l.ID],
			kept:         m.disk.keptLocked(e, now),
		}, m.cfg.Restart.policy(), now)
		if e.l.Phase == PhaseClaiming { // only ever in a record (pool.go)
			_ = m.setPhaseLocked(e, PhaseNone)
		}
		for _, sb := range a.keep {
			keep[sb.ID] = true
		}
		m.applyLocked(e, a, trigStartup, &fx)
	}
	// Unclaimed pooled sandboxes (a pool label, no lease record) are
	// adopted back into their pools, or removed below (pool.go).
	for id := range m.pools.adoptLocked(boxes) {
		keep[id] = true
	}
	m.restarter.queueLocked(fx.restarts) // restart.go
	m.mu.Unlock()
	m.pauser.applyPauseFixes(ctx, fx.fixes)

	// Remove every container that is not kept.
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
			if err := m.removeBox(ctx, "reconcile", sb); err != nil {
				mu.Lock()
				failed[sb.LeaseID] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	var snaps []snap
	m.mu.Lock()
	for id, e := range m.leases {
		switch {
		case !m.fleet.homeLocked(e):
			continue // another replica's (replicas.go)
		case failed[id]:
			// left for the reaper (RELEASING or ended and uncleaned)
		case m.disk.keptLocked(e, m.now()):
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

// busyLocked reports whether an operation of this process holds e: a
// creation or claim, an in-place restart, a pause or resume, a removal.
// Called with mu held.
func (e *entry) busyLocked() bool {
	return e.call != nil || e.claim != nil || e.pause != nil || e.cleaning != nil
}

// effects is the work an applied action leaves to do once mu is released.
type effects struct {
	restarts []restartJob
	fixes    []pauseFix
	remove   []runtime.Sandbox
	snaps    []snap
}

// applyLocked carries out plan's action a on lease e, found by trigger t:
// the record changes now, under mu; runtime calls are added to fx for the
// caller to make once it has released mu and persisted fx.snaps. At
// startup, reconcile removes every container no lease keeps itself, so
// removals are not added. Called with mu held.
func (m *Manager) applyLocked(e *entry, a action, t trigger, fx *effects) {
	startup := t == trigStartup
	changed := true
	switch a.kind {
	case actNone:
		changed = false
	case actAdopt:
		e.l.ContainerID = a.box.ID
		if a.box.Endpoint != "" {
			e.l.Endpoint = a.box.Endpoint
		}
		e.rev++
		if e.l.State == StatePaused {
			// A resume the previous process had in flight may still start
			// the container after this list: the resyncs 1s and 5s after
			// start catch it (watchLoop).
			m.interrupted = m.interrupted || startup
			m.log.Info("adopted paused lease", "lease_id", e.l.ID, "container_id", a.box.ID, "mode", string(e.l.Paused))
		} else {
			m.seq++
			e.readySeq = m.seq
			m.log.Info("adopted lease", "lease_id", e.l.ID, "container_id", a.box.ID, "endpoint", e.l.Endpoint)
		}
	case actRestart:
		e.l.ContainerID = a.box.ID
		_ = m.transitionPhaseLocked(e, StatePending, PhaseRestarting, a.reason)
		fx.restarts = append(fx.restarts, m.restarter.beginLocked(e, a, t == trigEvent))
	case actResumeRestart:
		fx.restarts = append(fx.restarts, m.restarter.beginLocked(e, a, false))
		changed = false
	case actFail:
		if e.l.State == StatePending && startup {
			// The creation may still finish in the engine (watchLoop).
			m.interrupted = true
		}
		_ = m.transitionLocked(e, StateFailed, a.reason)
		if !startup { // at startup, reconcile removes what is left itself
			m.enqueueCleanLocked(e)
		}
	case actRepause:
		e.l.ContainerID = a.box.ID
		e.rev++
		m.interrupted = m.interrupted || startup
		fx.fixes = append(fx.fixes, m.pauser.pauseFixLocked(e, a.box.ID))
	case actFreezeLost:
		e.l.ContainerID = a.box.ID
		e.l.Paused = PauseHibernate
		m.interrupted = m.interrupted || startup
		_ = m.transitionLocked(e, StatePaused, ReasonFreezeLost)
	case actClean:
		changed = false
		if !startup && !time.Now().Before(e.retryAt) {
			m.enqueueCleanLocked(e)
		}
	}
	if !startup && a.kind != actFail && a.kind != actClean {
		// A failed or ended lease's containers go through its removal
		// (cleanup); the others' strays are removed now.
		fx.remove = append(fx.remove, a.remove...)
	}
	if changed && !startup {
		l, rev := e.snapshot()
		fx.snaps = append(fx.snaps, snap{l, rev})
	}
}

// run makes the runtime calls fx holds, after persisting its records.
func (m *Manager) run(ctx context.Context, pass string, fx effects) {
	m.persistAll(fx.snaps)
	m.pauser.applyPauseFixes(ctx, fx.fixes)
	for _, j := range fx.restarts {
		m.restarter.goRun(ctx, j)
	}
	for _, sb := range fx.remove {
		_ = m.removeBox(ctx, pass, sb)
	}
}

// removeBox removes one container no lease keeps, logging the outcome.
func (m *Manager) removeBox(ctx context.Context, pass string, sb runtime.Sandbox) error {
	rctx, cancel := detached(ctx, m.cfg.RemoveTimeout)
	defer cancel()
	if err := m.rt.Remove(rctx, sb.ID); err != nil {
		m.log.Warn(pass+": removing container failed; will retry", "lease_id", sb.LeaseID, "container_id", sb.ID, "err", err)
		return err
	}
	m.log.Info(pass+": removed container", "lease_id", sb.LeaseID, "container_id", sb.ID)
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

// handleEvent acts on the runtime's events. An oom event (the kernel killed
// a process of the sandbox; the agent reports it to the command's caller)
// is only logged and counted: the sandbox lives on. A died or removed
// event makes the controller look at the lease it concerns: it lists the
// lease's containers as they are now and applies plan's decision (a died
// container of a READY lease is restarted in place within the restart
// budget, after RestartConfig.Delay and once the event stream is up, else
// the lease fails; a removed one fails the lease). A stale event — the
// container runs again — changes nothing.
func (m *Manager) handleEvent(ctx context.Context, ev runtime.Event) {
	switch ev.Kind {
	case runtime.EventOOM:
		m.mu.Lock()
		m.oomEvents++
		m.mu.Unlock()
		m.log.Info("a process in a sandbox was OOM-killed; the sandbox lives on", "lease_id", ev.LeaseID, "container_id", ev.ID)
		return
	case runtime.EventDied, runtime.EventRemoved:
		if m.pools.event(ctx, ev) { // an unclaimed pooled sandbox (pool.go)
			return
		}
	default:
		return
	}
	m.mu.Lock()
	id := ev.LeaseID
	if id == "" {
		for _, x := range m.leases {
			if x.l.ContainerID == ev.ID {
				id = x.l.ID
				break
			}
		}
	}
	e := m.leases[id]
	if e == nil || !m.fleet.homeLocked(e) || e.l.State.Ended() && e.l.Cleaned {
		m.mu.Unlock()
		return
	}
	seq := m.seq
	m.mu.Unlock()
	// Another replica may have released or expired it (and removed its
	// sandbox) with the feed still on its way (replicas.go).
	m.fleet.refreshShared(id)
	o := observed{trigger: trigEvent}
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	boxes, err := m.rt.List(gctx, runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID, runtime.LabelLease: id})
	cancel()
	if err == nil {
		o.boxes = boxes
	}
	// The engine's list may lag behind its events (Docker updates the view
	// it lists from after it emits die): the event's own container is
	// read directly.
	gctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	sb, gerr := m.rt.Get(gctx, ev.ID)
	cancel()
	o.boxes = slices.DeleteFunc(o.boxes, func(b runtime.Sandbox) bool { return b.ID == ev.ID })
	switch {
	case gerr == nil:
		o.boxes = append(o.boxes, sb)
	case errdefs.IsNotFound(gerr):
	case ev.Kind == runtime.EventDied: // what the event says, then
		o.boxes = append(o.boxes, runtime.Sandbox{ID: ev.ID, LeaseID: id, State: runtime.StateExited, ExitCode: ev.ExitCode})
	}
	if ev.Kind == runtime.EventRemoved {
		o.goneReason = ReasonRemovedOutside
	}
	var fx effects
	m.mu.Lock()
	if e = m.leases[id]; e == nil {
		m.mu.Unlock()
		return
	}
	o.busy, o.stale, o.kept = e.busyLocked(), e.readySeq > seq, m.disk.keptLocked(e, m.now())
	if o.kept || (e.l.State.Ended() || e.l.State == StateReleasing) && ev.Kind == runtime.EventDied {
		// A died event of a lease on its way out is its removal's.
		m.mu.Unlock()
		return
	}
	m.applyLocked(e, plan(&e.l, o, m.cfg.Restart.policy(), m.now()), trigEvent, &fx)
	m.mu.Unlock()
	m.run(ctx, "event", fx)
}

// resync lists this instance's containers and applies plan's decision to
// every lease that no operation holds (a lease whose container is gone
// fails, a dead one is restarted in place, a PAUSED one found running is
// paused again), and removes the containers that no live lease or pool
// owns (orphans). Leases that became READY or PAUSED after the list was
// taken are left for the next resync.
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
	byLease := map[string][]runtime.Sandbox{}
	for _, sb := range boxes {
		byID[sb.ID] = sb
		byLease[sb.LeaseID] = append(byLease[sb.LeaseID], sb)
	}
	var fx effects
	m.mu.Lock()
	now := m.now()
	for _, e := range m.leases {
		if !m.fleet.homeLocked(e) {
			continue // its home replica resyncs it (replicas.go)
		}
		o := observed{
			trigger: trigResync,
			boxes:   byLease[e.l.ID],
			busy:    e.busyLocked(),
			stale:   e.readySeq > seq,
			kept:    m.disk.keptLocked(e, now),
		}
		m.applyLocked(e, plan(&e.l, o, m.cfg.Restart.policy(), now), trigResync, &fx)
	}
	poolGone := m.pools.resyncLocked(byID, seq) // pool.go
	for _, sb := range boxes {
		if m.leases[sb.LeaseID] == nil && !m.pools.pooledLocked(sb) {
			fx.remove = append(fx.remove, sb) // no lease, no pool: an orphan
		}
	}
	m.mu.Unlock()
	for _, mb := range poolGone {
		_ = m.pools.dropMember(ctx, mb)
	}
	m.run(ctx, "resync", fx)
}
