package docker

import (
	"context"
	"errors"
	"fmt"

	"github.com/docker/docker/client"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// mapErr wraps a Docker client error with the berth errdefs category that
// matches it and with what was being done (op) to which object (id). The
// original error stays in the chain (errors.Is works for both the berth
// sentinel and the containerd/Docker category).
func (r *Runtime) mapErr(err error, op, id string) error {
	if err == nil {
		return nil
	}
	what := op
	if id != "" {
		what = op + " " + id
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("docker: %s: %w", what, err)
	case client.IsErrConnectionFailed(err):
		return fmt.Errorf("%w: docker: %s: %w (is the Docker Engine running? DOCKER_HOST=%s)",
			errdefs.ErrUnavailable, what, err, r.daemonHost())
	}
	return fmt.Errorf("%w: docker: %s: %w", runtime.EngineCategory(err), what, err)
}

func (r *Runtime) daemonHost() string {
	if h := r.cli.DaemonHost(); h != "" {
		return h
	}
	return "unix:///var/run/docker.sock"
}
