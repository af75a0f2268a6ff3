package runtime

import (
	"context"
	"errors"
	"time"
)

// deadlineSlack is how long before ctx's deadline an engine may report it.
const deadlineSlack = 100 * time.Millisecond

// waitOwnDeadline waits for ctx's deadline when err says the deadline
// passed but ctx's own timer has not fired yet, and is due within
// deadlineSlack: an engine that propagates the deadline (containerd, over
// gRPC) may report it a moment before ctx does, and the caller's
// ctx.Err() check would then take ctx's own timeout for another error.
func waitOwnDeadline(ctx context.Context, err error) {
	if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
		return
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < deadlineSlack {
		<-ctx.Done()
	}
}
