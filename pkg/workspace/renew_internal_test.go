package workspace

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// scriptedAPI answers Renew from a script of errors (nil: success).
type scriptedAPI struct {
	mu     sync.Mutex
	script []error
	calls  int
	ttls   []time.Duration
}

func (a *scriptedAPI) Acquire(context.Context, *orchv1.AcquireRequest) (*orchv1.AcquireResponse, error) {
	return nil, errors.New("not used")
}

func (a *scriptedAPI) Renew(_ context.Context, id string, ttl time.Duration) (*orchv1.Lease, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	a.ttls = append(a.ttls, ttl)
	var err error
	if len(a.script) > 0 {
		err, a.script = a.script[0], a.script[1:]
	}
	if err != nil {
		return nil, err
	}
	return &orchv1.Lease{Id: id, ExpiresAt: timestamppb.New(time.Now().Add(ttl))}, nil
}

func (a *scriptedAPI) Release(context.Context, string, string) (*orchv1.Lease, error) {
	return nil, errors.New("not used")
}

func (a *scriptedAPI) Pause(context.Context, string, string) (*orchv1.Lease, error) {
	return nil, errors.New("not used")
}

func (a *scriptedAPI) Resume(context.Context, string) (*orchv1.Lease, error) {
	return nil, errors.New("not used")
}

func (a *scriptedAPI) Close() error { return nil }

func (a *scriptedAPI) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

func newTestLeased(api leaseAPI, every time.Duration) *Leased {
	return &Leased{
		cfg: LeasedConfig{TTL: 7 * time.Second}, api: api, every: every, done: make(chan struct{}),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), lease: LeaseInfo{ID: "lease-1"},
	}
}

func waitDone(t *testing.T, l *Leased) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewal loop did not end")
	}
}

func TestRenewLoopRetriesTransientAndStopsOnLoss(t *testing.T) {
	api := &scriptedAPI{script: []error{
		errdefs.Unavailable("orchestrator restarting"),
		context.DeadlineExceeded,
		errors.New("connection reset"),
		nil,
		nil,
		errdefs.FailedPrecondition("lease lease-1 is EXPIRED: ttl passed"),
	}}
	l := newTestLeased(api, 30*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := time.Now()
	go l.renewLoop(ctx)
	waitDone(t, l)

	if n := api.count(); n != 6 {
		t.Fatalf("Renew called %d times, want 6 (3 failures retried, 2 successes, then the loss)", n)
	}
	for _, ttl := range api.ttls {
		if ttl != 7*time.Second {
			t.Fatalf("renewed with ttl %s, want the configured 7s", ttl)
		}
	}
	err := l.Err()
	if !errors.Is(err, ErrLeaseLost) || !errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", err)
	}
	if got := l.Lease().ExpiresAt; !got.After(before) {
		t.Fatalf("ExpiresAt %s was not updated by the successful renewals", got)
	}
	if err := l.check(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("check() = %v", err)
	}
}

func TestRenewLoopStopsOnNotFound(t *testing.T) {
	api := &scriptedAPI{script: []error{errdefs.NotFound("lease lease-1")}}
	l := newTestLeased(api, 10*time.Millisecond)
	go l.renewLoop(context.Background())
	waitDone(t, l)
	if err := l.Err(); !errors.Is(err, ErrLeaseLost) || errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Err() = %v, want ErrLeaseLost (and not NotFound, which would read as a missing file)", err)
	}
}

func TestRenewLoopEndsWithItsContext(t *testing.T) {
	api := &scriptedAPI{}
	l := newTestLeased(api, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	go l.renewLoop(ctx)
	// Wait for the first renewal (an event), not a fixed time a loaded
	// machine may not give the loop.
	deadline := time.Now().Add(10 * time.Second)
	for api.count() == 0 {
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("no renewal in 10s with a 10ms interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	waitDone(t, l)
	if err := l.Err(); err != nil {
		t.Fatalf("Err() = %v after a clean stop", err)
	}
}
