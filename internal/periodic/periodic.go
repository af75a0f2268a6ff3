// Package periodic runs a background pass at a fixed interval for as long
// as its lifetime context lasts.
package periodic

import (
	"context"
	"time"
)

// Run calls fn(ctx) every interval, the first time one interval from now,
// until ctx ends; it returns then. A pass that takes longer than interval
// delays the next one (ticks are not queued). interval must be positive.
func Run(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn(ctx)
	}
}
