package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Restart starts an exited sandbox again in place (docker start of the same
// container: its writable layer, and so the injected agent, its token and
// every file written, are kept) and waits until its agent answers, bounded
// by Config.ReadyTimeout. The endpoint is read again after the start: the
// engine may give the container another address. A running sandbox is only
// waited for; a paused one is FailedPrecondition.
func (r *Runtime) Restart(ctx context.Context, id string) (runtime.Sandbox, error) {
	r.negotiate(ctx)
	if id == "" {
		return runtime.Sandbox{}, errdefs.InvalidArgument("id", "container id is required")
	}
	parent := ctx
	timeout := r.cfg.ReadyTimeout
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	began := time.Now()
	ins, err := r.inspectManaged(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	if st := ins.State; st != nil && st.Paused {
		return runtime.Sandbox{}, errdefs.FailedPrecondition("docker: cannot restart container %s: it is paused", id)
	}
	var started time.Duration // the engine's start, for the debug log
	if st := ins.State; st == nil || !st.Running {
		t0 := time.Now()
		err := r.containerStart(ctx, ins.ID)
		started = time.Since(t0)
		if err != nil {
			mapped := r.mapErr(err, "start container", id)
			if errors.Is(mapped, errdefs.ErrInternal) {
				return runtime.Sandbox{}, fmt.Errorf("%w: docker: container %s cannot start again: %w", errdefs.ErrFailedPrecondition, id, err)
			}
			return runtime.Sandbox{}, r.backend().TimeoutErr(parent, ctx, timeout, mapped)
		}
		if ins, err = r.cli.ContainerInspect(ctx, ins.ID); err != nil {
			return runtime.Sandbox{}, r.mapErr(err, "inspect container", id)
		}
	}
	sb, err := r.startedSandbox(id, ins)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	t0 := time.Now()
	if err := r.waitReady(ctx, ins.ID, sb.Endpoint); err != nil {
		return runtime.Sandbox{}, r.backend().TimeoutErr(parent, ctx, timeout, err)
	}
	sb.State = runtime.StateRunning
	r.log.Debug("sandbox restarted", "container_id", ins.ID, "lease_id", sb.LeaseID, "endpoint", sb.Endpoint,
		"start", started, "ready", time.Since(t0), "duration", time.Since(began))
	return sb, nil
}

// startedSandbox is container id, inspected (ins) after its start by
// Create or Restart, as a Sandbox with its agent's endpoint. A container
// that exited already reports its exit (FailedPrecondition, as one with no
// address on the network).
func (r *Runtime) startedSandbox(id string, ins container.InspectResponse) (runtime.Sandbox, error) {
	sb := r.fromInspect(ins)
	if sb.Endpoint == "" {
		if ins.State != nil && !ins.State.Running {
			return runtime.Sandbox{}, exitedErr(id, ins.State)
		}
		return runtime.Sandbox{}, errdefs.FailedPrecondition("docker: container %s has no address on network %s", id, r.cfg.Network)
	}
	return sb, nil
}
