package agent

import (
	"net/http"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// serveOpenAPI answers GET /openapi.json with the OpenAPI v2 description of
// the agent's REST API, embedded at build time. It is behind the agent's
// token like the other routes (through the proxy:
// /v1/sandboxes/{lease}/openapi.json).
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(agentv1.OpenAPIv2)
}
