package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestTimeoutErrEarlyDeadline: an engine that reports the propagated
// deadline a moment before ctx's own timer fires (containerd over gRPC)
// still yields the ReadyTimeout error, not a bare deadline error.
func TestTimeoutErrEarlyDeadline(t *testing.T) {
	parent := context.Background()
	ctx, cancel := context.WithTimeout(parent, 30*time.Millisecond)
	defer cancel()
	engineErr := fmt.Errorf("record network: %w", context.DeadlineExceeded) // before ctx's timer fired
	err := runtime.Backend{Name: "eng"}.TimeoutErr(parent, ctx, 30*time.Millisecond, engineErr)
	if !errdefs.IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TimeoutErr = %v; want Unavailable naming ReadyTimeout", err)
	}
	// A deadline error far from ctx's deadline is someone else's: as is.
	ctx, cancel = context.WithTimeout(parent, time.Minute)
	defer cancel()
	if err := (runtime.Backend{Name: "eng"}).TimeoutErr(parent, ctx, time.Minute, engineErr); err != engineErr {
		t.Errorf("TimeoutErr = %v; want the error unchanged", err)
	}
}
