package conformance_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testagent"
	"github.com/berth-dev/berth/pkg/workspace"
	"github.com/berth-dev/berth/pkg/workspace/conformance"
)

// The suite against the workspaces that need no orchestrator: Local, and
// Remote over gRPC and REST on an in-process agent. They live here, apart
// from pkg/workspace's own tests (which run it against Leased and through
// a proxy), so that the two halves run side by side as two test binaries.

const agentToken = "conformance-test-token"

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startAgent starts a real sandbox agent for the test (testagent).
func startAgent(t *testing.T) *testagent.Agent { return testagent.Start(t, agentToken) }

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
		ws := newRemote(t, workspace.RemoteConfig{Target: a.Addr, Token: agentToken})
		if ws.Root() != a.WorkDir {
			t.Fatalf("Root() = %q, want the agent's workspace %q", ws.Root(), a.WorkDir)
		}
		return ws
	})
}

func TestRemoteRESTConformance(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	conformance.Run(t, func(t *testing.T) workspace.Workspace {
		a := startAgent(t)
		ws := newRemote(t, workspace.RemoteConfig{Target: a.Base, Token: agentToken, Transport: workspace.TransportREST})
		if ws.Root() != a.WorkDir {
			t.Fatalf("Root() = %q, want the agent's workspace %q", ws.Root(), a.WorkDir)
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
				target := a.Addr
				if tr == workspace.TransportREST {
					target = a.Base
				}
				return newRemote(t, workspace.RemoteConfig{Target: target, Token: agentToken, Transport: tr})
			})
		})
	}
}
