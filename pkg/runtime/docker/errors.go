package docker

import (
	"github.com/docker/docker/client"

	"github.com/berth-dev/berth/pkg/runtime"
)

// mapErr wraps a Docker client error with the berth errdefs category that
// matches it and with what was being done (op) to which object (id); see
// runtime.Engine.Err. The engine is down when the client cannot connect.
func (r *Runtime) mapErr(err error, op, id string) error {
	return runtime.Engine{Name: "docker", Down: client.IsErrConnectionFailed, Hint: r.downHint}.Err(err, op, id)
}

// downHint is what an unreachable engine's error suggests.
func (r *Runtime) downHint() string {
	return "is the Docker Engine running? DOCKER_HOST=" + r.daemonHost()
}

func (r *Runtime) daemonHost() string {
	if h := r.cli.DaemonHost(); h != "" {
		return h
	}
	return "unix:///var/run/docker.sock"
}
