package orchestrator

import (
	"github.com/berth-dev/berth/pkg/orchestrator/ohruntime"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// openHandsRuntime is the runtime API of OpenHands' APIRemoteWorkspace
// (package ohruntime, docs/openhands.md). It calls the lease service
// through the in-process connection with the caller's key as its bearer
// token, so the lease API's authorization and owner scoping apply as they
// are; only the operator and client tokens are keys (a lease token is not).
func (s *Server) openHandsRuntime() *ohruntime.Handler {
	images, _ := s.manager.Config().Runtime.(runtime.ImageInspector)
	return ohruntime.New(ohruntime.Config{
		Leases: orchv1.NewLeaseServiceClient(s.direct),
		Authenticate: func(key string) ohruntime.Caller {
			p, err := s.auth.fromToken(key) // constant time (bearer.Secret)
			switch {
			case err != nil:
				return ohruntime.Nobody
			case p.Role == RoleOperator:
				return ohruntime.Operator
			case p.Role == RoleClient:
				return ohruntime.Client
			}
			return ohruntime.Nobody
		},
		OperatorOwner: OperatorOwner,
		Token:         s.manager.Tokens().Token,
		CheckImage:    s.manager.CheckImage,
		Images:        images,
		PauseMode:     s.cfg.OpenHandsPauseMode,

		DefaultResources: s.cfg.DefaultResources(), MaxResources: s.cfg.maxResources(),
	})
}
