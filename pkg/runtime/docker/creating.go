package docker

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// removeCreating finishes a Remove whose inspect found no container id.
// Usually it is gone. But the engine (seen with Engine 20.10) lists a
// container while its ContainerCreate is still running and answers "No
// such container" to inspect and remove until the creation ends; an
// orchestrator killed in the middle of a Create leaves such a creation
// behind, and reconcile would see its container listed, "remove" it, and
// find it back a moment later. So while the engine still lists id, this
// waits for the creation to end (bounded by ctx and cleanupTimeout), then
// removes the container.
func (r *Runtime) removeCreating(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	delay := 5 * time.Millisecond
	for {
		// Not by the "id" filter: the engine resolves it through the same
		// index as inspect, which gets the container only when its creation
		// ends; a label filter walks the list the engine shows.
		list, err := r.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", runtime.LabelManaged+"=true"))})
		if err != nil {
			return r.mapErr(err, "list container", id)
		}
		listed := false
		for _, c := range list {
			listed = listed || strings.HasPrefix(c.ID, id)
		}
		if !listed {
			return nil // gone, or never was
		}
		ins, err := r.cli.ContainerInspect(ctx, id)
		if err == nil {
			if ins.Config == nil || ins.Config.Labels[runtime.LabelManaged] != "true" {
				return errdefs.FailedPrecondition("docker: refusing to remove container %s: not managed by berth", id)
			}
			return r.remove(ctx, ins.ID)
		}
		if mapped := r.mapErr(err, "inspect container", id); !errdefs.IsNotFound(mapped) {
			return mapped
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: docker: container %s is listed but still being created; remove it again later: %w",
				errdefs.ErrUnavailable, id, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}
