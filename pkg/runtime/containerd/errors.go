package containerd

import (
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/pkg/runtime"
)

// mapErr wraps a containerd error with the berth errdefs category that
// matches it and with what was being done (op) to which object (id); see
// runtime.Engine.Err. gRPC status errors are converted to containerd's
// error types first, so the original containerd category stays matchable
// with errors.Is too. containerd is down when its error says Unavailable.
func (r *Runtime) mapErr(err error, op, id string) error {
	if err == nil {
		return nil
	}
	if _, isGRPC := status.FromError(err); isGRPC {
		// A raw gRPC error (the task service client); the stores' errors
		// are converted already, and converting twice loses the category.
		err = errgrpc.ToNative(err)
	}
	hint := func() string { return "is containerd running at " + r.cfg.Address + "?" }
	return runtime.Engine{Name: "containerd", Down: cerrdefs.IsUnavailable, Hint: hint}.Err(err, op, id)
}
