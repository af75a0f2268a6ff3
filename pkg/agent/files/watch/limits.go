package watch

import (
	"sync"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Limits bounds the watches that share it (the agent has one per
// sandbox): how many run at once, and how many directories they watch
// together (it is their Budget). The zero value allows nothing; use
// NewLimits.
type Limits struct {
	mu                  sync.Mutex
	watches, dirs       int
	maxWatches, maxDirs int
}

// NewLimits returns Limits of at most maxWatches watches and maxDirs
// watched directories.
func NewLimits(maxWatches, maxDirs int) *Limits {
	return &Limits{maxWatches: maxWatches, maxDirs: maxDirs}
}

// StartWatch counts one more running watch, or fails with
// errdefs.ErrResourceExhausted at the maximum.
func (l *Limits) StartWatch() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watches >= l.maxWatches {
		return errdefs.ResourceExhausted("watch: %d watches are running, the most this sandbox allows", l.watches)
	}
	l.watches++
	return nil
}

// EndWatch counts one running watch less.
func (l *Limits) EndWatch() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watches--
}

// Acquire takes n watched directories, or fails with
// errdefs.ErrResourceExhausted beyond the maximum.
func (l *Limits) Acquire(n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dirs+n > l.maxDirs {
		return errdefs.ResourceExhausted("more than %d directories watched in this sandbox", l.maxDirs)
	}
	l.dirs += n
	return nil
}

// Release gives n watched directories back.
func (l *Limits) Release(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dirs -= n
}

// InUse returns the running watches and the watched directories.
func (l *Limits) InUse() (watches, dirs int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.watches, l.dirs
}
