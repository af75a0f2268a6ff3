package runtime

import (
	"context"
	"log/slog"
)

// watchBuffer is how many events a Watch channel holds before the loop
// waits for its reader.
const watchBuffer = 64

// EngineEvents is what a backend's Watch knows of its engine: how to
// subscribe to the engine's event stream (messages of type M) and how to
// translate a message into an Event. WatchEvents runs the loop between the
// two, the same on every backend. A value serves one Watch (it may keep
// state across the messages of that stream).
type EngineEvents[M any] interface {
	// Subscribe starts the engine's event stream, filtered to what berth
	// needs where the engine can filter. It ends when ctx ends; a failure
	// arrives on the error channel.
	Subscribe(ctx context.Context) (<-chan M, <-chan error)
	// Seed reads what Translate needs to know before the first message
	// (the managed sandboxes, for an engine whose events carry no labels).
	// It runs after Subscribe, so nothing that happens in between is
	// missed. An error ends the Watch before it starts.
	Seed(ctx context.Context) error
	// Translate maps one engine message to an Event of a berth-managed
	// sandbox; ok is false for a message berth ignores. It runs on the
	// loop's goroutine, one message at a time.
	Translate(ctx context.Context, m M) (ev Event, ok bool)
}

// WatchEvents is the body of every backend's Runtime.Watch once the engine
// answered: it subscribes (src.Subscribe, then src.Seed) and delivers the
// translated events on the returned channel until ctx ends or the engine's
// stream fails or closes. Then it ends the subscription and closes the
// channel; the caller re-Lists and watches again. A stream failure while
// ctx lives is logged (as "<engine> event stream ended", with err).
func WatchEvents[M any](ctx context.Context, log *slog.Logger, engine string, src EngineEvents[M]) (<-chan Event, error) {
	ctx, cancel := context.WithCancel(ctx)
	msgs, errs := src.Subscribe(ctx)
	if err := src.Seed(ctx); err != nil {
		cancel()
		return nil, err
	}
	out := make(chan Event, watchBuffer)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-errs:
				if err != nil && ctx.Err() == nil {
					log.Warn(engine+" event stream ended", "err", err)
				}
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				ev, ok := src.Translate(ctx, m)
				if !ok {
					continue
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
