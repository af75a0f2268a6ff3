package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/e2b"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"golang.org/x/net/netutil"
)

// e2bHandler is E2B's control-plane API and the sandboxes' traffic
// (package e2b, docs/e2b.md), served on Config.E2BListen. Like the
// OpenHands runtime API it calls the lease service through the in-process
// connection with the caller's key as its bearer token; its traffic goes
// through the proxy.
// Sandboxes pause as E2B's do, memory and processes kept (freeze), on a
// runtime that can; else they hibernate.
func (s *Server) e2bHandler() http.Handler {
	pause := "freeze"
	if _, ok := s.manager.Config().Runtime.(runtime.Freezer); !ok {
		pause = "hibernate"
	}
	return e2b.New(e2b.Config{
		PauseMode: pause,
		Leases:    orchv1.NewLeaseServiceClient(s.direct),
		Authenticate: func(key string) e2b.Caller {
			p, err := s.auth.fromToken(key) // constant time (bearer.Secret)
			switch {
			case err != nil:
				return e2b.Nobody
			case p.Role == RoleOperator:
				return e2b.Operator
			case p.Role == RoleClient:
				return e2b.Client
			}
			return e2b.Nobody
		},
		OperatorOwner: OperatorOwner,
		Token:         s.manager.Tokens().Token,
		Templates:     s.cfg.E2BTemplates,
		Domain:        s.cfg.E2BDomain,
		Traffic:       &e2b.Traffic{Sandboxes: s.manager, Tokens: s.manager.Tokens(), Proxy: s.proxy, Logger: s.log.With("component", "e2b")},
		Logger:        s.log.With("component", "e2b"),
	})
}

// E2BHandler returns the handler of the E2B listener (ServeE2B).
func (s *Server) E2BHandler() http.Handler { return s.e2b }

// ServeE2B serves E2BHandler on ln (HTTP/1.1 and h2c) until ctx ends, then
// shuts down gracefully.
func (s *Server) ServeE2B(ctx context.Context, ln net.Listener) error {
	s.log.Info("orchestrator serving the E2B API", "addr", ln.Addr().String())
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	rht, idle := time.Duration(s.cfg.ReadHeaderTimeout), time.Duration(s.cfg.IdleTimeout)
	if rht <= 0 {
		rht = edge.DefaultReadHeaderTimeout
	}
	if idle <= 0 {
		idle = edge.DefaultIdleTimeout
	}
	maxConns := s.cfg.MaxConnections
	if maxConns <= 0 {
		maxConns = edge.DefaultMaxConns
	}
	hs := &http.Server{Handler: s.e2b, Protocols: &protos, ReadHeaderTimeout: rht, IdleTimeout: idle,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(netutil.LimitListener(ln, maxConns)) }()
	select {
	case err := <-errc:
		return fmt.Errorf("orchestrator: e2b: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("orchestrator: e2b: %w", err)
	}
	return nil
}
