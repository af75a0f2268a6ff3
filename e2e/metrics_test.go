package e2e

import (
	"bytes"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

// TestMetricsDocker scrapes the orchestrator's /metrics and a real Docker
// sandbox's agent /metrics (through the proxy, operator token only) after a
// cold acquire and an exec, and checks both with `promtool check metrics`.
func TestMetricsDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) { c.DefaultImage = minimalImage })
	l := o.mustAcquire(t, "metrics", minimalImage, "120s")
	id, tok := l.GetLease().GetId(), l.GetToken()
	if out := sandboxShell(t, o.api, id, tok, "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("exec: %q", out)
	}
	code, _, m := o.mustCall(t, http.MethodGet, "/metrics", nil, "")
	if code != http.StatusOK || !strings.Contains(string(m), `berth_acquire_duration_seconds_count{backend="docker",kind="cold"} 1`) ||
		!strings.Contains(string(m), `berth_proxy_request_duration_seconds_count{code="2xx",kind="rest"} 1`) {
		t.Fatalf("orchestrator metrics: %d\n%s", code, m)
	}
	if code, _, b := o.mustCall(t, http.MethodGet, "/v1/sandboxes/"+id+"/metrics", nil, tok); code != http.StatusForbidden {
		t.Errorf("agent metrics with the lease token: %d %s", code, b)
	}
	code, _, am := o.mustCall(t, http.MethodGet, "/v1/sandboxes/"+id+"/metrics", nil)
	if code != http.StatusOK || !strings.Contains(string(am), `berth_agent_exec_duration_seconds_count{code="OK",method="exec"} 1`) ||
		!strings.Contains(string(am), "process_resident_memory_bytes ") {
		t.Fatalf("agent metrics with the operator token: %d\n%s", code, am)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.SkipOrFail(t, "promtool not found (Debian package prometheus; run make deps)")
	}
	for name, b := range map[string][]byte{"orchestrator": m, "agent": am} {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(b)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics (%s): %v\n%s", name, err, out)
		}
	}
}
