package workspace_test

import (
	"context"
	"github.com/berth-dev/berth/internal/testsupport/testagent"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/workspace"
)

const agentToken = "workspace-test-token"

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startAgent starts a real sandbox agent for the test (testagent).
func startAgent(t *testing.T) *testagent.Agent { return testagent.Start(t, agentToken) }

func newRemote(t *testing.T, cfg workspace.RemoteConfig) *workspace.Remote {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLog()
	}
	ws, err := workspace.NewRemote(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("NewRemote: %v", err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func TestNewLocalErrors(t *testing.T) {
	if _, err := workspace.NewLocal(""); !isInvalid(err) {
		t.Fatalf("NewLocal(\"\"): %v", err)
	}
	if _, err := workspace.NewLocal(t.TempDir() + "/missing"); !isNotFound(err) {
		t.Fatalf("NewLocal(missing): %v", err)
	}
	// A relative root is made absolute.
	t.Chdir(t.TempDir())
	ws, err := workspace.NewLocal(".")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if ws.Root() == "." || ws.Root()[0] != '/' {
		t.Fatalf("Root() = %q", ws.Root())
	}
}
