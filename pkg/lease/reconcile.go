package lease

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
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

// controllerHost is what the controller needs from the Manager
// (implemented by *Manager). Its Locked methods are called with the
// Manager's mu held.
type controllerHost interface {
	// now is the lease clock (manager.go).
	now() time.Time
	// transitionLocked moves e to a state, transitionPhaseLocked to a
	// state in a phase, setPhaseLocked changes its phase within its state
	// (manager.go).
	transitionLocked(e *entry, to State, reason string) error
	transitionPhaseLocked(e *entry, to State, p Phase, reason string) error
	setPhaseLocked(e *entry, p Phase) error
	// persist and persistAll write records (manager.go).
	persist(l Lease, rev uint64) error
	persistAll(snaps []snap)
	// endOpLocked gives e back from an operation (work.go).
	endOpLocked(e *entry, o *op, err error)
}

// controller keeps the lease records and the runtime's containers
// agreeing (plan.go says how): Start's reconcile, the runtime's event
// stream and the periodic resync, the work queue's workers (work.go) and
// the removal of a lease's sandbox (cleanup). It shares the Manager's mu
// and leases map, and reads its seq (bumped when a lease becomes READY or
// PAUSED) with mu held.
type controller struct {
	cfg  Config
	host controllerHost
	rt   Runtime
	log  *slog.Logger

	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, guarded by mu
	seq    *uint64           // the Manager's, guarded by mu
	queue  *workQueue

	fleet     *fleet
	pools     *poolSet
	disk      *diskEnforcer
	restarter *restarter
	pauser    *pauser
	vols      *volumeKeeper
	network   *networkKeeper

	// watchDown is set while the runtime's event stream is down (closed,
	// or Watch failing): the engine may be restarting (restart.go).
	watchDown atomic.Bool
	// interrupted is set by reconcile when it failed a PENDING lease: the
	// previous process died during a creation, which may still finish in
	// the engine after reconcile (see watchLoop). Guarded by mu.
	interrupted bool
	// oomEvents counts the runtime's oom events (a process of a sandbox
	// was OOM-killed; the lease lives on). Guarded by mu.
	oomEvents uint64
}

func alive(sb runtime.Sandbox) bool {
	return sb.State == runtime.StateRunning || sb.State == runtime.StatePaused
}

func (c *controller) selector() runtime.Selector {
	return runtime.Selector{runtime.LabelInstance: c.cfg.InstanceID}
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
func (c *controller) reconcile(ctx context.Context) error {
	boxes, err := c.rt.List(ctx, c.selector())
	if err != nil {
		return wrapf(err, "lease manager: reconcile: list containers")
	}
	byLease := map[string][]runtime.Sandbox{}
	for _, sb := range boxes {
		byLease[sb.LeaseID] = append(byLease[sb.LeaseID], sb)
	}
	keep := map[string]bool{}
	var fx effects
	unconfigured := c.pools.unconfiguredClaims(ctx, byLease) // pool.go

	c.mu.Lock()
	now := c.host.now()
	for _, e := range c.leases {
		if !c.fleet.homeLocked(e) {
			continue // another replica's (replicas.go)
		}
		a := plan(&e.l, observed{
			trigger:      trigStartup,
			boxes:        byLease[e.l.ID],
			unconfigured: unconfigured[e.l.ID],
			kept:         c.disk.keptLocked(e, now),
		}, c.cfg.Restart.policy(), now)
		if e.l.Phase == PhaseClaiming { // only ever in a record (pool.go)
			_ = c.host.setPhaseLocked(e, PhaseNone)
		}
		for _, sb := range a.keep {
			keep[sb.ID] = true
		}
		c.applyLocked(e, a, trigStartup, &fx)
	}
	// Unclaimed pooled sandboxes (a pool label, no lease record) are
	// adopted back into their pools, or removed below (pool.go).
	for id := range c.pools.adoptLocked(boxes) {
		keep[id] = true
	}
	c.restarter.queueLocked(fx.restarts) // restart.go
	c.mu.Unlock()
	c.pauser.applyPauseFixes(ctx, fx.fixes)

	// Remove every container that is not kept.
	var (
		mu     sync.Mutex
		failed = map[string]bool{} // lease ids with a container left behind
		wg     sync.WaitGroup
		sem    = make(chan struct{}, c.cfg.ReapConcurrency)
	)
	for _, sb := range boxes {
		if keep[sb.ID] {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := c.removeBox(ctx, "reconcile", sb); err != nil {
				mu.Lock()
				failed[sb.LeaseID] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	var snaps []snap
	c.mu.Lock()
	for id, e := range c.leases {
		switch {
		case !c.fleet.homeLocked(e):
			continue // another replica's (replicas.go)
		case failed[id]:
			// left for the reaper (RELEASING or ended and uncleaned)
		case c.disk.keptLocked(e, c.host.now()):
			// its stopped container is kept until its time is up
		case e.l.State == StateReleasing:
			_ = c.host.transitionLocked(e, StateReleased, e.l.Reason)
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
	c.mu.Unlock()
	c.host.persistAll(snaps)
	return nil
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
func (c *controller) applyLocked(e *entry, a action, t trigger, fx *effects) {
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
			c.interrupted = c.interrupted || startup
			c.log.Info("adopted paused lease", "lease_id", e.l.ID, "container_id", a.box.ID, "mode", string(e.l.Paused))
		} else {
			*c.seq++
			e.readySeq = *c.seq
			c.log.Info("adopted lease", "lease_id", e.l.ID, "container_id", a.box.ID, "endpoint", e.l.Endpoint)
		}
	case actRestart:
		e.l.ContainerID = a.box.ID
		_ = c.host.transitionPhaseLocked(e, StatePending, PhaseRestarting, a.reason)
		fx.restarts = append(fx.restarts, c.restarter.beginLocked(e, a, t == trigEvent))
	case actResumeRestart:
		fx.restarts = append(fx.restarts, c.restarter.beginLocked(e, a, false))
		changed = false
	case actFail:
		if e.l.State == StatePending && startup {
			// The creation may still finish in the engine (watchLoop).
			c.interrupted = true
		}
		_ = c.host.transitionLocked(e, StateFailed, a.reason)
		if !startup { // at startup, reconcile removes what is left itself
			c.queue.addRemovalLocked(e)
		}
	case actRepause:
		e.l.ContainerID = a.box.ID
		e.rev++
		c.interrupted = c.interrupted || startup
		fx.fixes = append(fx.fixes, c.pauser.pauseFixLocked(e, a.box.ID))
	case actFreezeLost:
		e.l.ContainerID = a.box.ID
		e.l.Paused = PauseHibernate
		c.interrupted = c.interrupted || startup
		_ = c.host.transitionLocked(e, StatePaused, ReasonFreezeLost)
	case actClean:
		changed = false
		if !startup && !time.Now().Before(e.retryAt) {
			c.queue.addRemovalLocked(e)
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
func (c *controller) run(ctx context.Context, pass string, fx effects) {
	c.host.persistAll(fx.snaps)
	c.pauser.applyPauseFixes(ctx, fx.fixes)
	for _, j := range fx.restarts {
		c.restarter.goRun(ctx, j)
	}
	for _, sb := range fx.remove {
		_ = c.removeBox(ctx, pass, sb)
	}
}

// removeBox removes one container no lease keeps, logging the outcome.
func (c *controller) removeBox(ctx context.Context, pass string, sb runtime.Sandbox) error {
	rctx, cancel := detached(ctx, c.cfg.RemoveTimeout)
	defer cancel()
	if err := c.rt.Remove(rctx, sb.ID); err != nil {
		c.log.Warn(pass+": removing container failed; will retry", "lease_id", sb.LeaseID, "container_id", sb.ID, "err", err)
		return err
	}
	c.log.Info(pass+": removed container", "lease_id", sb.LeaseID, "container_id", sb.ID)
	return nil
}

// watchLoop follows the runtime's events until ctx ends. When the event
// channel closes or Watch fails it re-subscribes with backoff (100ms doubling
// to 10s) and resyncs after every (re)subscription, so events missed in
// between are caught; while Watch keeps failing, those resyncs are the
// polling fallback. It also resyncs every ResyncInterval.
func (c *controller) watchLoop(ctx context.Context) {
	const minBackoff, maxBackoff = 100 * time.Millisecond, 10 * time.Second
	bo := minBackoff
	resyncT := time.NewTicker(c.cfg.ResyncInterval)
	defer resyncT.Stop()
	// A creation the previous process had in flight when it died may still
	// finish in the engine after reconcile and the first resync listed the
	// containers (the engine keeps creating after its client is gone): when
	// reconcile found one, resync again 1s and 5s after start rather than
	// leave its container to the next periodic resync.
	var settle *time.Timer
	var settleC <-chan time.Time
	settleAfter := []time.Duration{time.Second, 4 * time.Second}
	c.mu.Lock()
	interrupted := c.interrupted
	c.mu.Unlock()
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
		ch, err := c.rt.Watch(ctx)
		c.watchDown.Store(err != nil)
		if err != nil {
			c.log.Warn("watching runtime events failed; polling", "err", err, "retry_in", bo)
			c.resync(ctx)
			if !sleep() {
				return
			}
			continue
		}
		c.resync(ctx)
		since := time.Now()
	events:
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-ch:
				if !ok {
					c.watchDown.Store(true)
					break events
				}
				c.handleEvent(ctx, ev)
			case <-resyncT.C:
				c.resync(ctx)
			case <-settleC:
				c.resync(ctx)
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
		c.log.Warn("runtime event watch ended; re-subscribing", "retry_in", bo)
		if !sleep() {
			return
		}
	}
}

// handleEvent acts on the runtime's events. An oom event (the kernel killed
// a process of the sandbox; the agent reports it to the command's caller)
// is only logged and counted: the sandbox lives on. A died or removed
// event of a lease's container queues the lease for a worker (work.go),
// which looks at it (check): events never wait for a runtime call here,
// and two events of one lease are handled one after the other.
func (c *controller) handleEvent(ctx context.Context, ev runtime.Event) {
	switch ev.Kind {
	case runtime.EventOOM:
		c.mu.Lock()
		c.oomEvents++
		c.mu.Unlock()
		c.log.Info("a process in a sandbox was OOM-killed; the sandbox lives on", "lease_id", ev.LeaseID, "container_id", ev.ID)
		return
	case runtime.EventDied, runtime.EventRemoved:
		if c.pools.event(ctx, ev) { // an unclaimed pooled sandbox (pool.go)
			return
		}
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := ev.LeaseID
	if id == "" {
		for _, x := range c.leases {
			if x.l.ContainerID == ev.ID {
				id = x.l.ID
				break
			}
		}
	}
	e := c.leases[id]
	if e == nil || !c.fleet.homeLocked(e) || e.l.State.Ended() && e.l.Cleaned {
		return
	}
	if e.event == nil || ev.Kind == runtime.EventRemoved { // a removal says more than a death
		e.event = &ev
	}
	c.markDirtyLocked(e)
}

// check looks at lease id as it is now and applies plan's decision: it
// lists the lease's containers (a died container of a READY lease is
// restarted in place within the restart budget, after
// RestartConfig.Delay and once the event stream is up, else the lease
// fails; a missing one fails it). ev is the runtime event that made it
// look, nil when a pass found the lease held by an operation: a removed
// event fails the lease as removed outside berth, and the event's own
// container is read directly. A stale event — the container runs again —
// changes nothing. A worker calls it (work.go), never two at once for one
// lease.
func (c *controller) check(ctx context.Context, id string, ev *runtime.Event) {
	c.mu.Lock()
	e := c.leases[id]
	if e == nil || !c.fleet.homeLocked(e) || e.l.State.Ended() && e.l.Cleaned {
		c.mu.Unlock()
		return
	}
	seq := *c.seq
	c.mu.Unlock()
	// Another replica may have released or expired it (and removed its
	// sandbox) with the feed still on its way (replicas.go).
	c.fleet.refreshShared(id)
	o := observed{trigger: trigResync}
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	boxes, err := c.rt.List(gctx, runtime.Selector{runtime.LabelInstance: c.cfg.InstanceID, runtime.LabelLease: id})
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("listing a lease's containers failed; the next resync looks again", "lease_id", id, "err", err)
		}
		if ev == nil {
			return // nothing observed: the next resync looks again
		}
	}
	o.boxes = boxes
	if ev != nil {
		o.trigger = trigEvent
		// The engine's list may lag behind its events (Docker updates the
		// view it lists from after it emits die): the event's own
		// container is read directly.
		gctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		sb, gerr := c.rt.Get(gctx, ev.ID)
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
	}
	var fx effects
	c.mu.Lock()
	switch e = c.leases[id]; {
	case e == nil:
		c.mu.Unlock()
		return
	case e.op != nil:
		// An operation took it meanwhile: look again when it ends.
		if ev != nil && e.event == nil {
			e.event = ev
		}
		c.markDirtyLocked(e)
		c.mu.Unlock()
		return
	}
	o.stale, o.kept = e.readySeq > seq, c.disk.keptLocked(e, c.host.now())
	if o.kept || (e.l.State.Ended() || e.l.State == StateReleasing) && ev != nil && ev.Kind == runtime.EventDied {
		// A died event of a lease on its way out is its removal's.
		c.mu.Unlock()
		return
	}
	c.applyLocked(e, plan(&e.l, o, c.cfg.Restart.policy(), c.host.now()), o.trigger, &fx)
	c.mu.Unlock()
	pass := "check"
	if ev != nil {
		pass = "event"
	}
	c.run(ctx, pass, fx)
}

// resync lists this instance's containers and applies plan's decision to
// every lease that no operation holds — one that is held is marked dirty,
// and looked at again when its operation ends (work.go) — (a lease whose container is gone
// fails, a dead one is restarted in place, a PAUSED one found running is
// paused again), and removes the containers that no live lease or pool
// owns (orphans). Leases that became READY or PAUSED after the list was
// taken are left for the next resync.
func (c *controller) resync(ctx context.Context) {
	c.mu.Lock()
	seq := *c.seq
	c.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, c.cfg.RemoveTimeout)
	boxes, err := c.rt.List(lctx, c.selector())
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("resync: listing containers failed", "err", err)
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
	c.mu.Lock()
	now := c.host.now()
	for _, e := range c.leases {
		if !c.fleet.homeLocked(e) {
			continue // its home replica resyncs it (replicas.go)
		}
		if e.op != nil {
			// An operation holds it: look again when it ends (work.go).
			c.markDirtyLocked(e)
			continue
		}
		o := observed{
			trigger: trigResync,
			boxes:   byLease[e.l.ID],
			stale:   e.readySeq > seq,
			kept:    c.disk.keptLocked(e, now),
		}
		c.applyLocked(e, plan(&e.l, o, c.cfg.Restart.policy(), now), trigResync, &fx)
	}
	poolGone := c.pools.resyncLocked(byID, seq) // pool.go
	for _, sb := range boxes {
		if c.leases[sb.LeaseID] == nil && !c.pools.pooledLocked(sb) {
			fx.remove = append(fx.remove, sb) // no lease, no pool: an orphan
		}
	}
	c.mu.Unlock()
	for _, mb := range poolGone {
		_ = c.pools.dropMember(ctx, mb)
	}
	c.run(ctx, "resync", fx)
}
