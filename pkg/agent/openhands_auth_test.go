package agent_test

import (
	"io"
	"net/http"
	"testing"
)

// TestOpenHandsRoutesAuth checks the agent's edge for the OpenHands
// subset: GET /health is open, the token is accepted as X-Session-API-Key
// (and as a bearer token), and anything else is a 401.
func TestOpenHandsRoutesAuth(t *testing.T) {
	a := startAgent(t)
	cases := []struct {
		method, path string
		header       http.Header
		want         int
	}{
		{http.MethodGet, "/health", nil, http.StatusOK},
		{http.MethodPost, "/health", nil, http.StatusUnauthorized},
		{http.MethodGet, "/server_info", nil, http.StatusUnauthorized},
		{http.MethodGet, "/server_info", http.Header{"X-Session-Api-Key": {"wrong"}}, http.StatusUnauthorized},
		{http.MethodGet, "/server_info", http.Header{"X-Session-Api-Key": {testToken}}, http.StatusOK},
		{http.MethodGet, "/api/git/changes?path=/", http.Header{"Authorization": {"Bearer " + testToken}}, http.StatusOK},
		{http.MethodGet, "/v1/info", http.Header{"X-Session-Api-Key": {testToken}}, http.StatusOK},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, a.base+c.path, nil)
		for k, v := range c.header {
			req.Header[k] = v
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.want {
			t.Errorf("%s %s %v: %d %s (want %d)", c.method, c.path, c.header, res.StatusCode, b, c.want)
		}
	}
}
