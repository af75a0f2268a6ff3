package process

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

func TestMain(m *testing.M) {
	// Every test cleans up what it starts: no child may be left.
	os.Exit(testenv.NoChildrenLeft(m.Run(), 3*time.Second))
}

// newRunner returns a Runner that is closed when the test ends.
func newRunner(t testing.TB, cfg Config) *Runner {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r := NewRunner(cfg)
	t.Cleanup(r.Close)
	return r
}

// requireGroupGone fails unless no live process is left in process group
// pgid within a short time.
func requireGroupGone(t *testing.T, pgid int) {
	t.Helper()
	if pgid <= 0 {
		t.Fatalf("bad pgid %d", pgid)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := testenv.LiveProcs(func(_, _, g int) bool { return g == pgid })
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, s := range left { // clean up anyway
				pid, _ := strconv.Atoi(s[:strings.IndexByte(s, '(')])
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("processes left in group %d: %v", pgid, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExited polls until background process id has exited.
func waitExited(t *testing.T, r *Runner, id string) Info {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := r.Get(id)
		if err != nil {
			t.Fatalf("Get(%s): %v", id, err)
		}
		if in.State == StateExited {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %s did not exit: %+v", id, in)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// collector gathers events; safe for concurrent inspection.
type collector struct {
	mu     sync.Mutex
	events []Event
	at     []time.Time
	notify chan struct{}
}

func newCollector() *collector { return &collector{notify: make(chan struct{}, 1)} }

func (c *collector) emit(ev Event) error {
	c.mu.Lock()
	c.events = append(c.events, ev)
	c.at = append(c.at, time.Now())
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return nil
}

func (c *collector) snapshot() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Event(nil), c.events...)
}

// output returns the concatenated data of one kind.
func (c *collector) output(kind EventKind) string {
	return joinOutput(c.snapshot(), kind)
}

func joinOutput(evs []Event, kind EventKind) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == kind {
			b.Write(ev.Data)
		}
	}
	return b.String()
}

// waitFor waits until cond holds on the collected events.
func (c *collector) waitFor(t *testing.T, what string, cond func([]Event) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		if cond(c.snapshot()) {
			return
		}
		select {
		case <-c.notify:
		case <-time.After(20 * time.Millisecond):
		case <-timeout:
			t.Fatalf("timed out waiting for %s; events: %v", what, c.snapshot())
		}
	}
}

func wantCategory(t *testing.T, err error, sentinel error, field string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error = %v, want %v", err, sentinel)
	}
	if field != "" && !strings.Contains(err.Error(), field) {
		t.Fatalf("error %q does not name %q", err, field)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
