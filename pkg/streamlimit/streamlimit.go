// Package streamlimit bounds the long-lived streams one caller holds open
// at a time. The orchestrator shares one Limiter between its lease watches
// and log follows and the proxy's terminal attaches and file watches, so a
// caller's streams of every kind count against one limit.
package streamlimit

import (
	"sync"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// DefaultMax is the default number of concurrent streams per caller.
const DefaultMax = 16

// Caller keys: one per token. A lease token is its lease, a client token
// its owner; the operator token is one caller.
const (
	// Operator is the operator token's key.
	Operator     = "operator"
	leasePrefix  = "lease:"
	clientPrefix = "client:"
)

// Lease returns the key of lease id's token.
func Lease(id string) string { return leasePrefix + id }

// Client returns the key of the client tokens of owner.
func Client(owner string) string { return clientPrefix + owner }

// Limiter counts open streams per caller key. A nil Limiter, or one made
// with a max of zero or less, allows every stream. It is safe for
// concurrent use.
type Limiter struct {
	max  int
	mu   sync.Mutex
	open map[string]int
}

// New returns a Limiter of at most max concurrent streams per caller.
func New(max int) *Limiter {
	return &Limiter{max: max, open: map[string]int{}}
}

// Max returns the limit; 0 when there is none.
func (l *Limiter) Max() int {
	if l == nil || l.max <= 0 {
		return 0
	}
	return l.max
}

// Open returns how many streams caller holds open.
func (l *Limiter) Open(caller string) int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[caller]
}

// Acquire takes a stream slot of caller; the caller of Acquire calls
// release once the stream ends (release is idempotent). Past the limit it
// returns an error wrapping errdefs.ErrResourceExhausted (HTTP 429) that
// names the limit.
func (l *Limiter) Acquire(caller string) (release func(), err error) {
	if l == nil {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.open[caller] >= l.max {
		return nil, errdefs.Newf(errdefs.ErrResourceExhausted,
			"stream limit: at most %d concurrent streams per caller (lease watches, log follows, terminal attaches and file watches together); %d are open for this token, close one first",
			l.max, l.open[caller])
	}
	l.open[caller]++
	var once sync.Once
	return func() { once.Do(func() { l.release(caller) }) }, nil
}

func (l *Limiter) release(caller string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[caller]--; l.open[caller] <= 0 {
		delete(l.open, caller)
	}
}
