package orchestrator_test

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
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
		"go_goroutines ", "go_gc_duration_seconds", "process_resident_memory_bytes ",
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

// field returns the JSON string value after prefix in b.
func field(b, prefix string) string {
	_, v, _ := strings.Cut(b, prefix)
	v, _, _ = strings.Cut(v, `"`)
	return v
}
