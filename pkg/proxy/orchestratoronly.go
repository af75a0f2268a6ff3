package proxy

import (
	"net/http"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// configServicePrefix is the gRPC method prefix of the agent's
// ConfigService: the orchestrator's own call (it gives a warm pool's
// sandbox its lease's env and secrets), never a client's.
var configServicePrefix = "/" + agentv1.ConfigService_ServiceDesc.ServiceName + "/"

// orchestratorOnly refuses the agent calls only the orchestrator makes,
// to every proxied caller (lease and operator tokens alike): method is a
// gRPC method name or an agent HTTP path (the service has no REST route;
// a gRPC path sent over HTTP is refused too).
func orchestratorOnly(method string) *routeError {
	if strings.HasPrefix(method, configServicePrefix) || strings.Contains(method, agentv1.ConfigService_ServiceDesc.ServiceName) {
		return newRouteError(http.StatusForbidden, errdefs.ErrPermissionDenied,
			"%s is the orchestrator's own call to the agent; it is not served through the proxy", agentv1.ConfigService_ServiceDesc.ServiceName)
	}
	return nil
}
