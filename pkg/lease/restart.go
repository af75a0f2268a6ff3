package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

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
	e     *entry
	cid   string
	after string
	// settle: wait Config.RestartDelay, and for the event stream to be up,
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

// beginRestartLocked marks READY-turned-PENDING lease e as being
// restarted in place on a.box (plan's actRestart or actResumeRestart):
// acquires of its conversation wait for the outcome (e.call) and removals
// leave it alone. It returns the job the caller runs (goRestart) once it
// has persisted e; settle waits Config.RestartDelay and for the event
// stream first (a died event may come from an engine going down). Called
// with mu held.
func (m *Manager) beginRestartLocked(e *entry, a action, settle bool) restartJob {
	e.call = &acquireCall{done: make(chan struct{})}
	m.restarts++
	return restartJob{e: e, cid: a.box.ID, after: a.after, settle: settle}
}

// goRestart runs j in the background (Close waits for it).
func (m *Manager) goRestart(ctx context.Context, j restartJob) {
	m.goBackground(func() { m.restart(ctx, j) })
}

// startReconciledRestarts runs the restarts reconcile found.
func (m *Manager) startReconciledRestarts(ctx context.Context) {
	m.mu.Lock()
	jobs := m.toRestart
	m.toRestart = nil
	m.mu.Unlock()
	for _, j := range jobs {
		m.goRestart(ctx, j)
	}
}

// settle waits Config.RestartDelay and then, while the runtime's event
// stream is down (the engine restarting), until it is back, bounded by
// restartUnreachableFor since began. It reports false when the lease
// stopped waiting for this restart (released meanwhile) or ctx ended.
func (m *Manager) settle(ctx context.Context, e *entry, cid string, began time.Time) bool {
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
	if !wait(m.cfg.RestartDelay) {
		return false
	}
	for m.watchDown.Load() && time.Since(began) < restartUnreachableFor {
		m.mu.Lock()
		still := e.l.State == StatePending && e.l.ContainerID == cid
		m.mu.Unlock()
		if !still || !wait(200*time.Millisecond) {
			return false
		}
	}
	return true
}

// restart starts j's container again in place (Runtime.Restart: files
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
func (m *Manager) restart(ctx context.Context, j restartJob) {
	e := j.e
	m.mu.Lock()
	id, mounts := e.l.ID, slices.Clone(e.l.Mounts)
	m.mu.Unlock()
	log := m.log.With("lease_id", id, "container_id", j.cid)
	began := time.Now()
	bo := time.Second
	var (
		sb      runtime.Sandbox
		err     error
		attempt int
		retry   bool
	)
	// skipped: released while settling, or shutting down.
	skipped := j.settle && !m.settle(ctx, e, j.cid, began)
	for !skipped {
		// Bounded by the runtime's ReadyTimeout; the extra grace lets its
		// (more precise) timeout error win over ours.
		rctx, cancel := detached(ctx, m.cfg.ReadyTimeout+5*time.Second)
		// volumes.go: the host mounts are checked first.
		sb, err = m.restartSandbox(rctx, id, j.cid, mounts)
		if err == nil { // its address may have changed
			err = m.enforceNetwork(rctx, id, sb.Endpoint) // network.go
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
		m.mu.Lock()
		still := e.l.State == StatePending && e.l.ContainerID == j.cid && m.now().Before(e.l.ExpiresAt)
		m.mu.Unlock()
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

	m.mu.Lock()
	call := e.call
	e.call = nil
	cleanup := false
	switch {
	case skipped && ctx.Err() != nil && e.l.State == StatePending, err != nil && ctx.Err() != nil && e.l.State == StatePending:
		// Shutting down: the lease stays PENDING; the next Start resumes.
		call.err = errdefs.Unavailable("lease %s: the lease manager shut down while restarting its sandbox", id)
	case skipped: // released while settling
		call.err = errNotUsable(&e.l)
		cleanup = true
	case err == nil && e.l.State == StatePending:
		e.l.ContainerID, e.l.Endpoint = sb.ID, sb.Endpoint
		e.l.Restarts++
		_ = m.transitionLocked(e, StateReady, "restarted after "+j.after)
		call.lease = e.l.Clone()
	case err == nil: // released while restarting
		call.err = errNotUsable(&e.l)
		cleanup = true
	default:
		m.restartFails++
		err = wrapf(err, "lease %s: restart container %s in place", id, j.cid)
		call.err = err
		if e.l.State == StatePending {
			_ = m.transitionLocked(e, StateFailed, fmt.Sprintf("restart after %s failed: %v", j.after, err))
		}
		cleanup = true
	}
	l, rev := e.snapshot()
	m.mu.Unlock()
	_ = m.persist(l, rev)
	close(call.done)
	switch {
	case skipped:
		log.Info("in-place restart abandoned before it began", "state", l.State.String())
	case err != nil:
		log.Warn("in-place restart of sandbox failed", "err", err, "duration", took)
	default:
		log.Info("sandbox restarted in place", "endpoint", sb.Endpoint, "restarts", l.Restarts, "duration", took)
	}
	if cleanup && ctx.Err() == nil {
		_ = m.cleanup(ctx, id)
	}
}
