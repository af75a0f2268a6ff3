package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// category returns berth's error category for an error of the Kubernetes
// API (a *StatusError, or a transport error when the API server cannot be
// reached).
func category(err error) error {
	var netErr net.Error
	switch {
	case apierrors.IsNotFound(err):
		return errdefs.ErrNotFound
	case apierrors.IsAlreadyExists(err):
		return errdefs.ErrAlreadyExists
	case apierrors.IsConflict(err):
		return errdefs.ErrFailedPrecondition
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return errdefs.ErrInvalidArgument
	case apierrors.IsForbidden(err):
		return errdefs.ErrPermissionDenied
	case apierrors.IsUnauthorized(err):
		return errdefs.ErrUnauthenticated
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err) && apierrors.IsUnexpectedServerError(err):
		return errdefs.ErrUnavailable
	case errors.As(err, &netErr):
		return errdefs.ErrUnavailable
	default:
		return errdefs.ErrInternal
	}
}

// apiErr wraps err, met while doing op to object id ("" for none), with
// its category and what was being done; context errors pass through with
// the op named. A forbidden call names the Role the orchestrator needs.
func (r *Runtime) apiErr(err error, op, id string) error {
	if err == nil {
		return nil
	}
	what := op
	if id != "" {
		what = op + " " + id
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("kubernetes: %s: %w", what, err)
	}
	if strings.Contains(err.Error(), "would exceed context deadline") {
		// client-go's rate limiter refuses to wait past the deadline
		// (golang.org/x/time/rate): the deadline's doing, as above.
		return fmt.Errorf("kubernetes: %s: %w (%v)", what, context.DeadlineExceeded, err)
	}
	cat := category(err)
	switch {
	case errors.Is(cat, errdefs.ErrPermissionDenied):
		return fmt.Errorf("%w: kubernetes: %s in namespace %s: %w (bind the Role of deploy/kubernetes to the orchestrator's ServiceAccount)",
			cat, what, r.cfg.Namespace, err)
	case errors.Is(cat, errdefs.ErrUnavailable):
		return fmt.Errorf("%w: kubernetes: %s: %w (is the API server at %s reachable?)", cat, what, err, r.host)
	}
	return fmt.Errorf("%w: kubernetes: %s: %w", cat, what, err)
}
