package lease

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// RetryAfterError is an error that carries a hint of when a retry may
// succeed. Acquire returns one (wrapping errdefs.ErrResourceExhausted) when
// AdmissionConfig.MaxLive is reached; edges map it to gRPC RESOURCE_EXHAUSTED with a
// RetryInfo detail, and to HTTP 429 with a Retry-After header.
type RetryAfterError struct {
	// Err is the underlying error; errors.Is sees through to it.
	Err error
	// After is how long the caller should wait before retrying (≥ 1s).
	After time.Duration
}

// Error implements error.
func (e *RetryAfterError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter returns the retry hint carried by err, if any.
func RetryAfter(err error) (time.Duration, bool) {
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return ra.After, true
	}
	return 0, false
}

// ParseSelector parses a label selector of the form "k=v,k2=v2" (the
// label_selector field of the API) into a map; every pair must match. Spaces
// around keys and values are trimmed; an empty string is an empty selector.
// Malformed input returns an error wrapping errdefs.ErrInvalidArgument naming
// field.
func ParseSelector(field, s string) (map[string]string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return nil, errdefs.InvalidArgument(field, "want k=v[,k2=v2], got %q", pair)
		}
		if err := validLabelKey(k); err != nil {
			return nil, errdefs.InvalidArgument(field, "%v", err)
		}
		if prev, dup := out[k]; dup && prev != v {
			return nil, errdefs.InvalidArgument(field, "key %q given twice with different values", k)
		}
		out[k] = v
	}
	return out, nil
}

// wrapf wraps err with a message while keeping its category.
func wrapf(err error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err)
}
