package runtime

import (
	"context"
	"errors"
	"fmt"

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

// Engine is what Engine.Err needs to know of a backend's container engine:
// its name and how it says that it cannot be reached. A backend's errors.go
// is its Engine; the categories are EngineCategory's, one table for all.
type Engine struct {
	// Name prefixes messages: "docker", "containerd".
	Name string
	// Down reports whether err means that the engine cannot be reached.
	Down func(err error) bool
	// Hint says, for an engine that cannot be reached, where it was
	// expected ("is containerd running at /run/containerd/containerd.sock?").
	Hint func() string
}

// Err wraps err, met while doing op (e.g. "start container") to the
// object id ("" for none), with berth's category and what was being done:
// "<category>: <engine>: <op> <id>: <err>", the original error kept in the
// chain (errors.Is matches both the berth and the engine category). An
// unreachable engine (Down) is ErrUnavailable with the Hint appended; context errors are not categorised (the caller knows what
// its deadline means). A nil err is nil.
func (e Engine) Err(err error, op, id string) error {
	if err == nil {
		return nil
	}
	what := op
	if id != "" {
		what = op + " " + id
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %s: %w", e.Name, what, err)
	case e.Down(err):
		return fmt.Errorf("%w: %s: %s: %w (%s)", errdefs.ErrUnavailable, e.Name, what, err, e.Hint())
	}
	return fmt.Errorf("%w: %s: %s: %w", EngineCategory(err), e.Name, what, err)
}
