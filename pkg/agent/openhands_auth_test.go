package agent_test

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
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

// An agent whose app cannot start answers /healthz 500 APP_FAILED with
// the reason (the sandbox never becomes ready); an unserved OpenHands route
// goes to the app, which answers 502 naming the failure.
func TestAppFailedHealth(t *testing.T) {
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		App: &agent.AppConfig{Argv: []string{"/nonexistent/app"}, Port: 1}})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + testserve.Serve(t, srv.Serve)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusInternalServerError {
			if !strings.Contains(string(b), `"status":"APP_FAILED"`) || !strings.Contains(string(b), "/nonexistent/app") {
				t.Fatalf("healthz: %s", b)
			}
			break
		}
		if res.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("healthz: %d %s", res.StatusCode, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	req, _ := http.NewRequest("GET", base+"/api/conversations", nil)
	req.Header.Set("X-Session-API-Key", testToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "no such file") {
		t.Fatalf("/api/conversations: %d %s", res.StatusCode, b)
	}
}
