// Package inproc is a runtime.Runtime that runs each sandbox's agent as a
// server inside the current process, on a loopback port, with its own
// temporary workspace. It isolates nothing: it exists for tests of the lease
// manager, the API and the proxy that need real agents but not Docker, and
// for development on machines without a container engine.
package inproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Runtime runs agents in-process. The zero value is not usable; call New.
type Runtime struct {
	log     *slog.Logger
	mu      sync.Mutex
	boxes   map[string]*box
	subs    map[chan runtime.Event]struct{}
	baseDir string
	// CreateHook, when set, runs at the start of every Create; a returned
	// error fails the create (tests use it to inject faults or delays).
	CreateHook func(ctx context.Context, spec runtime.Spec) error
}

type box struct {
	sb     runtime.Sandbox
	cancel context.CancelFunc
	done   chan struct{}
	dir    string
	state  string // the agent's state directory (runtime.Sandbox.StateDir)
	token  string // the agent's token, for Restart
}

// New returns a Runtime whose workspaces live under baseDir (a temp dir
// when empty).
func New(baseDir string, log *slog.Logger) (*Runtime, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if baseDir == "" {
		d, err := os.MkdirTemp("", "berth-inproc-")
		if err != nil {
			return nil, err
		}
		baseDir = d
	}
	return &Runtime{log: log, boxes: map[string]*box{}, subs: map[chan runtime.Event]struct{}{}, baseDir: baseDir}, nil
}

// Create starts an agent for spec and waits until it listens.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if spec.LeaseID == "" {
		return runtime.Sandbox{}, errdefs.InvalidArgument("lease_id", "required")
	}
	if r.CreateHook != nil {
		if err := r.CreateHook(ctx, spec); err != nil {
			return runtime.Sandbox{}, err
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := "inproc-" + hex.EncodeToString(b[:])
	dir, err := os.MkdirTemp(r.baseDir, id+"-")
	if err != nil {
		return runtime.Sandbox{}, fmt.Errorf("inproc: workspace: %w", err)
	}
	// Beside the workspace, not in it: commands do not see it.
	state, err := os.MkdirTemp(r.baseDir, id+"-state-")
	if err != nil {
		_ = os.RemoveAll(dir)
		return runtime.Sandbox{}, fmt.Errorf("inproc: agent state: %w", err)
	}
	endpoint, cancel, done, err := r.serve(id, spec.AgentToken, dir, state)
	if err != nil {
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(state)
		return runtime.Sandbox{}, err
	}
	bx := &box{cancel: cancel, done: done, dir: dir, state: state, token: spec.AgentToken, sb: runtime.Sandbox{
		ID: id, Name: "berth-" + spec.LeaseID, Image: spec.Image, State: runtime.StateRunning,
		Endpoint: endpoint, StateDir: state, CreatedAt: time.Now(),
	}}
	bx.sb.SetLabels(runtime.SandboxLabels(spec, ""))
	if spec.Resources.DiskBytes > 0 {
		bx.sb.DiskEnforcement = runtime.DiskEnforcementBerth
	}
	r.mu.Lock()
	r.boxes[id] = bx
	r.mu.Unlock()
	return bx.sb, nil
}

// Get returns one sandbox.
func (r *Runtime) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	bx, ok := r.boxes[id]
	if !ok {
		return runtime.Sandbox{}, errdefs.NotFound("sandbox %s", id)
	}
	return bx.sb, nil
}

// List returns the sandboxes whose labels match sel.
func (r *Runtime) List(_ context.Context, sel runtime.Selector) ([]runtime.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []runtime.Sandbox
	for _, bx := range r.boxes {
		if sel.Matches(bx.sb.Labels) {
			sb := bx.sb
			sb.Labels = maps.Clone(sb.Labels)
			out = append(out, sb)
		}
	}
	return out, nil
}

// Stop stops a sandbox's agent; the sandbox stays listed as exited.
func (r *Runtime) Stop(_ context.Context, id string, _ time.Duration) error {
	return r.Kill(id, 0)
}

// Kill stops a sandbox's agent as if its container died with exitCode,
// and reports a died event (tests simulate crashes with it).
func (r *Runtime) Kill(id string, exitCode int) error {
	r.mu.Lock()
	bx, ok := r.boxes[id]
	if !ok {
		r.mu.Unlock()
		return errdefs.NotFound("sandbox %s", id)
	}
	bx.sb.State, bx.sb.ExitCode = runtime.StateExited, exitCode
	cancel, done := bx.cancel, bx.done // Restart replaces them
	r.mu.Unlock()
	cancel()
	<-done
	r.emit(runtime.Event{Kind: runtime.EventDied, ID: id, LeaseID: bx.sb.LeaseID, ExitCode: exitCode, At: time.Now()})
	return nil
}

// Remove stops and forgets a sandbox; a missing one is success.
func (r *Runtime) Remove(_ context.Context, id string) error {
	r.mu.Lock()
	bx, ok := r.boxes[id]
	delete(r.boxes, id)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	bx.cancel()
	<-bx.done
	_ = os.RemoveAll(bx.dir)
	_ = os.RemoveAll(bx.state)
	r.emit(runtime.Event{Kind: runtime.EventRemoved, ID: id, LeaseID: bx.sb.LeaseID, At: time.Now()})
	return nil
}

// Watch delivers events until ctx ends.
func (r *Runtime) Watch(ctx context.Context) (<-chan runtime.Event, error) {
	ch := make(chan runtime.Event, 64)
	r.mu.Lock()
	r.subs[ch] = struct{}{}
	r.mu.Unlock()
	go func() {
		<-ctx.Done()
		r.mu.Lock()
		delete(r.subs, ch)
		close(ch)
		r.mu.Unlock()
	}()
	return ch, nil
}

func (r *Runtime) emit(ev runtime.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// Usage sums the sizes of the regular files in the sandbox's workspace (its
// whole "writable layer" in-process).
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	r.mu.Lock()
	bx, ok := r.boxes[id]
	r.mu.Unlock()
	if !ok {
		return runtime.Usage{}, errdefs.NotFound("sandbox %s", id)
	}
	var n int64
	err := filepath.WalkDir(bx.dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished while walking: not counted
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("inproc: usage of %s: %w", id, err)
	}
	return runtime.Usage{DiskBytes: n, MeasuredAt: time.Now()}, nil
}

// Ping always succeeds.
func (r *Runtime) Ping(context.Context) error { return nil }

// Close removes every sandbox.
func (r *Runtime) Close() error {
	r.mu.Lock()
	ids := make([]string, 0, len(r.boxes))
	for id := range r.boxes {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	for _, id := range ids {
		_ = r.Remove(context.Background(), id)
	}
	return nil
}

var _ runtime.Runtime = (*Runtime)(nil)
