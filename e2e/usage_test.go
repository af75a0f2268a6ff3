package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// usageConfig: per-lease series on and a short sampling interval, so the
// metrics show the lease quickly; no in-place restart, so a killed
// sandbox fails its lease (what `logs` must explain).
func usageConfig(c *orchestrator.Config) {
	c.MetricsPerLease = true
	c.UsageInterval = orchestrator.Duration(time.Second)
	c.Restart.Limit = 0
}

// TestUsageAndLogsDocker runs usageScenario on a Docker sandbox.
func TestUsageAndLogsDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, usageConfig)
	acq := acquireWithSecret(t, o.api)
	usageScenario(t, o.api, acq, func(cid string) { mustDocker(t, "kill", cid) })
}

// TestUsageAndLogsContainerd runs usageScenario on a containerd sandbox.
func TestUsageAndLogsContainerd(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, usageConfig)
	acq := acquireWithSecret(t, o.api)
	env.track(acq.GetLease().GetContainerId())
	usageScenario(t, o.api, acq, func(cid string) { killCtrdTask(t, ctrd.rt, cid) })
}

// usageSecret is the secret the scenario's lease carries: `logs` must
// never show it.
const usageSecret = "sk-usage-logs-7d1f0c"

// containerPresent reports whether a Docker or containerd container id
// still exists (docker inspect, else ctr through the containerd backend).
func containerPresent(t *testing.T, id string) bool {
	if _, err := dockerCLI(context.Background(), "inspect", "--format", "{{.Id}}", id); err == nil {
		return true
	}
	if ctrd.rt != nil {
		if _, err := ctrd.rt.Get(context.Background(), id); err == nil {
			return true
		}
	}
	return false
}

func acquireWithSecret(t *testing.T, a *api) *orchv1.AcquireResponse {
	t.Helper()
	code, _, b := a.mustCall(t, http.MethodPost, "/v1/leases", map[string]any{
		"conversationId": "usage-" + randHex(4), "image": minimalImage, "ttl": "600s",
		"secrets": map[string]string{"API_KEY": usageSecret},
	})
	var acq orchv1.AcquireResponse
	if code != http.StatusOK || decode(b, &acq) != nil || acq.GetLease().GetState() != orchv1.LeaseState_LEASE_STATE_READY {
		t.Fatalf("acquire: %d %s", code, b)
	}
	return &acq
}

// usageScenario: `lease get` shows plausible usage (memory grows by what a
// command puts in /dev/shm, CPU time grows across a busy command and the CPU
// percentage shows it, a background process counts in processes, network
// bytes are counted), `lease top` prints it, /metrics has the aggregate
// and (opted in) per-lease series; `logs` shows the transitions, the
// agent's log and what was written to the container's stdout, never the
// secret; `logs --follow` ends by itself when the killed sandbox fails
// its lease, with the FAILED transition and its reason.
func usageScenario(t *testing.T, a *api, acq *orchv1.AcquireResponse, kill func(containerID string)) {
	id, tok, cid := acq.GetLease().GetId(), acq.GetToken(), acq.GetLease().GetContainerId()
	usage := func() *orchv1.Usage {
		t.Helper()
		u := a.mustGet(t, id).GetUsage()
		if u.GetSampledAt() == nil {
			t.Fatalf("lease get: no live usage: %v", u)
		}
		return u
	}
	run := func(argv ...string) {
		t.Helper()
		code, _, b := a.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/exec"), map[string]any{"argv": argv, "timeout": "60s"}, tok)
		if code != http.StatusOK || !strings.Contains(string(b), `"exitCode":0`) {
			t.Fatalf("exec %q: %d %s", argv, code, b)
		}
	}

	u0 := usage()
	if u0.GetMemoryBytes() <= 0 || u0.GetProcesses() < 1 || u0.GetCpuNanos() <= 0 || u0.GetMemoryLimitBytes() <= 0 {
		t.Errorf("baseline usage implausible: %v", u0)
	}
	const fill = 32 << 20
	run("dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1048576", "count=32")
	u1 := usage()
	if u1.GetMemoryBytes() < u0.GetMemoryBytes()+fill*3/4 || u1.GetMemoryPeakBytes() < u1.GetMemoryBytes() {
		t.Errorf("memory after putting 32 MiB in /dev/shm: %d (before %d), peak %d", u1.GetMemoryBytes(), u0.GetMemoryBytes(), u1.GetMemoryPeakBytes())
	}
	// A fixed amount of work (hashing 256 MB), not a fixed time: the CPU
	// time it takes does not depend on how busy the machine is.
	run("sh", "-c", "head -c 268435456 /dev/zero | md5sum")
	u2 := usage()
	if u2.GetCpuNanos()-u1.GetCpuNanos() < 2e8 || u2.GetCpuPercent() < 1 {
		t.Errorf("cpu across hashing 256 MB: %d -> %d ns, %.1f%%", u1.GetCpuNanos(), u2.GetCpuNanos(), u2.GetCpuPercent())
	}
	code, _, b := a.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/processes"), map[string]any{"argv": []string{"sleep", "300"}}, tok)
	if code != http.StatusOK {
		t.Fatalf("start sleep: %d %s", code, b)
	}
	u3 := usage()
	if u3.GetProcesses() < u2.GetProcesses()+1 || u3.GetNetworkRxBytes() <= 0 || u3.GetNetworkTxBytes() <= 0 {
		t.Errorf("after a background sleep: processes %d (before %d), network rx %d tx %d", u3.GetProcesses(), u2.GetProcesses(), u3.GetNetworkRxBytes(), u3.GetNetworkTxBytes())
	}
	t.Logf("usage: cpu %.2fs %.0f%%, memory %d (peak %d) of %d, net %d/%d, processes %d",
		float64(u3.GetCpuNanos())/1e9, u2.GetCpuPercent(), u3.GetMemoryBytes(), u3.GetMemoryPeakBytes(), u3.GetMemoryLimitBytes(),
		u3.GetNetworkRxBytes(), u3.GetNetworkTxBytes(), u3.GetProcesses())

	out, errs, rc := cliRun(t, a.addr, "lease", "top", "--once")
	if rc != 0 || !strings.Contains(out, id) || !strings.Contains(out, "MEM USAGE / LIMIT") || !strings.Contains(out, "%") {
		t.Errorf("lease top --once: exit %d: %s%s", rc, out, errs)
	}
	out, errs, rc = cliRun(t, a.addr, "lease", "top", "-o", "json")
	var snap orchv1.ListLeasesResponse
	if rc != 0 || decode([]byte(out), &snap) != nil || len(snap.GetLeases()) != 1 || snap.GetLeases()[0].GetUsage().GetMemoryBytes() <= 0 {
		t.Errorf("lease top -o json: exit %d: %s%s", rc, out, errs)
	}
	if !eventually(10*time.Second, 200*time.Millisecond, func() bool {
		_, _, m, err := a.httpGet("", "/metrics", nil)
		return err == nil && strings.Contains(m, "berth_usage_sandboxes_sampled 1") &&
			strings.Contains(m, `berth_lease_memory_bytes{lease_id="`+id+`"}`) && strings.Contains(m, `berth_lease_processes{lease_id="`+id+`"}`)
	}) {
		_, _, m, _ := a.httpGet("", "/metrics", nil)
		t.Errorf("metrics lack the usage series of %s:\n%s", id, grepLines(m, "berth_usage_", "berth_lease_"))
	}

	// Logs: the agent's own log, what reaches the container's stdout (as
	// root: /proc/1/fd/1 is the agent's), transitions; the secret, which
	// a command printed, is not there.
	marker := "entrypoint-output-" + randHex(6)
	code, _, b = a.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/exec"), map[string]any{
		"command": "echo " + marker + " > /proc/1/fd/1; echo $API_KEY", "user": "root"}, tok)
	if code != http.StatusOK || strings.Contains(string(b), usageSecret) {
		t.Fatalf("exec as root: %d %s", code, b)
	}
	if !eventually(5*time.Second, 100*time.Millisecond, func() bool {
		out, _, _ = cliRun(t, a.addr, "logs", id)
		return strings.Contains(out, marker)
	}) {
		t.Errorf("logs lack the marker written to the container's stdout:\n%s", out)
	}
	for _, want := range []string{"PENDING -> READY", "agent serving", "transition"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	code, _, b = a.mustCall(t, http.MethodGet, "/v1/leases/"+id+"/logs?tail=5", nil, tok)
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"result":`)) || !bytes.Contains(b, []byte(marker)) {
		t.Errorf("REST logs with the lease token: %d %s", code, b)
	}

	// Follow, then kill the sandbox: the lease fails (no restarts) and the
	// follow ends by itself with the FAILED transition and its reason.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, orchBin, "logs", id, "--follow", "-o", "json")
	cmd.Env = append(hermeticEnv(), "BERTH_ADDR=http://"+a.addr, "BERTH_TOKEN="+operatorToken)
	var fout syncBuf
	var ferr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &fout, &ferr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if !eventually(10*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(fout.String(), marker) }) {
		t.Fatalf("logs --follow printed no output: %s %s", fout.String(), ferr.String())
	}
	kill(cid)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("logs --follow: %v: %s", err, ferr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("logs --follow did not end after the lease failed:\n%s", fout.String())
	}
	var failed *orchv1.LogEntry
	for line := range strings.SplitSeq(strings.TrimSpace(fout.String()), "\n") {
		var e orchv1.LogEntry
		if err := decode([]byte(line), &e); err != nil {
			t.Fatalf("logs -o json line %q: %v", line, err)
		}
		if e.GetTransition().GetTo() == orchv1.LeaseState_LEASE_STATE_FAILED {
			failed = &e
		}
	}
	if failed == nil || failed.GetSource() != "transition" || !strings.Contains(failed.GetText(), "exited") {
		t.Errorf("logs --follow: no FAILED transition with the exit as reason:\n%s", fout.String())
	}
	// Once the sandbox is removed, its last output (kept at removal)
	// still shows with the reason.
	if !eventually(10*time.Second, 200*time.Millisecond, func() bool {
		l := a.mustGet(t, id)
		return l.GetState() == orchv1.LeaseState_LEASE_STATE_FAILED && !containerPresent(t, cid)
	}) {
		t.Logf("the failed lease's container %s is still present", cid)
	}
	out, errs, rc = cliRun(t, a.addr, "logs", id)
	if rc != 0 || !strings.Contains(out, "READY -> FAILED: ") || !strings.Contains(out, marker) || !strings.Contains(out, "agent serving") ||
		strings.Contains(out+fout.String(), usageSecret) {
		t.Errorf("logs of the failed lease lack the reason or the container's last output (or show the secret): exit %d:\n%s%s", rc, out, errs)
	}
	t.Logf("logs of the failed lease:\n%s", out)
}

// grepLines returns the lines of s that contain one of subs.
func grepLines(s string, subs ...string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(line, sub) && !strings.HasPrefix(line, "#") {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// syncBuf is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// BenchmarkUsageGet (make bench): GET /v1/leases/{id}, which samples the
// sandbox's usage on each call (Docker: the container's cgroup files),
// against GET /v1/leases (no usage) and the Engine's own one-shot stats
// call, which Get would otherwise cost.
func BenchmarkUsageGet(b *testing.B) {
	requireImage(b, minimalImage)
	dir, _ := newDataDir(b)
	o := startOrch(b, dir)
	acq := o.mustAcquire(b, "bench-usage-"+randHex(4), minimalImage, "600s")
	id, cid := acq.GetLease().GetId(), acq.GetLease().GetContainerId()
	defer o.mustRelease(b, id)
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	var get, list, engine []time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if o.mustGet(b, id).GetUsage().GetSampledAt() == nil {
			b.Fatal("no usage")
		}
		get = append(get, time.Since(t0))
		t1 := time.Now()
		if _, err := o.list(""); err != nil {
			b.Fatal(err)
		}
		list = append(list, time.Since(t1))
		if i < 10 { // a second each: ten samples
			t2 := time.Now()
			r, err := cli.ContainerStatsOneShot(context.Background(), cid)
			if err != nil {
				b.Fatal(err)
			}
			r.Body.Close()
			engine = append(engine, time.Since(t2))
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(percentile(get, 50)), "get-usage-p50-ms")
	b.ReportMetric(ms(percentile(get, 99)), "get-usage-p99-ms")
	b.ReportMetric(ms(percentile(list, 50)), "list-p50-ms")
	b.ReportMetric(ms(percentile(engine, 50)), "engine-stats-p50-ms")
}
