// Package errgrpc maps berth's error categories (package errdefs) to gRPC
// status codes at the edge and back in clients, so errors.Is works on both
// sides of the wire. It is the only place that ties errdefs to gRPC: the
// categories themselves import no gRPC (containerd's errdefs/errgrpc split).
package errgrpc

import (
	"context"
	"errors"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// codeOf is the one mapping table: category → code, in the order errors.Is
// is tried (the first match wins).
var codeOf = []struct {
	err  error
	code codes.Code
}{
	{errdefs.ErrInvalidArgument, codes.InvalidArgument},
	{errdefs.ErrNotFound, codes.NotFound},
	{errdefs.ErrAlreadyExists, codes.AlreadyExists},
	{errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
	{errdefs.ErrUnavailable, codes.Unavailable},
	{errdefs.ErrResourceExhausted, codes.ResourceExhausted},
	{errdefs.ErrUnauthenticated, codes.Unauthenticated},
	{errdefs.ErrPermissionDenied, codes.PermissionDenied},
	{errdefs.ErrConflict, codes.Aborted},
	{errdefs.ErrInternal, codes.Internal},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// ToGRPC converts err to a gRPC status error whose code matches its category,
// with its reason (errdefs.Reason), if any, as an ErrorInfo detail of
// Domain. Errors that already carry a status pass through; unknown errors
// are Unknown.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Unknown
	for _, c := range codeOf {
		if errors.Is(err, c.err) {
			code = c.code
			break
		}
	}
	st := status.New(code, err.Error())
	if reason := errdefs.Reason(err); reason != "" {
		if withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain}); derr == nil {
			st = withInfo
		}
	}
	return st.Err()
}

// Domain is the ErrorInfo domain of the reasons berth sends
// (errdefs.WithReason).
const Domain = "berth.dev"

// reasonOf returns the reason of st's ErrorInfo detail from berth's
// domain, or "".
func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// FromGRPC converts a gRPC status error back into an error wrapping the
// matching sentinel, so callers can use errors.Is across the wire, and
// carrying the server's reason for errdefs.Reason.
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
			return &wireError{sentinel: c.err, msg: msg, st: err, reason: reasonOf(st)}
		}
	}
	return err
}

type wireError struct {
	sentinel error
	msg      string
	st       error
	reason   string
}

// Reason is the reason the server attached (errdefs.Reason), or "".
func (e *wireError) Reason() string { return e.reason }

func (e *wireError) Error() string { return e.sentinel.Error() + ": " + e.msg }

func (e *wireError) Unwrap() []error { return []error{e.sentinel, e.st} }

// GRPCStatus lets status.FromError see the original status.
func (e *wireError) GRPCStatus() *status.Status { s, _ := status.FromError(e.st); return s }
