package inproc

import (
	"context"
	"fmt"
	"net"

	"github.com/berth-dev/berth/pkg/agent"
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
	srv, err := agent.New(agent.Config{Token: bx.token, WorkDir: bx.dir, Logger: r.log.With("sandbox", id)})
	if err != nil {
		return runtime.Sandbox{}, fmt.Errorf("inproc: agent: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return runtime.Sandbox{}, fmt.Errorf("inproc: listen: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(sctx, ln)
	}()
	bx.cancel, bx.done = cancel, done
	bx.sb.State, bx.sb.ExitCode, bx.sb.Endpoint = runtime.StateRunning, 0, ln.Addr().String()
	return bx.sb, nil
}
