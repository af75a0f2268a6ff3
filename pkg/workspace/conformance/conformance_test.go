package conformance_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
	"github.com/berth-dev/berth/pkg/workspace"
	"github.com/berth-dev/berth/pkg/workspace/conformance"
)

// The suite against the workspaces that need no orchestrator: Local, and
// Remote over gRPC and REST on an in-process agent. They live here, apart
// from pkg/workspace's own tests (which run it against Leased and through
// a proxy), so that the two halves run side by side as two test binaries.

const agentToken = "conformance-test-token"

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testAgent is a real sandbox agent on a loopback port, with its own
// workspace directory.
type testAgent struct {
	addr    string // host:port
	base    string // http://host:port
	workDir string
}

func startAgent(t *testing.T) *testAgent {
	t.Helper()
	work := t.TempDir()
	srv, err := agent.New(agent.Config{Token: agentToken, WorkDir: work, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	addr := testserve.Serve(t, srv.Serve)
	return &testAgent{addr: addr, base: "http://" + addr, workDir: work}
}

func newLocal(t *testing.T) workspace.Workspace {
	t.Helper()
	ws, err := workspace.NewLocal(t.TempDir(), workspace.WithLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

func newRemote(t *testing.T, cfg workspace.RemoteConfig) *workspace.Remote {
	t.Helper()
	cfg.Logger = quietLog()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	ws, err := workspace.NewRemote(ctx, cfg)
	if err != nil {
		t.Fatalf("NewRemote: %v", err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func TestLocalConformance(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	conformance.Run(t, newLocal)
}

func TestRemoteGRPCConformance(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	conformance.Run(t, func(t *testing.T) workspace.Workspace {
		a := startAgent(t)
		ws := newRemote(t, workspace.RemoteConfig{Target: a.addr, Token: agentToken})
		if ws.Root() != a.workDir {
			t.Fatalf("Root() = %q, want the agent's workspace %q", ws.Root(), a.workDir)
		}
		return ws
	})
}

func TestRemoteRESTConformance(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	conformance.Run(t, func(t *testing.T) workspace.Workspace {
		a := startAgent(t)
		ws := newRemote(t, workspace.RemoteConfig{Target: a.base, Token: agentToken, Transport: workspace.TransportREST})
		if ws.Root() != a.workDir {
			t.Fatalf("Root() = %q, want the agent's workspace %q", ws.Root(), a.workDir)
		}
		return ws
	})
}

// TestWatchConformance runs the Watch subtests of the suite on every
// implementation that needs no orchestrator (so -run Watch covers them).
func TestWatchConformance(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	t.Run("Local", func(t *testing.T) { conformance.RunWatch(t, newLocal) })
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run(tr.String(), func(t *testing.T) {
			conformance.RunWatch(t, func(t *testing.T) workspace.Workspace {
				a := startAgent(t)
				target := a.addr
				if tr == workspace.TransportREST {
					target = a.base
				}
				return newRemote(t, workspace.RemoteConfig{Target: target, Token: agentToken, Transport: tr})
			})
		})
	}
}
