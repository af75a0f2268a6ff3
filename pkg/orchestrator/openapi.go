package orchestrator

import (
	"net/http"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// serveOpenAPI answers GET /openapi.json with the REST API's OpenAPI v2
// description, embedded at build time. It is public, like /healthz.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(orchv1.OpenAPIv2)
}
