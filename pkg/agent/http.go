package agent

import (
	"encoding/json"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds REST request bodies other than raw file uploads.
const maxJSONBody = 32 << 20

// newGatewayMux returns the grpc-gateway mux with berth's JSON conventions:
// zero values are emitted (so "exitCode": 0 is present), field names are
// lowerCamelCase, and unknown request fields are rejected.
func newGatewayMux() *runtime.ServeMux {
	m := &runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}
	return runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, m),
	)
}

// limitBody caps request bodies, except on the raw file routes, which stream.
func limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, maxJSONBody)
		}
		next.ServeHTTP(w, r)
	})
}

// writeJSONError writes st the way grpc-gateway does: the HTTP status that
// matches the gRPC code and a body {"code": N, "message": "…"}.
func writeJSONError(w http.ResponseWriter, st *status.Status) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(runtime.HTTPStatusFromCode(st.Code()))
	_ = json.NewEncoder(w).Encode(map[string]any{
		"code":    int(st.Code()),
		"message": st.Message(),
		"details": []any{},
	})
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"SERVING"}` + "\n"))
}
