// Package kubeerr maps errors of the Kubernetes API to berth's error
// categories (pkg/errdefs) and wraps them with what was being done: the one
// home of that mapping for the Kubernetes runtime and the cluster lease
// store.
package kubeerr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Category returns berth's error category for an error of the Kubernetes
// API (a *StatusError, or a transport error when the API server cannot be
// reached).
func Category(err error) error {
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

// Wrapper wraps the API errors of one client: Component prefixes the
// messages ("kubernetes", "kubestore"), Namespace and Host name where the
// calls went.
type Wrapper struct {
	Component, Namespace, Host string
}

// Wrap wraps err, met while doing op to object name ("" for none), with its
// Category and what was being done; nil stays nil. Context errors (and
// client-go's rate limiter refusing to wait past the deadline) pass through
// as the context's error with the op named. A forbidden call names the Role
// the orchestrator needs, an unreachable API server its address.
func (w Wrapper) Wrap(err error, op, name string) error {
	if err == nil {
		return nil
	}
	what := op
	if name != "" {
		what = op + " " + name
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %s: %w", w.Component, what, err)
	}
	if strings.Contains(err.Error(), "would exceed context deadline") {
		// client-go's rate limiter refuses to wait past the deadline
		// (golang.org/x/time/rate): the deadline's doing, as above.
		return fmt.Errorf("%s: %s: %w (%v)", w.Component, what, context.DeadlineExceeded, err)
	}
	cat := Category(err)
	switch {
	case errors.Is(cat, errdefs.ErrPermissionDenied):
		return fmt.Errorf("%w: %s: %s in namespace %s: %w (bind the Role of deploy/kubernetes to the orchestrator's ServiceAccount)",
			cat, w.Component, what, w.Namespace, err)
	case errors.Is(cat, errdefs.ErrUnavailable):
		return fmt.Errorf("%w: %s: %s: %w (is the API server at %s reachable?)", cat, w.Component, what, err, w.Host)
	}
	return fmt.Errorf("%w: %s: %s: %w", cat, w.Component, what, err)
}
