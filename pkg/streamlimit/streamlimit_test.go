package streamlimit

import (
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestLimiter checks the per-caller count: the slot past the limit is
// RESOURCE_EXHAUSTED naming the limit, other callers are not affected,
// and a released slot (released twice) is free again once.
func TestLimiter(t *testing.T) {
	l := New(2)
	a := Lease("l1")
	r1, err := l.Acquire(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(a); err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(a)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "stream limit: at most 2 concurrent streams per caller") {
		t.Fatalf("third stream: %v", err)
	}
	if _, err := l.Acquire(Client("l1")); err != nil {
		t.Fatalf("another caller: %v", err)
	}
	if _, err := l.Acquire(Operator); err != nil {
		t.Fatalf("the operator: %v", err)
	}
	r1()
	r1()
	if got := l.Open(a); got != 1 {
		t.Fatalf("%d open after a double release, want 1", got)
	}
	if _, err := l.Acquire(a); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := l.Acquire(a); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("past the limit again: %v", err)
	}
}

// TestLimiterUnlimited checks that nil and a zero max allow everything.
func TestLimiterUnlimited(t *testing.T) {
	for _, l := range []*Limiter{nil, New(0)} {
		for range 100 {
			if _, err := l.Acquire(Operator); err != nil {
				t.Fatal(err)
			}
		}
		if l.Max() != 0 {
			t.Fatalf("Max = %d", l.Max())
		}
	}
}

// TestLimiterConcurrent races acquires of one caller: exactly max win.
func TestLimiterConcurrent(t *testing.T) {
	l := New(5)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for range 50 {
		wg.Go(func() {
			if _, err := l.Acquire(Lease("x")); err == nil {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if won != 5 {
		t.Fatalf("%d acquires won, want 5", won)
	}
}
