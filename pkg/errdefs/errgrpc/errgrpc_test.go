package errgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRoundTrip sends every category through ToGRPC (the server's edge)
// and FromGRPC (the client): the code matches the category, the category
// survives (errors.Is), and the message does not repeat its prefix.
func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
		is   error
	}{
		{errdefs.InvalidArgument("cwd", "must be absolute"), codes.InvalidArgument, errdefs.ErrInvalidArgument},
		{errdefs.NotFound("lease l-1"), codes.NotFound, errdefs.ErrNotFound},
		{errdefs.AlreadyExists("file /a"), codes.AlreadyExists, errdefs.ErrAlreadyExists},
		{errdefs.FailedPrecondition("no git"), codes.FailedPrecondition, errdefs.ErrFailedPrecondition},
		{errdefs.Unavailable("engine down"), codes.Unavailable, errdefs.ErrUnavailable},
		{errdefs.ResourceExhausted("100 live leases"), codes.ResourceExhausted, errdefs.ErrResourceExhausted},
		{errdefs.Unauthenticated("no token"), codes.Unauthenticated, errdefs.ErrUnauthenticated},
		{errdefs.PermissionDenied("another owner's lease"), codes.PermissionDenied, errdefs.ErrPermissionDenied},
		{errdefs.Conflict("changed meanwhile"), codes.Aborted, errdefs.ErrConflict},
		{errdefs.Internal("bug"), codes.Internal, errdefs.ErrInternal},
		{fmt.Errorf("exec: %w", context.Canceled), codes.Canceled, context.Canceled},
		{fmt.Errorf("exec: %w", context.DeadlineExceeded), codes.DeadlineExceeded, context.DeadlineExceeded},
	} {
		wire := errgrpc.ToGRPC(fmt.Errorf("lease l-1: %w", tc.err))
		st, ok := status.FromError(wire)
		if !ok || st.Code() != tc.code {
			t.Errorf("ToGRPC(%q) = %v, want code %v", tc.err, wire, tc.code)
			continue
		}
		back := errgrpc.FromGRPC(wire)
		if !errors.Is(back, tc.is) {
			t.Errorf("FromGRPC(%v) = %q, not %v", wire, back, tc.is)
		}
		if s, ok := status.FromError(back); !ok || s.Code() != tc.code {
			t.Errorf("FromGRPC(%v) lost the status: %v", wire, back)
		}
		if again := errgrpc.ToGRPC(back); status.Code(again) != tc.code {
			t.Errorf("ToGRPC(FromGRPC(x)) code = %v, want %v", status.Code(again), tc.code)
		}
	}
	// One prefix, not two, after a round trip.
	if got := errgrpc.FromGRPC(errgrpc.ToGRPC(errdefs.NotFound("lease l-1"))).Error(); got != "not found: lease l-1" {
		t.Errorf("round-trip message = %q, want %q", got, "not found: lease l-1")
	}
}

func TestPassThroughAndUnknown(t *testing.T) {
	if errgrpc.ToGRPC(nil) != nil || errgrpc.FromGRPC(nil) != nil {
		t.Fatal("nil must stay nil")
	}
	st := status.Error(codes.OutOfRange, "offset past the end")
	if got := errgrpc.ToGRPC(st); got != st {
		t.Errorf("ToGRPC changed an error that already has a status: %v", got)
	}
	if got := status.Code(errgrpc.ToGRPC(errors.New("plain"))); got != codes.Unknown {
		t.Errorf("uncategorised error = %v, want Unknown", got)
	}
	plain := errors.New("not a status")
	if got := errgrpc.FromGRPC(plain); got != plain {
		t.Errorf("FromGRPC changed a non-status error: %v", got)
	}
}

// TestNewfMessage: an errdefs.Newf error goes on the wire with its message
// exactly as written and the code of its category; a client reading it
// back sees the category once.
func TestNewfMessage(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{errdefs.Newf(errdefs.ErrInvalidArgument, "id: required"), codes.InvalidArgument},
		{errdefs.Newf(errdefs.ErrPermissionDenied, "reap needs the operator token"), codes.PermissionDenied},
		{errdefs.Newf(errdefs.ErrConflict, "watch fell behind; list again and re-watch"), codes.Aborted},
		{errdefs.Newf(errdefs.ErrInternal, "internal error"), codes.Internal},
	} {
		st := status.Convert(errgrpc.ToGRPC(tc.err))
		if st.Code() != tc.code || st.Message() != tc.err.Error() {
			t.Errorf("ToGRPC(%q) = %v %q, want %v %q", tc.err, st.Code(), st.Message(), tc.code, tc.err.Error())
		}
	}
	back := errgrpc.FromGRPC(errgrpc.ToGRPC(errdefs.Newf(errdefs.ErrNotFound, "lease l-1 not found")))
	if got := back.Error(); got != "not found: lease l-1 not found" || !errdefs.IsNotFound(back) {
		t.Errorf("round trip = %q", got)
	}
}

// A reason (errdefs.WithReason) crosses the wire as an ErrorInfo detail and
// comes back for errdefs.Reason, through a wrapping error on both sides.
func TestReasonRoundTrip(t *testing.T) {
	err := fmt.Errorf("exec: %w", errdefs.WithReason(errdefs.FailedPrecondition("argv[0]: x not found"), "COMMAND_NOT_FOUND"))
	if got := errdefs.Reason(err); got != "COMMAND_NOT_FOUND" || !errdefs.IsFailedPrecondition(err) || err.Error() != "exec: failed precondition: argv[0]: x not found" {
		t.Fatalf("WithReason: reason %q, %v", got, err)
	}
	wire := errgrpc.ToGRPC(err)
	if status.Code(wire) != codes.FailedPrecondition {
		t.Fatalf("code %v", status.Code(wire))
	}
	back := errgrpc.FromGRPC(fmt.Errorf("client: %w", wire))
	if got := errdefs.Reason(back); got != "COMMAND_NOT_FOUND" || !errdefs.IsFailedPrecondition(back) {
		t.Errorf("after the round trip: reason %q, %v", got, back)
	}
	if got := errdefs.Reason(errgrpc.FromGRPC(errgrpc.ToGRPC(errdefs.NotFound("x")))); got != "" {
		t.Errorf("an error without a reason has %q", got)
	}
	if errdefs.WithReason(nil, "X") != nil {
		t.Error("WithReason(nil) is not nil")
	}
}
