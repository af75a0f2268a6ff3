package runtime_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
)

// fakeEngine is an EngineEvents over string messages: "die:<id>" becomes a
// died event, anything else is ignored.
type fakeEngine struct {
	msgs    chan string
	errs    chan error
	seedErr error
	subCtx  context.Context
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{msgs: make(chan string, 4), errs: make(chan error, 1)}
}

func (f *fakeEngine) Subscribe(ctx context.Context) (<-chan string, <-chan error) {
	f.subCtx = ctx
	return f.msgs, f.errs
}

func (f *fakeEngine) Seed(context.Context) error { return f.seedErr }

func (f *fakeEngine) Translate(_ context.Context, m string) (runtime.Event, bool) {
	if len(m) > 4 && m[:4] == "die:" {
		return runtime.Event{Kind: runtime.EventDied, ID: m[4:]}, true
	}
	return runtime.Event{}, false
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// next returns the next event, or ok false when the channel closed.
func next(t *testing.T, ch <-chan runtime.Event) (runtime.Event, bool) {
	t.Helper()
	select {
	case ev, ok := <-ch:
		return ev, ok
	case <-time.After(5 * time.Second):
		t.Fatal("no event and no close within 5s")
		return runtime.Event{}, false
	}
}

// TestWatchEvents: translated messages are delivered, ignored ones are
// not, and a stream error closes the channel and ends the subscription.
func TestWatchEvents(t *testing.T) {
	f := newFakeEngine()
	ch, err := runtime.WatchEvents[string](context.Background(), discard, "fake", f)
	if err != nil {
		t.Fatal(err)
	}
	f.msgs <- "start:c0"
	f.msgs <- "die:c1"
	if ev, ok := next(t, ch); !ok || ev.ID != "c1" || ev.Kind != runtime.EventDied {
		t.Fatalf("event = %+v (open %v), want c1 died", ev, ok)
	}
	f.errs <- errors.New("engine restarted")
	if ev, ok := next(t, ch); ok {
		t.Fatalf("event %+v after a stream error, want the channel closed", ev)
	}
	if f.subCtx.Err() == nil {
		t.Error("the subscription's context lives on after the watch ended")
	}
}

// TestWatchEventsEnds: the channel closes when ctx ends and when the
// engine closes its stream.
func TestWatchEventsEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := runtime.WatchEvents[string](ctx, discard, "fake", newFakeEngine())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, ok := next(t, ch); ok {
		t.Error("event after ctx ended, want the channel closed")
	}
	f := newFakeEngine()
	ch, err = runtime.WatchEvents[string](context.Background(), discard, "fake", f)
	if err != nil {
		t.Fatal(err)
	}
	close(f.msgs)
	if _, ok := next(t, ch); ok {
		t.Error("event after the stream closed, want the channel closed")
	}
}

// TestWatchEventsSeedError: a failing Seed fails the Watch and ends the
// subscription it made.
func TestWatchEventsSeedError(t *testing.T) {
	f := newFakeEngine()
	f.seedErr = errors.New("list failed")
	if _, err := runtime.WatchEvents[string](context.Background(), discard, "fake", f); !errors.Is(err, f.seedErr) {
		t.Fatalf("WatchEvents = %v, want the Seed error", err)
	}
	if f.subCtx.Err() == nil {
		t.Error("the subscription's context lives on after Seed failed")
	}
}
