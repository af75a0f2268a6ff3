package periodic

import (
	"context"
	"testing"
	"time"
)

// TestRun checks that Run calls fn at each tick and returns once its
// context ends.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, 5*time.Millisecond, func(context.Context) { calls <- struct{}{} })
	}()
	for range 3 {
		select {
		case <-calls:
		case <-time.After(5 * time.Second):
			t.Fatal("fn was not called")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
