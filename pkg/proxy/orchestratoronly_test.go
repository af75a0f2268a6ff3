package proxy

import (
	"net/http"
	"testing"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// TestOrchestratorOnly: the agent's ConfigService is refused on every
// route, whatever the caller; other agent calls pass.
func TestOrchestratorOnly(t *testing.T) {
	for _, m := range []string{agentv1.ConfigService_Configure_FullMethodName, "/berth.agent.v1.ConfigService/Other",
		"/berth.agent.v1.ConfigService/Configure/", "/x/berth.agent.v1.ConfigService"} {
		if rerr := orchestratorOnly(m); rerr == nil || rerr.status != http.StatusForbidden {
			t.Errorf("%s: %v, want 403", m, rerr)
		}
	}
	for _, m := range []string{agentv1.ProcessService_Exec_FullMethodName, "/v1/exec", "/v1/files/config"} {
		if rerr := orchestratorOnly(m); rerr != nil {
			t.Errorf("%s refused: %v", m, rerr)
		}
	}
}
