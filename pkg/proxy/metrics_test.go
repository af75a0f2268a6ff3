package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// scrape serves c from a registry of its own and returns the exposition,
// after checking it with promlint.
func scrape(t testing.TB, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %+v\n%s", err, problems, body)
	}
	return body
}

func TestMetricsDurationAndAgentMetrics(t *testing.T) {
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "conv-metrics", "")
	if r := do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(tok), `{"command":"exit 3"}`); r.code != 200 {
		t.Fatalf("exec: %d %s", r.code, r.body)
	}
	// The agent's own /metrics: the operator's, not the lease's.
	for _, p := range []string{"/metrics", "/%6detrics"} {
		if r := do(t, "GET", e.sandboxURL(id, p), "", bearerHdr(tok), ""); r.code != http.StatusForbidden || !strings.Contains(string(r.body), "operator token only") {
			t.Errorf("lease token, agent %s: %d %s", p, r.code, r.body)
		}
	}
	for _, p := range []string{"/metrics", "//metrics"} { // host form: no mux cleans the path
		if r := do(t, "GET", e.srv.URL+p, id+"."+domain, bearerHdr(tok), ""); r.code != http.StatusForbidden {
			t.Errorf("lease token, agent host %s: %d %s", p, r.code, r.body)
		}
	}
	r := do(t, "GET", e.sandboxURL(id, "/metrics"), "", bearerHdr(opToken), "")
	if r.code != 200 || !strings.Contains(string(r.body), `berth_agent_exec_duration_seconds_count{code="OK",method="exec"} 1`) ||
		!strings.Contains(string(r.body), "berth_agent_background_processes 0") || !strings.Contains(string(r.body), "go_goroutines") {
		t.Fatalf("operator, agent /metrics: %d %s", r.code, r.body)
	}
	if problems, err := promlint.New(strings.NewReader(string(r.body))).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("agent metrics promlint: %v %+v", err, problems)
	}

	m := scrape(t, e.proxy.Collector())
	for _, want := range []string{
		`berth_proxy_request_duration_seconds_count{code="2xx",kind="rest"} 2`,
		`berth_proxy_request_duration_seconds_count{code="4xx",kind="rest"} 4`,
		`berth_proxy_http_requests_total{code="403"} 4`,
		`berth_proxy_operator_access_total 1`,
		`berth_proxy_in_flight 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("proxy metrics lack %s:\n%s", want, m)
		}
	}
}
