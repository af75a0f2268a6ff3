package edge

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestGatewayWrongMethodIs405 checks that a known path with a method it
// does not serve is the caller's error (405), not grpc-gateway's default
// 501, and that an unknown path stays 404.
func TestGatewayWrongMethodIs405(t *testing.T) {
	mux := GatewayMux()
	if err := mux.HandlePath(http.MethodGet, "/v1/things/{id}", func(w http.ResponseWriter, _ *http.Request, _ map[string]string) {
		w.WriteHeader(http.StatusNoContent)
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/v1/things/a", http.StatusNoContent},
		{http.MethodDelete, "/v1/things/a", http.StatusMethodNotAllowed},
		{http.MethodPatch, "/v1/things/a", http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/other", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), tc.method, tc.path, nil))
		if rec.Code != tc.want {
			t.Errorf("%s %s: status %d, want %d (body %s)", tc.method, tc.path, rec.Code, tc.want, rec.Body)
			continue
		}
		if tc.want >= 400 {
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Message == "" {
				t.Errorf("%s %s: body %q is not a JSON error: %v", tc.method, tc.path, rec.Body, err)
			}
		}
	}
}
