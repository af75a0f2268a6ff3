package containerd

import (
	"context"
	"errors"
	"fmt"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// mapErr wraps a containerd error with the berth errdefs category that
// matches it and with what was being done (op) to which object (id). gRPC
// status errors are converted to containerd's error types first, so the
// original containerd category stays matchable with errors.Is too.
func (r *Runtime) mapErr(err error, op, id string) error {
	if err == nil {
		return nil
	}
	if _, isGRPC := status.FromError(err); isGRPC {
		// A raw gRPC error (the task service client); the stores' errors
		// are converted already, and converting twice loses the category.
		err = errgrpc.ToNative(err)
	}
	what := op
	if id != "" {
		what = op + " " + id
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("containerd: %s: %w", what, err)
	case cerrdefs.IsUnavailable(err):
		return fmt.Errorf("%w: containerd: %s: %w (is containerd running at %s?)", errdefs.ErrUnavailable, what, err, r.cfg.Address)
	}
	return fmt.Errorf("%w: containerd: %s: %w", runtime.EngineCategory(err), what, err)
}
