package errdefs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestConstructorsCategorise checks that each constructor wraps its
// sentinel (and only it), keeps the message, and that the Is helper agrees.
func TestConstructorsCategorise(t *testing.T) {
	all := []error{
		errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
		errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted,
		errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied, errdefs.ErrConflict, errdefs.ErrInternal,
	}
	for _, tc := range []struct {
		err      error
		sentinel error
		is       func(error) bool
	}{
		{errdefs.InvalidArgument("spec.image", "must not be empty"), errdefs.ErrInvalidArgument, errdefs.IsInvalidArgument},
		{errdefs.NotFound("lease %s", "l-1"), errdefs.ErrNotFound, errdefs.IsNotFound},
		{errdefs.AlreadyExists("lease %s", "l-1"), errdefs.ErrAlreadyExists, errdefs.IsAlreadyExists},
		{errdefs.FailedPrecondition("lease %s is %s", "l-1", "PENDING"), errdefs.ErrFailedPrecondition, errdefs.IsFailedPrecondition},
		{errdefs.Unavailable("docker: %s", "down"), errdefs.ErrUnavailable, errdefs.IsUnavailable},
		{errdefs.ResourceExhausted("%d live leases", 100), errdefs.ErrResourceExhausted, errdefs.IsResourceExhausted},
		{errdefs.Unauthenticated("no token"), errdefs.ErrUnauthenticated, errdefs.IsUnauthenticated},
		{errdefs.PermissionDenied("lease %s belongs to another owner", "l-1"), errdefs.ErrPermissionDenied, errdefs.IsPermissionDenied},
		{errdefs.Conflict("lease %s changed", "l-1"), errdefs.ErrConflict, errdefs.IsConflict},
		{errdefs.Internal("store: %s", "corrupt"), errdefs.ErrInternal, errdefs.IsInternal},
	} {
		if !errors.Is(tc.err, tc.sentinel) || !tc.is(tc.err) {
			t.Errorf("%q: not %v", tc.err, tc.sentinel)
		}
		if !strings.HasPrefix(tc.err.Error(), tc.sentinel.Error()+": ") {
			t.Errorf("%q does not start with its category %q", tc.err, tc.sentinel)
		}
		for _, other := range all {
			if other != tc.sentinel && errors.Is(tc.err, other) {
				t.Errorf("%q is also %v", tc.err, other)
			}
		}
		// Wrapping again with context keeps the category.
		if wrapped := fmt.Errorf("acquire c-1: %w", tc.err); !tc.is(wrapped) {
			t.Errorf("%q lost its category when wrapped", wrapped)
		}
	}
	if got := errdefs.InvalidArgument("resources.cpus", "%v exceeds the maximum %v", 4096, 4).Error(); got != "invalid argument: resources.cpus: 4096 exceeds the maximum 4" {
		t.Errorf("InvalidArgument message = %q, want the field named", got)
	}
}

func TestIsCanceled(t *testing.T) {
	for _, err := range []error{context.Canceled, context.DeadlineExceeded, fmt.Errorf("exec: %w", context.Canceled)} {
		if !errdefs.IsCanceled(err) {
			t.Errorf("IsCanceled(%v) = false", err)
		}
	}
	if errdefs.IsCanceled(errdefs.NotFound("x")) {
		t.Error("IsCanceled(not found) = true")
	}
}

// TestNewf: the message is kept as written (no category in front) and the
// category is still there for errors.Is.
func TestNewf(t *testing.T) {
	err := errdefs.Newf(errdefs.ErrNotFound, "lease %s not found", "l-1")
	if got := err.Error(); got != "lease l-1 not found" {
		t.Errorf("Newf message = %q, want %q", got, "lease l-1 not found")
	}
	if !errdefs.IsNotFound(err) || !errdefs.IsNotFound(fmt.Errorf("get: %w", err)) {
		t.Errorf("Newf(ErrNotFound) is not ErrNotFound: %v", err)
	}
	if errdefs.IsInvalidArgument(err) {
		t.Error("Newf(ErrNotFound) is also ErrInvalidArgument")
	}
}
