package docker

import (
	"github.com/docker/docker/client"

	"github.com/berth-dev/berth/pkg/runtime"
)

// engine is the Docker Engine for runtime.Engine.Err: unreachable when the
// client cannot connect, and then the hint names DOCKER_HOST.
func (r *Runtime) engine() runtime.Engine {
	return runtime.Engine{
		Name: "docker",
		Down: client.IsErrConnectionFailed,
		Hint: func() string { return "is the Docker Engine running? DOCKER_HOST=" + r.daemonHost() },
	}
}

// mapErr wraps a Docker client error with the berth errdefs category that
// matches it and with what was being done (op) to which object (id); see
// runtime.Engine.Err.
func (r *Runtime) mapErr(err error, op, id string) error {
	return r.engine().Err(err, op, id)
}

func (r *Runtime) daemonHost() string {
	if h := r.cli.DaemonHost(); h != "" {
		return h
	}
	return "unix:///var/run/docker.sock"
}
