// Package retain keeps the records of ended things (background processes,
// terminal sessions) visible for a while after they end: at most a number of
// them, each for at most a duration, the oldest forgotten first. The owner
// keeps its own index of the records (by id); List only decides when one is
// forgotten and tells the owner through its drop function.
package retain

import (
	"slices"
	"sync"
	"time"
)

// List is a bounded, time-limited list of ended records. Its methods must
// be called with the owner's lock held (the Locker given to New); its
// timers take that lock themselves.
type List[T comparable] struct {
	mu     sync.Locker
	max    int
	ttl    time.Duration
	drop   func(T)
	cmp    func(a, b T) int
	items  []T
	timers map[T]*time.Timer
}

// New returns a List that keeps at most max records, each for ttl. drop is
// called, with mu held, when a record is forgotten (by age, by count or by
// Forget). cmp orders the records, oldest first; nil keeps them in the order
// they were added.
func New[T comparable](mu sync.Locker, max int, ttl time.Duration, drop func(T), cmp func(a, b T) int) *List[T] {
	return &List[T]{mu: mu, max: max, ttl: ttl, drop: drop, cmp: cmp, timers: make(map[T]*time.Timer)}
}

// Add keeps v, forgetting the oldest records beyond the maximum, and
// forgets v itself once the retention has passed.
func (l *List[T]) Add(v T) {
	if l.cmp == nil {
		l.items = append(l.items, v)
	} else {
		i, _ := slices.BinarySearchFunc(l.items, v, l.cmp)
		l.items = slices.Insert(l.items, i, v)
	}
	for len(l.items) > l.max {
		l.Forget(l.items[0])
	}
	if !slices.Contains(l.items, v) {
		return
	}
	l.timers[v] = time.AfterFunc(l.ttl, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.Forget(v)
	})
}

// Forget drops v now: its timer stops and drop is called. Forgetting a
// record the List does not hold only calls drop.
func (l *List[T]) Forget(v T) {
	if t, ok := l.timers[v]; ok {
		t.Stop()
		delete(l.timers, v)
	}
	if i := slices.Index(l.items, v); i >= 0 {
		l.items = slices.Delete(l.items, i, i+1)
	}
	l.drop(v)
}

// Clear stops every timer and empties the List without calling drop (the
// owner is discarding its index as a whole).
func (l *List[T]) Clear() {
	for v, t := range l.timers {
		t.Stop()
		delete(l.timers, v)
	}
	l.items = nil
}

// Len returns the number of records kept.
func (l *List[T]) Len() int { return len(l.items) }
