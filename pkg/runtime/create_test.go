package runtime_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

func TestTailLines(t *testing.T) {
	for _, tc := range []struct {
		text string
		n    int
		want string
	}{
		{"", 3, ""},
		{"\n\n", 3, ""},
		{"one", 3, "  one"},
		{"a\r\nb\r\nc\n", 3, "  a\n  b\n  c"},
		{"a\nb\nc\nd\n", 2, "  c\n  d"},
	} {
		if got := runtime.TailLines(tc.text, tc.n); got != tc.want {
			t.Errorf("TailLines(%q, %d) = %q, want %q", tc.text, tc.n, got, tc.want)
		}
	}
}

type ctxKey struct{}

// TestDetached: the context outlives its parent's cancellation, keeps its
// values and is bounded by CleanupTimeout.
func TestDetached(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancelParent()
	ctx, cancel := runtime.Detached(parent)
	defer cancel()
	if ctx.Err() != nil || ctx.Value(ctxKey{}) != "v" {
		t.Errorf("Detached: err %v, value %v", ctx.Err(), ctx.Value(ctxKey{}))
	}
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > runtime.CleanupTimeout {
		t.Errorf("Detached deadline %v (ok %v), want within %s", dl, ok, runtime.CleanupTimeout)
	}
}

// fakeBackend records what the shared Create logic asks of a backend.
type fakeBackend struct {
	removed  []string
	removeOK bool // whether ctx was still live during Remove
	rmErr    error
	output   string
}

func (f *fakeBackend) backend() runtime.Backend {
	return runtime.Backend{
		Name: "fake", Noun: "box",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Output: func(_ context.Context, id string, n int) string {
			return runtime.TailLines(f.output, n)
		},
		Remove: func(ctx context.Context, id string) error {
			f.removed = append(f.removed, id)
			f.removeOK = ctx.Err() == nil
			return f.rmErr
		},
	}
}

// TestCreationTimeout: only the Create's own deadline turns an error into
// "not ready within" (Unavailable, still DeadlineExceeded); the caller's
// cancellation and errors before the deadline pass through.
func TestCreationTimeout(t *testing.T) {
	f := &fakeBackend{}
	cause := errdefs.FailedPrecondition("agent exited")

	cr, ctx, cancel := f.backend().BeginCreate(context.Background(), runtime.Spec{ReadyTimeout: time.Nanosecond}, time.Hour)
	defer cancel()
	<-ctx.Done()
	err := cr.Err(cause)
	if !errdefs.IsUnavailable(err) || !errors.Is(err, cause) || !strings.Contains(err.Error(), "fake: sandbox not ready within 1ns (ReadyTimeout)") {
		t.Errorf("own deadline: %v", err)
	}
	if err := cr.Err(ctx.Err()); !errors.Is(err, context.DeadlineExceeded) || !errdefs.IsUnavailable(err) {
		t.Errorf("own deadline, context error: %v", err)
	}
	if un := errdefs.Unavailable("engine down"); cr.Err(un) != un {
		t.Errorf("an Unavailable error was wrapped again")
	}
	if cr.Err(nil) != nil {
		t.Errorf("nil became an error")
	}

	// The default bound applies when the spec has none.
	cr, ctx, cancel = f.backend().BeginCreate(context.Background(), runtime.Spec{}, time.Hour)
	defer cancel()
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
		t.Errorf("default bound: deadline %v (ok %v)", dl, ok)
	}
	if cr.Err(cause) != cause {
		t.Errorf("an error before the deadline was changed")
	}

	// The caller gave up (its own deadline): its error is not ours to explain.
	parent, pcancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer pcancel()
	cr, ctx, cancel = f.backend().BeginCreate(parent, runtime.Spec{ReadyTimeout: time.Hour}, 0)
	defer cancel()
	<-ctx.Done()
	if cr.Err(cause) != cause {
		t.Errorf("the caller's deadline was reported as the ready timeout")
	}
}

// TestCreationFail: the half-created sandbox is removed even though the
// caller has given up, and the error keeps its category and carries the
// output and a failed removal.
func TestCreationFail(t *testing.T) {
	f := &fakeBackend{output: "line1\nline2\n"}
	parent, cancelParent := context.WithCancel(context.Background())
	cr, _, cancel := f.backend().BeginCreate(parent, runtime.Spec{}, time.Hour)
	defer cancel()
	cancelParent()
	cause := errdefs.FailedPrecondition("cannot start")
	err := cr.Fail("id1", "lease1", cause)
	if len(f.removed) != 1 || f.removed[0] != "id1" || !f.removeOK {
		t.Errorf("removed %v (context live: %v)", f.removed, f.removeOK)
	}
	if !errdefs.IsFailedPrecondition(err) || !errors.Is(err, cause) || !strings.HasSuffix(err.Error(), "\nbox output (last 20 lines):\n  line1\n  line2") {
		t.Errorf("Fail = %v", err)
	}

	f = &fakeBackend{rmErr: errors.New("engine busy")}
	cr, _, cancel = f.backend().BeginCreate(context.Background(), runtime.Spec{}, time.Hour)
	defer cancel()
	err = cr.Fail("id2", "lease2", cause)
	if !errors.Is(err, cause) || !strings.Contains(err.Error(), "(removing box id2 also failed: engine busy)") || strings.Contains(err.Error(), "output") {
		t.Errorf("Fail with a failed removal = %v", err)
	}
}

// TestBackendErrors: the categories and wording of the errors every
// backend reports alike.
func TestBackendErrors(t *testing.T) {
	b := runtime.Backend{Name: "docker", Noun: "container"}
	engineErr := errors.New("name already in use")
	if err := b.AlreadyExists("l1", "berth-l1", engineErr); !errdefs.IsAlreadyExists(err) || !errors.Is(err, engineErr) ||
		!strings.Contains(err.Error(), "docker: a sandbox for lease l1 already exists (container berth-l1)") {
		t.Errorf("AlreadyExists = %v", err)
	}

	runc := errors.New("runc: exec: no such file")
	err := b.StartErr("c1", runc, errdefs.Internal("docker: start container c1: %v", runc))
	if !errdefs.IsFailedPrecondition(err) || !errors.Is(err, runc) || !strings.Contains(err.Error(), "docker: container c1 cannot start") {
		t.Errorf("StartErr(internal) = %v", err)
	}
	notFound := errdefs.NotFound("container c1")
	if got := b.StartErr("c1", runc, notFound); got != notFound {
		t.Errorf("StartErr(not found) = %v, want it unchanged", got)
	}

	err = b.ExitedErr("c1", 137, true, "exec failed")
	if !errdefs.IsFailedPrecondition(err) || err.Error() != "failed precondition: docker: container c1 exited with code 137 before the agent was ready (OOM-killed: raise the memory limit): exec failed" {
		t.Errorf("ExitedErr = %v", err)
	}
	if err := (runtime.Backend{Name: "containerd", Noun: "sandbox"}).ExitedErr("s1", 1, false, ""); err.Error() != "failed precondition: containerd: sandbox s1 exited with code 1 before the agent was ready" {
		t.Errorf("ExitedErr = %v", err)
	}
}
