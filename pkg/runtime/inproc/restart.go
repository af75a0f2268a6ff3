package inproc

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"github.com/berth-dev/berth/pkg/agent"
	"github.com/berth-dev/berth/pkg/agent/statefile"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Restart starts a new agent for a sandbox that Kill or Stop ended, on the
// same workspace (its files are kept) and a new loopback port (the endpoint
// changes, as a container's address may). A running sandbox is returned as
// it is.
func (r *Runtime) Restart(_ context.Context, id string) (runtime.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	bx, ok := r.boxes[id]
	if !ok {
		return runtime.Sandbox{}, errdefs.NotFound("sandbox %s", id)
	}
	if bx.sb.State == runtime.StateRunning {
		return bx.sb, nil
	}
	endpoint, cancel, done, err := r.serve(id, bx.token, bx.dir, bx.state)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	bx.cancel, bx.done = cancel, done
	bx.sb.State, bx.sb.ExitCode, bx.sb.Endpoint = runtime.StateRunning, 0, endpoint
	return bx.sb, nil
}

// serve starts the agent of sandbox id, with token, the workspace dir and
// its state directory state, on a new loopback port: Create and Restart start it alike. It returns the
// agent's endpoint, and cancel, which stops it, and done, closed once it
// stopped.
func (r *Runtime) serve(id, token, dir, state string) (endpoint string, cancel context.CancelFunc, done chan struct{}, err error) {
	srv, err := agent.New(agent.Config{Token: token, WorkDir: dir, StateFile: filepath.Join(state, statefile.Name), Logger: r.log.With("sandbox", id)})
	if err != nil {
		return "", nil, nil, fmt.Errorf("inproc: agent: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, fmt.Errorf("inproc: listen: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(sctx, ln)
	}()
	return ln.Addr().String(), cancel, done, nil
}
