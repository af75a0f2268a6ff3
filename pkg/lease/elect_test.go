package lease

import (
	"context"
	"testing"
	"time"
)

// With FleetConfig.Elect, expiry runs only while this replica leads: a lease
// past its TTL stays READY until Elect calls lead, and expires then.
func TestElectGatesExpiry(t *testing.T) {
	elected := make(chan struct{})
	elect := func(ctx context.Context, lead func(context.Context)) error {
		select {
		case <-elected:
			lead(ctx)
		case <-ctx.Done():
		}
		return ctx.Err()
	}
	h := newHarness(t, func(c *Config) { c.Fleet.Elect = elect })
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c", TTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // several reap intervals past the TTL
	if got := h.get(l.ID); got.State != StateReady {
		t.Fatalf("not elected, yet the lease is %s", got.State)
	}
	close(elected)
	eventually(t, 2*time.Second, "expired once elected", func() bool {
		return h.get(l.ID).State == StateExpired
	})
}
