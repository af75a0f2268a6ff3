package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Bounds and reporting shared by the backends' Create.
const (
	// DefaultReadyTimeout bounds a Create (create, inject, start, health)
	// when neither the Spec nor the backend's configuration sets a bound.
	DefaultReadyTimeout = 30 * time.Second
	// CleanupTimeout bounds work that must finish although the caller gave
	// up (see Detached): removing a half-created sandbox, and an engine call
	// that may create something, where cancelling it half-way would leave an
	// object nobody knows about.
	CleanupTimeout = 20 * time.Second
	// LogTail is how many of a sandbox's last output lines the error of a
	// failed Create carries.
	LogTail = 20
)

// Detached returns a context with ctx's values but not its cancellation,
// bounded by CleanupTimeout: for cleanup, and for engine calls that must
// not be cut short, after which the caller checks ctx itself.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}

// TailLines returns the last n lines of text, each indented by two spaces
// and without a trailing carriage return, or "" when text has none: a
// sandbox's output as a failed Create reports it.
func TailLines(text string, n int) string {
	text = strings.TrimRight(text, "\n")
	if text == "" {
		return ""
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		lines[i] = "  " + strings.TrimRight(l, "\r")
	}
	return strings.Join(lines, "\n")
}

// Backend is what the shared Create logic needs to know of a backend: how
// to name things in messages, and how to read and remove a sandbox it
// created half-way. A backend builds it from itself; it holds no state.
type Backend struct {
	// Name prefixes messages: "docker", "containerd".
	Name string
	// Noun is what messages call the thing the engine creates:
	// "container" (Docker), "sandbox" (containerd: a container, a task, a
	// network namespace and host files).
	Noun string
	// Log receives a warning for every failed Create.
	Log *slog.Logger
	// Output returns up to the last n lines of a sandbox's output as
	// TailLines formats them, or "" when there are none or they cannot be
	// read.
	Output func(ctx context.Context, id string, n int) string
	// Remove removes a sandbox and everything it owns; a missing one is
	// success.
	Remove func(ctx context.Context, id string) error
}

// Creation is one Create in progress: the caller's context and the bound
// of the whole Create, against which Err and Fail explain failures.
type Creation struct {
	b       Backend
	parent  context.Context
	ctx     context.Context
	timeout time.Duration
}

// BeginCreate starts a Create of spec. It returns ctx, parent bounded by
// spec.ReadyTimeout (def when that is zero), and cancel, which the caller
// defers.
func (b Backend) BeginCreate(parent context.Context, spec Spec, def time.Duration) (c *Creation, ctx context.Context, cancel context.CancelFunc) {
	timeout := spec.ReadyTimeout
	if timeout == 0 {
		timeout = def
	}
	ctx, cancel = context.WithTimeout(parent, timeout)
	return &Creation{b: b, parent: parent, ctx: ctx, timeout: timeout}, ctx, cancel
}

// Err turns an error caused by the Create's own deadline into a clear "not
// ready within" error: Backend.TimeoutErr for this Create.
func (c *Creation) Err(err error) error {
	return c.b.TimeoutErr(c.parent, c.ctx, c.timeout, err)
}

// TimeoutErr turns err, met by work that ran under ctx (parent bounded by
// timeout, a ready timeout), into a clear "not ready within" error
// (errdefs.ErrUnavailable, still matching context.DeadlineExceeded) when
// ctx's own deadline caused it. Other errors, and all of them once parent
// is done (the caller gave up), pass through unchanged.
func (b Backend) TimeoutErr(parent, ctx context.Context, timeout time.Duration, err error) error {
	waitOwnDeadline(ctx, err)
	if err == nil || parent.Err() != nil || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return err
	}
	if errdefs.IsUnavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %s: sandbox not ready within %s (ReadyTimeout): %w", errdefs.ErrUnavailable, b.Name, timeout, err)
}

// Fail undoes a Create that got as far as creating sandbox id: it collects
// the sandbox's last LogTail output lines, removes it — with a Detached
// context, so even when the caller has given up — and returns Err(err)
// with the removal's failure (if any) and the lines appended. The
// category of err is kept.
func (c *Creation) Fail(id, leaseID string, err error) error {
	err = c.Err(err)
	ctx, cancel := Detached(c.parent)
	defer cancel()
	b := c.b
	lines := b.Output(ctx, id, LogTail)
	if rmErr := b.Remove(ctx, id); rmErr != nil {
		b.Log.Warn("cannot remove "+b.Noun+" of failed create", "container_id", id, "lease_id", leaseID, "err", rmErr)
		err = fmt.Errorf("%w (removing %s %s also failed: %v)", err, b.Noun, id, rmErr)
	}
	if lines != "" {
		err = fmt.Errorf("%w\n%s output (last %d lines):\n%s", err, b.Noun, LogTail, lines)
	}
	b.Log.Warn("create failed", "container_id", id, "lease_id", leaseID, "err", err)
	return err
}

// AlreadyExists is the error of a Create whose lease has a sandbox already
// (the engine refused the name or id derived from the lease): it is
// errdefs.ErrAlreadyExists, with the engine's error in the chain.
func (b Backend) AlreadyExists(leaseID, id string, err error) error {
	return fmt.Errorf("%w: %s: a sandbox for lease %s already exists (container %s): %w",
		errdefs.ErrAlreadyExists, b.Name, leaseID, id, err)
}

// StartErr maps the failure to start sandbox id, whose engine error err
// the backend mapped to mapped: what keeps a sandbox from starting (a
// missing user, an unusable working directory, a runc error) is reported
// by engines as a server error, but it is the image's or the spec's
// problem, so errdefs.ErrInternal becomes errdefs.ErrFailedPrecondition.
// Other categories pass through.
func (b Backend) StartErr(id string, err, mapped error) error {
	if errors.Is(mapped, errdefs.ErrInternal) {
		return fmt.Errorf("%w: %s: %s %s cannot start: %w", errdefs.ErrFailedPrecondition, b.Name, b.Noun, id, err)
	}
	return mapped
}

// ExitedErr is the error of a sandbox whose agent exited with code before
// it was ready (errdefs.ErrFailedPrecondition), saying so when the kernel
// OOM-killed it; detail, when not empty, is the engine's own explanation.
func (b Backend) ExitedErr(id string, code int, oomKilled bool, detail string) error {
	msg := fmt.Sprintf("%s: %s %s exited with code %d before the agent was ready", b.Name, b.Noun, id, code)
	if oomKilled {
		msg += " (OOM-killed: raise the memory limit)"
	}
	if detail != "" {
		msg += ": " + detail
	}
	return fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, msg)
}
