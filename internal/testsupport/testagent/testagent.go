// Package testagent runs a real sandbox agent (pkg/agent) on a loopback
// port for the length of a test, with a workspace directory of its own:
// the tests of the clients that talk to an agent (pkg/workspace and its
// conformance suite) start it instead of a stand-in.
package testagent

import (
	"io"
	"log/slog"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
)

// Agent is a running agent.
type Agent struct {
	// Addr is its host:port.
	Addr string
	// Base is its base URL, http://Addr.
	Base string
	// WorkDir is its workspace directory (a t.TempDir).
	WorkDir string
}

// Start starts an agent that accepts token, in a new workspace directory,
// and stops it (checking its error) when the test ends.
func Start(t testing.TB, token string) *Agent {
	t.Helper()
	work := t.TempDir()
	srv, err := agent.New(agent.Config{Token: token, WorkDir: work, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	addr := testserve.Serve(t, srv.Serve)
	return &Agent{Addr: addr, Base: "http://" + addr, WorkDir: work}
}
