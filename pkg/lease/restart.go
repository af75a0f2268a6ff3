package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// RestartConfig configures the in-place restart of a sandbox whose
// container exited unexpectedly (restart.go). Zero fields take the
// defaults (DefaultRestartConfig).
type RestartConfig struct {
	// Limit is how many times a lease's sandbox is restarted in place
	// (same container, files kept) after its container exited
	// unexpectedly, within Window; one more exit within the window fails
	// the lease. Default 3; negative never restarts (the first exit fails
	// the lease). At most MaxTransitions/2-1 (31): restarts are counted in
	// the kept transitions; larger values are lowered to it.
	Limit int
	// Window is the sliding window Limit counts restarts in. Default 10m.
	Window time.Duration
	// Delay is how long after a container's died event its restart
	// begins. An engine that is shutting down (and stopping every
	// container) closes its event stream within it; the restart then
	// waits until the runtime's event stream is back, i.e. the engine is
	// up again, rather than start a container in an engine going down.
	// Default 2s.
	Delay time.Duration
}

// DefaultRestartConfig returns the in-place restart defaults: 3 restarts
// within 10m, each begun 2s after its container's died event.
func DefaultRestartConfig() RestartConfig {
	return RestartConfig{Limit: 3, Window: 10 * time.Minute, Delay: 2 * time.Second}
}

// withDefaults fills c's zero fields from DefaultRestartConfig, lowers
// Limit to MaxTransitions/2-1 and validates c: Window and Delay must not
// be negative (errdefs.ErrInvalidArgument naming restart_window).
func (c RestartConfig) withDefaults() (RestartConfig, error) {
	d := DefaultRestartConfig()
	if c.Limit == 0 {
		c.Limit = d.Limit
	}
	c.Limit = min(c.Limit, MaxTransitions/2-1)
	if c.Window < 0 || c.Delay < 0 {
		return c, errdefs.InvalidArgument("restart_window", "restart window and delay must not be negative")
	}
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.Delay == 0 {
		c.Delay = d.Delay
	}
	return c, nil
}

// Validate reports whether New would accept c (errdefs.ErrInvalidArgument
// naming the field otherwise).
func (c RestartConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// policy is the in-place restart budget plan applies.
func (c RestartConfig) policy() restartPolicy {
	return restartPolicy{limit: c.Limit, window: c.Window}
}

// restartUnreachableFor bounds how long an in-place restart keeps retrying
// while the runtime is unreachable (an engine restarting): the retries do
// not use the restart budget. The lease's expiry also ends them.
const restartUnreachableFor = 5 * time.Minute

// restartAttempts is how many times a restart is tried when the runtime
// answers with another error (an engine in the middle of shutting down may
// refuse a start before its socket goes away): a container that cannot
// start fails its lease after a few seconds, not after minutes.
const restartAttempts = 3

// restartJob is an in-place restart to run: lease e's container cid
// exited; after says how, for the reason of the restarted transition
// ("exit 137").
type restartJob struct {
	e *entry
	// op is the restart's hold on the lease (opRestart, work.go).
	op    *op
	cid   string
	after string
	// settle: wait RestartConfig.Delay, and for the event stream to be up,
	// before restarting (a died event may come from an engine going down).
	settle bool
}

// exitText describes a container exit: why for the READY → PENDING (or
// FAILED) reason ("container exited with code 137"), after for the
// PENDING → READY one ("exit 137"). oom is the engine's OOMKilled flag.
func exitText(code int, oom bool) (why, after string) {
	why, after = fmt.Sprintf("container exited with code %d", code), fmt.Sprintf("exit %d", code)
	if oom {
		// The engine's flag says an OOM kill happened in the container
		// during its life, not that it killed the agent (after a command's
		// OOM kill, a docker kill reports it too): a hint, not a verdict.
		why += " (an OOM kill was reported in it)"
	}
	return why, after
}

// deadText is exitText for a sandbox that is not running.
func deadText(sb runtime.Sandbox) (why, after string) {
	if sb.State == runtime.StateExited {
		return exitText(sb.ExitCode, sb.OOMKilled)
	}
	return fmt.Sprintf("container is %s, not running", sb.State), fmt.Sprintf("container was %s", sb.State)
}

// restartHost is what the restarter needs from the Manager (implemented
// by *Manager): the lease operations around a restart. Its Locked
// methods are called with the Manager's mu held.
type restartHost interface {
	now() time.Time
	transitionLocked(e *entry, to State, reason string) error
	persist(l Lease, rev uint64) error
	// endOpLocked gives the lease back from the restart with its outcome
	// and queues what is left to do, a removal (work.go).
	endOpLocked(e *entry, o *op, err error)
}

// restarter restarts the sandboxes of READY leases whose container exited
// unexpectedly in place (files kept), within the restart budget. Its
// fields below mu are guarded by the Manager's mu, which it shares.
type restarter struct {
	cfg  RestartConfig
	host restartHost
	log  *slog.Logger
	// readyTimeout is Config.ReadyTimeout: it bounds one restart attempt.
	readyTimeout time.Duration
	// goBackground runs a func in the background (Close waits for it).
	goBackground func(func())
	// watchDown is set while the runtime's event stream is down (the
	// Manager's: reconcile.go's watchLoop sets it).
	watchDown *atomic.Bool

	mu *sync.Mutex // the Manager's mu
	// network applies a restarted sandbox's network policy (network.go).
	network *networkKeeper
	// vols starts the container again once its host mounts are checked
	// (volumes.go: restartSandbox).
	vols *volumeKeeper
	// started counts in-place restarts started, failed those that failed.
	started, failed uint64
	// queued are the leases reconcile moved to PENDING for a restart,
	// started by startQueued once the background context exists.
	queued []restartJob
}

// beginLocked marks READY-turned-PENDING lease e as being restarted in
// place on a.box (plan's actRestart or actResumeRestart): the restart
// holds the lease (opRestart, work.go), so acquires of its conversation
// wait for the outcome and removals wait for its end.
// It returns the job the caller runs (goRun) once it has persisted e;
// settle waits RestartConfig.Delay and for the event stream first (a died
// event may come from an engine going down). Called with mu held.
func (r *restarter) beginLocked(e *entry, a action, settle bool) restartJob {
	o := beginOpLocked(e, opRestart)
	r.started++
	return restartJob{e: e, op: o, cid: a.box.ID, after: a.after, settle: settle}
}

// queueLocked keeps jobs for startQueued (reconcile at startup runs
// before the background context exists). Called with mu held.
func (r *restarter) queueLocked(jobs []restartJob) {
	r.queued = append(r.queued, jobs...)
}

// goRun runs j in the background (Close waits for it).
func (r *restarter) goRun(ctx context.Context, j restartJob) {
	r.goBackground(func() { r.run(ctx, j) })
}

// startQueued runs the restarts reconcile found.
func (r *restarter) startQueued(ctx context.Context) {
	r.mu.Lock()
	jobs := r.queued
	r.queued = nil
	r.mu.Unlock()
	for _, j := range jobs {
		r.goRun(ctx, j)
	}
}

// settle waits RestartConfig.Delay and then, while the runtime's event
// stream is down (the engine restarting), until it is back, bounded by
// restartUnreachableFor since began. It reports false when the lease
// stopped waiting for this restart (released meanwhile) or ctx ended.
func (r *restarter) settle(ctx context.Context, e *entry, cid string, began time.Time) bool {
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	if !wait(r.cfg.Delay) {
		return false
	}
	for r.watchDown.Load() && time.Since(began) < restartUnreachableFor {
		r.mu.Lock()
		still := e.l.Phase == PhaseRestarting && e.l.ContainerID == cid
		r.mu.Unlock()
		if !still || !wait(200*time.Millisecond) {
			return false
		}
	}
	return true
}

// run starts j's container again in place (Runtime.Restart: files
// kept, endpoint re-read) once its host mounts are checked
// (restartSandbox: a host mount changed since the acquire fails the lease
// without retrying) and records the outcome: PENDING → READY
// "restarted after exit 137" with Lease.Restarts incremented, or FAILED with
// the error (the container is then removed). While the runtime is
// unreachable it retries with backoff (1s doubling to 5s) for up to
// restartUnreachableFor, other errors up to restartAttempts times; the
// lease's expiry ends the retries. When the Manager shuts
// down first the lease stays PENDING, and the next Start resumes the
// restart. A lease released meanwhile is cleaned up.
func (r *restarter) run(ctx context.Context, j restartJob) {
	e := j.e
	r.mu.Lock()
	id, mounts := e.l.ID, slices.Clone(e.l.Mounts)
	r.mu.Unlock()
	log := r.log.With("lease_id", id, "container_id", j.cid)
	began := time.Now()
	bo := time.Second
	var (
		sb      runtime.Sandbox
		err     error
		attempt int
		retry   bool
	)
	// skipped: released while settling, or shutting down.
	skipped := j.settle && !r.settle(ctx, e, j.cid, began)
	for !skipped {
		// Bounded by the runtime's ReadyTimeout; the extra grace lets its
		// (more precise) timeout error win over ours.
		rctx, cancel := detached(ctx, r.readyTimeout+5*time.Second)
		// volumes.go: the host mounts are checked first.
		sb, err = r.vols.restartSandbox(rctx, id, j.cid, mounts)
		if err == nil { // its address may have changed
			err = r.network.enforce(rctx, id, sb.Endpoint) // network.go
		}
		cancel()
		attempt++
		switch {
		case err == nil || ctx.Err() != nil || errdefs.IsNotFound(err), errors.Is(err, runtime.ErrHostPathChanged):
			// A changed host mount does not change back by retrying.
		case errdefs.IsUnavailable(err) && time.Since(began) < restartUnreachableFor:
			retry = true
		case !errdefs.IsUnavailable(err) && attempt < restartAttempts:
			retry = true
		}
		if !retry {
			break
		}
		retry = false
		r.mu.Lock()
		still := e.l.Phase == PhaseRestarting && e.l.ContainerID == j.cid && r.host.now().Before(e.l.ExpiresAt)
		r.mu.Unlock()
		if !still {
			break
		}
		log.Warn("restarting sandbox failed; retrying", "err", err, "attempt", attempt, "retry_in", bo)
		t := time.NewTimer(bo)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		bo = min(bo*2, 5*time.Second)
	}
	took := time.Since(began)

	// The lease's end queues the removal of what is left (a release while
	// restarting, a failure) for the workers (endOpLocked).
	r.mu.Lock()
	switch {
	case skipped && ctx.Err() != nil && e.l.State == StatePending, err != nil && ctx.Err() != nil && e.l.State == StatePending:
		// Shutting down: the lease stays PENDING; the next Start resumes.
		r.host.endOpLocked(e, j.op, errdefs.Unavailable("lease %s: the lease manager shut down while restarting its sandbox", id))
	case skipped: // released while settling
		r.host.endOpLocked(e, j.op, errNotUsable(&e.l))
	case err == nil && e.l.State == StatePending:
		e.l.ContainerID, e.l.Endpoint = sb.ID, sb.Endpoint
		e.l.Restarts++
		_ = r.host.transitionLocked(e, StateReady, "restarted after "+j.after)
		r.host.endOpLocked(e, j.op, nil)
	case err == nil: // released while restarting
		r.host.endOpLocked(e, j.op, errNotUsable(&e.l))
	default:
		r.failed++
		err = wrapf(err, "lease %s: restart container %s in place", id, j.cid)
		if e.l.State == StatePending {
			_ = r.host.transitionLocked(e, StateFailed, fmt.Sprintf("restart after %s failed: %v", j.after, err))
		}
		r.host.endOpLocked(e, j.op, err)
	}
	l, rev := e.snapshot()
	r.mu.Unlock()
	_ = r.host.persist(l, rev)
	j.op.finish()
	switch {
	case skipped:
		log.Info("in-place restart abandoned before it began", "state", l.State.String())
	case err != nil:
		log.Warn("in-place restart of sandbox failed", "err", err, "duration", took)
	default:
		log.Info("sandbox restarted in place", "endpoint", sb.Endpoint, "restarts", l.Restarts, "duration", took)
	}
}
