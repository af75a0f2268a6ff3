package orchestrator

import (
	"fmt"
	"net/http"

	"github.com/berth-dev/berth/pkg/orchestrator/ui"
	"github.com/berth-dev/berth/pkg/proxy"
)

// mountDashboard serves the web dashboard (package ui) at /ui on mux: its
// API shim calls api (the authenticated REST handler) and px (the sandbox
// proxy) with the signed-in session's token.
func (s *Server) mountDashboard(mux *http.ServeMux, api http.Handler, px *proxy.Proxy) error {
	dash, err := ui.New(ui.Config{API: api, Sandboxes: px, Auth: s.dashboardIdentity, Leases: s.manager,
		Token:  s.manager.Tokens().Token,
		Logger: s.log.With("component", "ui")})
	if err != nil {
		return fmt.Errorf("orchestrator: dashboard: %w", err)
	}
	mux.Handle("GET /ui", dash)
	mux.Handle(ui.Prefix, dash)
	return nil
}

// dashboardIdentity signs the operator token and client tokens in to the
// dashboard; lease tokens are refused.
func (s *Server) dashboardIdentity(tok string) (ui.Identity, bool) {
	p, err := s.auth.fromToken(tok)
	if err != nil || (p.Role != RoleOperator && p.Role != RoleClient) {
		return ui.Identity{}, false
	}
	return ui.Identity{Operator: p.Role == RoleOperator, Owner: p.Owner}, true
}
