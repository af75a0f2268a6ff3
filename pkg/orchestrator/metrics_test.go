package orchestrator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/proxy"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// TestMetricsExposition scrapes a real orchestrator (two, in one process:
// each has its own registry) after a cold acquire and a proxied exec, checks
// that every series of docs/orchestrator.md is there, and lints the
// exposition with promlint and with `promtool check metrics` (Debian's
// prometheus package, installed by `make deps`).
func TestMetricsExposition(t *testing.T) {
	o := orchtest.Start(t, nil)
	other := orchtest.Start(t, nil)
	call := func(base, method, path, tok, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var id, tok string
	for range 2 { // the second acquire returns the same lease: not timed
		code, b := call(o.Base, "POST", "/v1/leases", orchtest.OperatorToken, `{"conversationId":"m1"}`)
		if code != 200 {
			t.Fatalf("acquire: %d %s", code, b)
		}
		id, tok = field(b, `"id":"`), field(b, `"token":"`)
	}
	if code, b := call(o.Base, "POST", "/v1/sandboxes/"+id+"/v1/exec", tok, `{"command":"true"}`); code != 200 {
		t.Fatalf("exec: %d %s", code, b)
	}
	// A gRPC call through the proxy, for the grpc series.
	cc, err := grpc.NewClient(o.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), proxy.LeaseMetadata, id, "authorization", "Bearer "+tok)
	if _, err := agentv1.NewInfoServiceClient(cc).GetInfo(ctx, &agentv1.GetInfoRequest{}); err != nil {
		t.Fatalf("GetInfo through the proxy: %v", err)
	}
	code, m := call(o.Base, "GET", "/metrics", "", "")
	if code != 200 {
		t.Fatalf("metrics: %d %s", code, m)
	}
	for _, want := range []string{
		`berth_leases{state="READY"} 1`, "berth_leases_live 1", "berth_leases_max ", "berth_leases_created_total 1",
		`berth_lease_transitions_total{to="READY"} 1`, "berth_sandboxes_uncleaned 0",
		"berth_disk_limited_leases ", "berth_disk_used_bytes ", "berth_disk_over_limit_leases 0",
		"berth_disk_kept_sandboxes 0", "berth_disk_measurements_total ", "berth_disk_limit_stops_total 0",
		"berth_sandbox_oom_events_total 0", "berth_sandbox_restarts_total 0", "berth_sandbox_restart_failures_total 0",
		`berth_acquire_duration_seconds_count{backend="docker",kind="cold"} 1`,
		`berth_proxy_http_requests_total{code="200"} 1`, "berth_proxy_in_flight 0", "berth_proxy_operator_access_total 0",
		`berth_proxy_request_duration_seconds_count{code="2xx",kind="rest"} 1`,
		`berth_proxy_grpc_calls_total{code="OK"} 1`, `berth_proxy_request_duration_seconds_count{code="2xx",kind="grpc"} 1`,
		"go_goroutines ", "go_gc_duration_seconds", "process_resident_memory_bytes ",
		`berth_egress_policy_applications_total{result="error"} 0`, "berth_egress_apply_duration_seconds_count ",
		`berth_egress_dns_queries_total{result="denied"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if _, m2 := call(other.Base, "GET", "/metrics", "", ""); !strings.Contains(m2, "berth_leases_live 0") || !strings.Contains(m2, `berth_acquire_duration_seconds_count{backend="docker",kind="cold"} 0`) {
		t.Errorf("the second orchestrator shares the first one's metrics:\n%s", m2)
	}
	if problems, err := promlint.New(strings.NewReader(m)).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %+v", err, problems)
	}
	// The agent's, through the proxy, for the operator.
	code, am := call(o.Base, "GET", "/v1/sandboxes/"+id+"/metrics", orchtest.OperatorToken, "")
	if code != 200 || !strings.Contains(am, `berth_agent_exec_duration_seconds_count{code="OK",method="exec"} 1`) {
		t.Fatalf("agent metrics: %d %s", code, am)
	}
	checkDashboard(t, m+am)
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.SkipOrFail(t, "promtool not found (Debian package prometheus; run make deps)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(m)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}
}

// checkDashboard checks that every series docs/grafana-dashboard.json
// queries is in the exposition m (a histogram by its _bucket, _count and
// _sum).
func checkDashboard(t *testing.T, m string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	name := regexp.MustCompile(`\b(?:berth|go|process)_[a-z0-9_]+`)
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, s := range name.FindAllString(tg.Expr, -1) {
				n++
				base := s
				for _, suf := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(s, suf); ok && strings.Contains(m, "# TYPE "+b+" histogram") {
						base = b
					}
				}
				if !strings.Contains(m, "# TYPE "+base+" ") {
					t.Errorf("dashboard panel %q queries %s, which is not exposed", p.Title, s)
				}
			}
		}
	}
	if n < 20 {
		t.Errorf("dashboard: only %d series references", n)
	}
}

// field returns the JSON string value after prefix in b.
func field(b, prefix string) string {
	_, v, _ := strings.Cut(b, prefix)
	v, _, _ = strings.Cut(v, `"`)
	return v
}
