package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// The disk limit enforced by berth, on the real engines: on this machine
// Docker runs fuse-overlayfs and containerd the overlayfs snapshotter, so
// neither can bound a container's size and berth measures and acts.

const (
	diskLimit = 20 << 20 // the sandboxes' limit in these tests
	fillBytes = 30000000 // what the filling command writes (> diskLimit)
)

func diskConfig(c *orchestrator.Config) {
	c.DefaultDiskBytes = diskLimit
	c.Disk.Interval = 400 * time.Millisecond
	c.Disk.Grace = 2 * time.Second
}

// sandboxDo sends a request through the orchestrator's proxy to lease id's
// agent with the lease token; body may be nil.
func sandboxDo(a *api, id, tok, method, agentPath string, body io.Reader, contentType string) (int, []byte, error) {
	req, err := http.NewRequest(method, a.base+"/v1/sandboxes/"+id+agentPath, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// sandboxShell runs a shell command in the sandbox through the proxy and
// returns its stdout.
func sandboxShell(tb testing.TB, a *api, id, tok, command string) string {
	tb.Helper()
	j, _ := json.Marshal(map[string]any{"command": command})
	code, b, err := sandboxDo(a, id, tok, http.MethodPost, "/v1/exec", strings.NewReader(string(j)), "application/json")
	if err != nil || code != http.StatusOK {
		tb.Fatalf("exec %q: HTTP %d %v: %s", command, code, err, b)
	}
	var res struct {
		ExitCode int    `json:"exitCode"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	if err := json.Unmarshal(b, &res); err != nil || res.ExitCode != 0 {
		tb.Fatalf("exec %q: %v %s", command, err, b)
	}
	return res.Stdout
}

// wantRefused checks a 507 with the API's JSON error (code 8).
func wantRefused(tb testing.TB, what string, code int, b []byte) {
	tb.Helper()
	var e errBody
	if code != http.StatusInsufficientStorage || json.Unmarshal(b, &e) != nil || e.Code != 8 || !strings.HasPrefix(e.Message, "disk limit exceeded: ") {
		tb.Fatalf("%s: HTTP %d %s, want 507 with code 8 and a disk limit message", what, code, b)
	}
}

// diskScenario fills a sandbox past a 20 MiB limit and checks the
// outcome; kept checks (per backend) that the stopped container is still
// there with its files.
func diskScenario(t *testing.T, a *api, image string, acq func(conv string) *orchv1.AcquireResponse, kept func(containerID string)) {
	began := time.Now()
	full := acq("disk-full")
	nb := acq("disk-neighbour")
	id, tok := full.GetLease().GetId(), full.GetToken()
	if got := full.GetLease().GetResources().GetDiskBytes(); got != diskLimit {
		t.Fatalf("lease disk limit = %d, want %d", got, diskLimit)
	}

	// An upload larger than the limit: 507, and no file.
	big := strings.Repeat("u", 25<<20)
	code, b, err := sandboxDo(a, id, tok, http.MethodPut, "/v1/files/workspace/big.bin", strings.NewReader(big), "")
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, "25 MiB upload", code, b)
	// The same without a Content-Length (chunked): cut once past the limit.
	code, b, err = sandboxDo(a, id, tok, http.MethodPut, "/v1/files/workspace/chunked.bin", io.MultiReader(strings.NewReader(big)), "")
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, "25 MiB chunked upload", code, b)
	if ls := sandboxShell(t, a, id, tok, "ls -A /workspace"); strings.Contains(ls, "big.bin") || strings.Contains(ls, "chunked.bin") {
		t.Fatalf("a refused upload left a file: %q", ls)
	}

	// A command writes past the limit: a warning, then FAILED.
	filled := time.Now()
	sandboxShell(t, a, id, tok, fmt.Sprintf("head -c %d /dev/zero > /workspace/fill.bin && sync", fillBytes))
	var warned time.Duration
	if !eventually(10*time.Second, 50*time.Millisecond, func() bool {
		l := a.mustGet(t, id)
		for _, w := range l.GetWarnings() {
			if strings.HasPrefix(w, "disk limit exceeded: ") {
				warned = time.Since(filled)
				return true
			}
		}
		return l.GetState() != orchv1.LeaseState_LEASE_STATE_READY
	}) || warned == 0 {
		t.Fatalf("no disk warning while READY: %v", a.mustGet(t, id))
	}
	l := a.mustGet(t, id)
	if u := l.GetUsage().GetDiskBytes(); u <= diskLimit { // measured while the command wrote: past the limit
		t.Fatalf("usage %d, want more than %d", u, diskLimit)
	}
	// While over the limit even a tiny upload is refused.
	code, b, err = sandboxDo(a, id, tok, http.MethodPut, "/v1/files/workspace/tiny", strings.NewReader("x"), "")
	if err != nil {
		t.Fatal(err)
	}
	if l := a.mustGet(t, id); l.GetState() == orchv1.LeaseState_LEASE_STATE_READY {
		wantRefused(t, "tiny upload while over the limit", code, b)
	}
	var failed time.Duration
	if !eventually(15*time.Second, 100*time.Millisecond, func() bool {
		l = a.mustGet(t, id)
		failed = time.Since(filled)
		return l.GetState() == orchv1.LeaseState_LEASE_STATE_FAILED
	}) {
		t.Fatalf("lease not FAILED: %v", l)
	}
	if !strings.HasPrefix(l.GetReason(), "disk limit exceeded (") || !strings.HasSuffix(l.GetReason(), fmt.Sprintf(" > %d bytes)", diskLimit)) {
		t.Fatalf("reason %q", l.GetReason())
	}
	t.Logf("%s: warning %s after the fill, FAILED after %s (grace 2s): %q", image, warned.Round(time.Millisecond), failed.Round(time.Millisecond), l.GetReason())

	// The container is stopped, not removed, and stays through a few
	// reaper and resync passes.
	time.Sleep(time.Second)
	kept(full.GetLease().GetContainerId())

	// The neighbour is untouched.
	n := a.mustGet(t, nb.GetLease().GetId())
	if n.GetState() != orchv1.LeaseState_LEASE_STATE_READY || len(n.GetWarnings()) != 0 {
		t.Fatalf("neighbour: %s %q", n.GetState(), n.GetWarnings())
	}
	if out := sandboxShell(t, a, n.GetId(), nb.GetToken(), "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("neighbour exec: %q", out)
	}
	code, _, b = a.mustCall(t, http.MethodGet, "/metrics", nil)
	if code != http.StatusOK || !strings.Contains(string(b), "berth_disk_limit_stops_total 1\n") || !strings.Contains(string(b), "berth_disk_kept_sandboxes 1\n") {
		t.Fatalf("metrics: %d\n%s", code, b)
	}
	t.Logf("%s: scenario took %s", image, time.Since(began).Round(time.Millisecond))
}

func TestDiskLimitDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t) // removes every container of the instance at the end
	o := startOrch(t, dir, diskConfig, func(c *orchestrator.Config) { c.DefaultImage = minimalImage })
	acq := func(conv string) *orchv1.AcquireResponse { return o.mustAcquire(t, conv, minimalImage, "600s") }
	diskScenario(t, o.api, "docker", acq, func(cid string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sb, err := o.rt.Get(ctx, cid)
		if err != nil || sb.State != runtime.StateExited {
			t.Fatalf("kept container %s: %+v, %v; want it there, exited", cid, sb, err)
		}
		// The files are there for an operator to copy out.
		dst := filepath.Join(t.TempDir(), "fill.bin")
		mustDocker(t, "cp", cid+":/workspace/fill.bin", dst)
		if st, err := os.Stat(dst); err != nil || st.Size() != fillBytes {
			t.Fatalf("docker cp of the kept file: %v, %v", st, err)
		}
	})
}

func TestDiskLimitContainerd(t *testing.T) {
	env := newCtrdEnv(t)
	requireCtrdImage(t, minimalImage)
	o := startCtrdOrch(t, env, diskConfig)
	var keptID string
	t.Cleanup(func() { // before the env's leftover check: the kept container is expected
		if keptID == "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ctrd.rt.Remove(ctx, keptID); err != nil {
			t.Errorf("remove the kept container %s: %v", keptID, err)
		}
	})
	acq := func(conv string) *orchv1.AcquireResponse { return o.acq(t, conv, minimalImage, "600s") }
	diskScenario(t, o.api, "containerd", acq, func(cid string) {
		keptID = cid // the lease is FAILED: its container is no longer reaped with the live ones
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sb, err := ctrd.rt.Get(ctx, cid)
		if err != nil || sb.State == runtime.StateRunning {
			t.Fatalf("kept container %s: %+v, %v; want it there, stopped", cid, sb, err)
		}
		u, err := ctrd.rt.Usage(ctx, cid)
		if err != nil || u.DiskBytes < fillBytes {
			t.Fatalf("kept snapshot usage %d, %v; want the filled files still there", u.DiskBytes, err)
		}
	})
}
