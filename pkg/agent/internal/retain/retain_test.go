package retain

import (
	"cmp"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestCountBoundForgetsOldestFirst(t *testing.T) {
	var mu sync.Mutex
	var dropped []int
	l := New(&mu, 2, time.Hour, func(v int) { dropped = append(dropped, v) }, cmp.Compare[int])
	mu.Lock()
	l.Add(3)
	l.Add(1) // sorts before 3
	l.Add(2) // three kept would exceed 2: 1, the oldest, goes
	got := slices.Clone(l.items)
	mu.Unlock()
	if !slices.Equal(dropped, []int{1}) || !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("dropped %v, kept %v; want dropped [1], kept [2 3]", dropped, got)
	}
}

func TestAppendOrderWithoutCmp(t *testing.T) {
	var mu sync.Mutex
	var dropped []string
	l := New(&mu, 1, time.Hour, func(v string) { dropped = append(dropped, v) }, nil)
	mu.Lock()
	l.Add("b")
	l.Add("a")
	mu.Unlock()
	if !slices.Equal(dropped, []string{"b"}) || l.Len() != 1 {
		t.Fatalf("dropped %v, len %d; want [b], 1", dropped, l.Len())
	}
}

func TestTTLForgetsUnderTheOwnersLock(t *testing.T) {
	var mu sync.Mutex
	done := make(chan int, 1)
	l := New(&mu, 10, 20*time.Millisecond, func(v int) {
		if mu.TryLock() {
			mu.Unlock()
			t.Error("drop ran without the owner's lock held")
		}
		done <- v
	}, nil)
	mu.Lock()
	l.Add(7)
	mu.Unlock()
	select {
	case v := <-done:
		if v != 7 {
			t.Fatalf("dropped %d, want 7", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("record not forgotten after its retention")
	}
	mu.Lock()
	defer mu.Unlock()
	if l.Len() != 0 || len(l.timers) != 0 {
		t.Fatalf("after expiry: %d records, %d timers; want 0, 0", l.Len(), len(l.timers))
	}
}

func TestForgetAndClearStopTimers(t *testing.T) {
	var mu sync.Mutex
	drops := 0
	l := New(&mu, 10, 30*time.Millisecond, func(int) { drops++ }, nil)
	mu.Lock()
	l.Add(1)
	l.Add(2)
	l.Forget(1)
	l.Clear()
	mu.Unlock()
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if drops != 1 || l.Len() != 0 {
		t.Fatalf("drops %d, len %d; want 1 (Forget only), 0", drops, l.Len())
	}
}
