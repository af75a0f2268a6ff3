package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Restart starts a sandbox whose task exited again in place: the stopped
// task is deleted, the sandbox's network is set up again (CNI DEL of the old
// attachment, a fresh network namespace and CNI ADD: the address may
// change, and is recorded again), and a new task is created on the same
// container and snapshot — so every file written is kept — with the agent,
// token and host files of the sandbox's host directory. It waits for the
// agent like Create, bounded by Config.ReadyTimeout. A running sandbox is
// only waited for; a paused one is FailedPrecondition. On failure the
// container is left as it is (stopped) for the caller to retry or remove.
func (r *Runtime) Restart(ctx context.Context, id string) (runtime.Sandbox, error) {
	if id == "" {
		return runtime.Sandbox{}, errdefs.InvalidArgument("id", "container id is required")
	}
	began := time.Now()
	timeout := r.cfg.ReadyTimeout
	parent := r.withNS(ctx)
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	unlock := r.createMu.lock(id)
	defer unlock()

	c, proc, err := r.managedTask(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	switch st := proc.GetStatus(); {
	case proc != nil && (st == tasktypes.Status_PAUSED || st == tasktypes.Status_PAUSING):
		return runtime.Sandbox{}, errdefs.FailedPrecondition("containerd: cannot restart %s: it is paused", id)
	case proc != nil && st == tasktypes.Status_RUNNING:
		sb := r.toSandbox(c, proc)
		if sb.Endpoint == "" {
			return runtime.Sandbox{}, errdefs.FailedPrecondition("containerd: sandbox %s runs without a recorded address", id)
		}
		if err := r.waitReady(ctx, id, sb.Endpoint); err != nil {
			return runtime.Sandbox{}, r.backend().TimeoutErr(parent, ctx, timeout, err)
		}
		return sb, nil
	case proc != nil:
		// Stopped (or created and never started): delete it; a container
		// has at most one task.
		if _, err := r.cli.TaskService().Delete(ctx, &tasks.DeleteTaskRequest{ContainerID: id}); err != nil {
			if mapped := r.mapErr(err, "delete task", id); !errdefs.IsNotFound(mapped) {
				return runtime.Sandbox{}, mapped
			}
		}
	}
	// The agent, its token and the mounted host files live in the
	// sandbox's host directory, which Create wrote and only Remove deletes.
	if _, err := os.Stat(filepath.Join(r.sandboxDir(id), "berth", "token")); err != nil {
		return runtime.Sandbox{}, errdefs.FailedPrecondition("containerd: cannot restart %s: its host files are gone: %v", id, err)
	}
	if err := r.ensureHost(ctx); err != nil {
		return runtime.Sandbox{}, r.backend().TimeoutErr(parent, ctx, timeout, err)
	}
	t0 := time.Now()
	nsPath := r.netnsPath(id)
	if err := r.cniDel(ctx, id, nsPath); err != nil {
		r.log.Warn("restart: releasing the old network failed; setting it up again anyway", "container_id", id, "err", err)
	}
	t1 := time.Now()
	ni, err := r.setupNetwork(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, r.backend().TimeoutErr(parent, ctx, timeout, err)
	}
	t2 := time.Now()
	if err := r.recordNetwork(ctx, id, ni); err != nil {
		return runtime.Sandbox{}, err
	}
	cont, err := r.cli.LoadContainer(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, r.mapErr(err, "load container", id)
	}
	// As in Create: task creation and start are not cancelled half-way.
	tctx, tcancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer tcancel()
	t3 := time.Now()
	task, err := cont.NewTask(tctx, r.taskIO(id))
	if err != nil {
		return runtime.Sandbox{}, r.startErr(err, "create task", id)
	}
	t4 := time.Now()
	if err := task.Start(tctx); err != nil {
		return runtime.Sandbox{}, r.startErr(err, "start task", id)
	}
	t5 := time.Now()
	endpoint := ni.endpoint()
	if err := r.waitReady(ctx, id, endpoint); err != nil {
		return runtime.Sandbox{}, r.backend().TimeoutErr(parent, ctx, timeout, fmt.Errorf("containerd: restart %s: %w", id, err))
	}
	c, err = r.getManaged(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	sb := r.toSandbox(c, &tasktypes.Process{ContainerID: id, Status: tasktypes.Status_RUNNING})
	sb.Endpoint = endpoint
	r.log.Debug("sandbox restarted", "container_id", id, "lease_id", sb.LeaseID, "endpoint", endpoint, "duration", time.Since(began),
		"prepare", t0.Sub(began), "network_release", t1.Sub(t0), "network", t2.Sub(t1), "record", t3.Sub(t2),
		"task", t4.Sub(t3), "start", t5.Sub(t4), "ready", time.Since(t5))
	return sb, nil
}

// managedTask returns the berth-managed container id (getManaged) and the
// init process of its task, nil when it has none: what Get and Restart
// read first.
func (r *Runtime) managedTask(ctx context.Context, id string) (containers.Container, *tasktypes.Process, error) {
	c, err := r.getManaged(ctx, id)
	if err != nil {
		return c, nil, err
	}
	proc, err := r.taskProcess(ctx, id)
	return c, proc, err
}

// Hibernate stops the sandbox as Stop does, then releases what its stopped
// task still holds on the host: the task itself (deleted: the shim and
// runc's state go) and its network (CNI DEL: the veth and the address;
// the network namespace is unmounted). The container, its snapshot and
// its host directory (the agent, its token, its state and log) stay, so
// the wake-up, Restart, only sets a network up and starts a task: the
// teardown is paid when the lease goes to sleep, not when a client waits
// for it to wake (docs/benchmarks.md). Until then the sandbox reads as
// created (a container without a task).
//
// Only Stop's error is returned: once the sandbox is stopped it is
// hibernated, and a release that fails is logged and done again by
// Restart, which deletes a stopped task and releases a network it finds.
func (r *Runtime) Hibernate(ctx context.Context, id string, grace time.Duration) error {
	if err := r.Stop(ctx, id, grace); err != nil {
		return err
	}
	ctx = r.withNS(ctx)
	unlock := r.createMu.lock(id) // not while a Restart of it runs
	defer unlock()
	if err := r.deleteTask(ctx, id); err != nil {
		r.log.Warn("hibernate: deleting the stopped task failed; the wake-up deletes it", "container_id", id, "err", err)
		return nil
	}
	nsPath := r.netnsPath(id)
	if err := r.cniDel(ctx, id, nsPath); err != nil {
		r.log.Warn("hibernate: releasing the network failed; the wake-up releases it", "container_id", id, "err", err)
		return nil
	}
	if err := removeNetns(nsPath); err != nil {
		r.log.Warn("hibernate: removing the network namespace failed; the wake-up replaces it", "container_id", id, "path", nsPath, "err", err)
	}
	return nil
}
