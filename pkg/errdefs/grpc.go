package errdefs

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var codeOf = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrUnavailable, codes.Unavailable},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrUnauthenticated, codes.Unauthenticated},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrConflict, codes.Aborted},
	{ErrInternal, codes.Internal},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// ToGRPC converts err to a gRPC status error whose code matches its category.
// Errors that already carry a status pass through; unknown errors are Unknown.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	for _, c := range codeOf {
		if errors.Is(err, c.err) {
			return status.Error(c.code, err.Error())
		}
	}
	return status.Error(codes.Unknown, err.Error())
}

// FromGRPC converts a gRPC status error back into an error wrapping the
// matching sentinel, so callers can use errors.Is across the wire.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, c := range codeOf {
		if st.Code() == c.code {
			msg := st.Message()
			// Avoid "not found: not found: x" after a round trip.
			msg = strings.TrimPrefix(msg, c.err.Error()+": ")
			return &wireError{sentinel: c.err, msg: msg, st: err}
		}
	}
	return err
}

type wireError struct {
	sentinel error
	msg      string
	st       error
}

func (e *wireError) Error() string { return e.sentinel.Error() + ": " + e.msg }

func (e *wireError) Unwrap() []error { return []error{e.sentinel, e.st} }

// GRPCStatus lets status.FromError see the original status.
func (e *wireError) GRPCStatus() *status.Status { s, _ := status.FromError(e.st); return s }
