package runtime

import (
	cerrdefs "github.com/containerd/errdefs"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// EngineCategory returns berth's error category for an error of a container
// engine. Both engines classify their errors with github.com/containerd/errdefs
// (the Docker client's errors and containerd's do), so one table serves
// every backend and a category cannot drift between them. Backends add
// what they know beyond the category (the engine's address when it is
// unreachable, the op and ids) and keep the original error in the chain.
// An error the table does not know is ErrInternal; context errors are not
// categorised here (callers pass them through).
func EngineCategory(err error) error {
	switch {
	case cerrdefs.IsNotFound(err):
		return errdefs.ErrNotFound
	case cerrdefs.IsAlreadyExists(err):
		return errdefs.ErrAlreadyExists
	case cerrdefs.IsConflict(err), cerrdefs.IsFailedPrecondition(err), cerrdefs.IsNotImplemented(err):
		return errdefs.ErrFailedPrecondition
	case cerrdefs.IsInvalidArgument(err):
		return errdefs.ErrInvalidArgument
	case cerrdefs.IsUnavailable(err):
		return errdefs.ErrUnavailable
	case cerrdefs.IsPermissionDenied(err):
		return errdefs.ErrPermissionDenied
	case cerrdefs.IsUnauthorized(err):
		return errdefs.ErrUnauthenticated
	case cerrdefs.IsResourceExhausted(err):
		return errdefs.ErrResourceExhausted
	default:
		return errdefs.ErrInternal
	}
}
