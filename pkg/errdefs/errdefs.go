// Package errdefs defines berth's error categories. Code wraps one of the
// sentinel errors with %w and the ids involved; the gRPC and HTTP edges map
// the category to a status code and clients map it back (package
// errdefs/errgrpc), so errors.Is works on both sides of the wire. This
// package imports no gRPC.
package errdefs

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel categories. Wrap them, never return them bare.
var (
	// ErrInvalidArgument marks a request that is malformed; the message names the field.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound marks a missing object.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists marks an object that exists and may not be replaced.
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition marks a request the current state does not allow.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnavailable marks a dependency that cannot be reached right now.
	ErrUnavailable = errors.New("unavailable")
	// ErrResourceExhausted marks a limit that was reached.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrUnauthenticated marks a missing or wrong credential.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied marks a credential that does not allow the call.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrConflict marks a concurrent modification that lost.
	ErrConflict = errors.New("conflict")
	// ErrInternal marks a bug or an unexpected failure.
	ErrInternal = errors.New("internal")
)

// Newf returns an error of category cat (one of the sentinels above) whose
// text is exactly the formatted message: unlike the named constructors, it
// does not put the category's name in front. errors.Is(err, cat) holds, so
// the edges map it like any other error of its category. It is for the
// answers of the orchestrator, the proxy and the agents' own checks, whose
// wire messages ("lease l-1 not found", "id: required") predate the
// categories and are matched by clients; new errors use the named
// constructors.
func Newf(cat error, format string, args ...any) error {
	return &plainError{cat: cat, msg: fmt.Sprintf(format, args...)}
}

// plainError is a category with a message that does not repeat it.
type plainError struct {
	cat error
	msg string
}

func (e *plainError) Error() string { return e.msg }

func (e *plainError) Unwrap() error { return e.cat }

// WithReason returns err with a machine-readable reason: a word in
// UPPER_SNAKE_CASE ("COMMAND_NOT_FOUND") that tells a client more than the
// category, for it to act on (a command line chooses its exit code by it).
// The message and the category (errors.Is) stay err's. The gRPC edge
// (errgrpc) sends the reason as an ErrorInfo detail and clients read it
// back with Reason. A nil err stays nil.
func WithReason(err error, reason string) error {
	if err == nil {
		return nil
	}
	return &reasonError{err: err, reason: reason}
}

// Reason returns the reason WithReason attached to err (on either side of
// the wire), or "" when there is none.
func Reason(err error) string {
	var r interface{ Reason() string }
	if errors.As(err, &r) {
		return r.Reason()
	}
	return ""
}

// reasonError is an error with a reason.
type reasonError struct {
	err    error
	reason string
}

func (e *reasonError) Error() string { return e.err.Error() }

func (e *reasonError) Unwrap() error { return e.err }

// Reason is the machine-readable reason.
func (e *reasonError) Reason() string { return e.reason }

// InvalidArgument returns an ErrInvalidArgument naming field.
func InvalidArgument(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

// NotFound returns an ErrNotFound with a message.
func NotFound(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotFound, fmt.Sprintf(format, args...))
}

// AlreadyExists returns an ErrAlreadyExists with a message.
func AlreadyExists(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrAlreadyExists, fmt.Sprintf(format, args...))
}

// FailedPrecondition returns an ErrFailedPrecondition with a message.
func FailedPrecondition(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFailedPrecondition, fmt.Sprintf(format, args...))
}

// Unavailable returns an ErrUnavailable with a message.
func Unavailable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnavailable, fmt.Sprintf(format, args...))
}

// ResourceExhausted returns an ErrResourceExhausted with a message.
func ResourceExhausted(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrResourceExhausted, fmt.Sprintf(format, args...))
}

// Unauthenticated returns an ErrUnauthenticated error.
func Unauthenticated(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnauthenticated, fmt.Sprintf(format, args...))
}

// PermissionDenied returns an ErrPermissionDenied error.
func PermissionDenied(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrPermissionDenied, fmt.Sprintf(format, args...))
}

// Conflict returns an ErrConflict error.
func Conflict(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConflict, fmt.Sprintf(format, args...))
}

// Internal returns an ErrInternal error.
func Internal(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInternal, fmt.Sprintf(format, args...))
}

// IsUnauthenticated reports whether err is ErrUnauthenticated.
func IsUnauthenticated(err error) bool { return errors.Is(err, ErrUnauthenticated) }

// IsPermissionDenied reports whether err is ErrPermissionDenied.
func IsPermissionDenied(err error) bool { return errors.Is(err, ErrPermissionDenied) }

// IsConflict reports whether err is ErrConflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsInternal reports whether err is ErrInternal.
func IsInternal(err error) bool { return errors.Is(err, ErrInternal) }

// IsInvalidArgument reports whether err is an ErrInvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsNotFound reports whether err is an ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err is an ErrAlreadyExists.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }

// IsFailedPrecondition reports whether err is an ErrFailedPrecondition.
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }

// IsUnavailable reports whether err is an ErrUnavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsResourceExhausted reports whether err is an ErrResourceExhausted.
func IsResourceExhausted(err error) bool { return errors.Is(err, ErrResourceExhausted) }

// IsCanceled reports whether err is a context cancellation or deadline.
func IsCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
