package terminal

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/agent/process"
)

func TestMain(m *testing.M) {
	// Every test ends what it starts: no child may be left.
	os.Exit(testenv.NoChildrenLeft(m.Run(), 5*time.Second))
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newManager returns a Manager over a plain process.Runner, closed when the
// test ends.
func newManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	if cfg.Commands == nil {
		r := process.NewRunner(process.Config{WorkDir: t.TempDir(), Logger: discard()})
		t.Cleanup(r.Close)
		cfg.Commands = r
	}
	if cfg.Logger == nil {
		cfg.Logger = discard()
	}
	m := New(cfg)
	t.Cleanup(m.Close)
	return m
}

// mustOpen opens a session or fails the test.
func mustOpen(t testing.TB, m *Manager, spec Spec) *Session {
	t.Helper()
	s, err := m.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// screen collects what one attachment receives.
type screen struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	err  error // how Next ended
	done chan struct{}
	wake chan struct{}
}

// watch reads a into a screen until it ends; the replay comes first.
func watch(t testing.TB, a *Attachment) *screen {
	t.Helper()
	s := &screen{done: make(chan struct{}), wake: make(chan struct{}, 1)}
	s.buf.Write(a.Replay())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); <-s.done })
	go func() {
		defer close(s.done)
		for {
			b, err := a.Next(ctx)
			s.mu.Lock()
			if err != nil {
				s.err = err
			} else {
				s.buf.Write(b)
			}
			s.mu.Unlock()
			select {
			case s.wake <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the screen holds want (after from bytes), and returns
// the screen's length after it.
func (s *screen) waitFor(t testing.TB, want string, from int) int {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		got := s.String()
		if from > len(got) {
			from = len(got)
		}
		if i := strings.Index(got[from:], want); i >= 0 {
			return from + i + len(want)
		}
		select {
		case <-s.wake:
		case <-s.done:
			if got := s.String(); !strings.Contains(got[from:], want) {
				t.Fatalf("attachment ended (%v) without %q; screen ends:\n%q", s.err, want, tail(got))
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %q; screen ends:\n%q", want, tail(s.String()))
		}
	}
}

// ended waits until the attachment ended and returns why.
func (s *screen) ended(t testing.TB) error {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("attachment did not end; screen ends:\n%q", tail(s.String()))
	}
	return s.err
}

// typeIn writes input to the session.
func typeIn(t testing.TB, s *Session, input string) {
	t.Helper()
	if _, err := s.Write([]byte(input)); err != nil {
		t.Fatalf("write %q: %v", input, err)
	}
}

// waitDone waits for the session to end and returns its exit.
func waitDone(t testing.TB, s *Session) Exit {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("session %s did not end", s.ID())
	}
	e, ok := s.Exit()
	if !ok {
		t.Fatal("Done closed but no exit")
	}
	return e
}

// tail is the end of a screen, for failure messages.
func tail(s string) string { return s[max(0, len(s)-1500):] }

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	st, ok := readStat(pid)
	return ok && st.live()
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
