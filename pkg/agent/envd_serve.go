package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/berth-dev/berth/internal/edge"
	"golang.org/x/net/netutil"
)

// EnvdHandler returns the handler of E2B's envd protocol (package envd):
// the Connect services process.Process and filesystem.Filesystem and the
// routes /files, /health and /envs, with envd's authentication (the
// agent's token in X-Access-Token). It is served apart from the agent's
// own routes (ServeEnvd), since /health and /files mean other things
// there.
func (s *Server) EnvdHandler() http.Handler { return s.envdHandler }

// ServeEnvd serves EnvdHandler on ln, HTTP/1.1 and h2c, until ctx is
// cancelled; it then shuts down within Config.ShutdownGrace.
func (s *Server) ServeEnvd(ctx context.Context, ln net.Listener) error {
	s.log.Info("agent serving the envd protocol", "addr", ln.Addr().String())
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	hs := &http.Server{
		Handler: s.envdHandler, Protocols: &protos,
		ReadHeaderTimeout: edge.DefaultReadHeaderTimeout, IdleTimeout: edge.DefaultIdleTimeout,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(netutil.LimitListener(ln, edge.DefaultMaxConns)) }()
	select {
	case err := <-errc:
		return fmt.Errorf("agent: envd: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownGrace)
	defer cancel()
	s.envd.Close()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("agent: envd: %w", err)
	}
	return nil
}
