// Package orchtest starts a real orchestrator for tests: the full API on a
// loopback port, a bbolt store in a temp dir, and the in-process runtime
// (real agents, no containers).
package orchtest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime/inproc"
)

// Tokens configured on every test orchestrator.
const (
	OperatorToken = "operator-token-0123456789"
	ClientAToken  = "client-a-token-0123456789"
	ClientBToken  = "client-b-token-0123456789"
)

// Server is a running test orchestrator.
type Server struct {
	// Base is the http:// URL of the listener.
	Base string
	// Addr is its host:port.
	Addr string
	// Srv is the orchestrator; Runtime its in-process runtime.
	Srv     *orchestrator.Server
	Runtime *inproc.Runtime
}

// Start starts an orchestrator with owners team-a and team-b; mutate may
// change the configuration first. Everything stops in t.Cleanup.
func Start(t testing.TB, mutate func(*orchestrator.Config)) *Server {
	t.Helper()
	return StartWrapped(t, mutate, nil)
}

// StartWrapped is Start with the server's listener wrapped by wrap (nil
// for none), for tests that watch what the server reads or accepts.
func StartWrapped(t testing.TB, mutate func(*orchestrator.Config), wrap func(net.Listener) net.Listener) *Server {
	t.Helper()
	cfg := orchestrator.Defaults()
	cfg.DataDir = t.TempDir()
	cfg.OperatorToken = OperatorToken
	cfg.Clients = []orchestrator.Client{{Owner: "team-a", Token: ClientAToken}, {Owner: "team-b", Token: ClientBToken}}
	if mutate != nil {
		mutate(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := inproc.New(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	srv, err := orchestrator.New(context.Background(), cfg, orchestrator.Platform{Runtime: rt}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() }) // runs after the server has stopped
	serve := srv.Serve
	if wrap != nil {
		serve = func(ctx context.Context, ln net.Listener) error { return srv.Serve(ctx, wrap(ln)) }
	}
	addr := testserve.Serve(t, serve)
	return &Server{Base: "http://" + addr, Addr: addr, Srv: srv, Runtime: rt}
}
