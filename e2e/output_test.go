package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// The output bound of the output tests: 1 MiB × 2.
const (
	outputMaxBytes = 1 << 20
	outputMaxFiles = 2
)

func withOutputBound(c *orchestrator.Config) {
	c.SandboxOutputMaxBytes, c.SandboxOutputMaxFiles = outputMaxBytes, outputMaxFiles
}

// outputBounded performs the attack of issue 21 item 5 on one backend: a
// lease (as root, which may write to the agent's stdout, /proc/1/fd/1)
// writes 30 MB there. The files the engine keeps for the sandbox's output
// (files lists them with their sizes) must stay within the configured
// bound, the lease stays READY, and its logs still end with the newest
// output.
func outputBounded(t *testing.T, a *api, image string, files func(t *testing.T, containerID string) map[string]int64) {
	r := a.acquireBody(t, map[string]any{"conversationId": "c-output", "image": image, "ttl": "600s", "user": "root"})
	id, tok := r.GetLease().GetId(), r.GetToken()
	defer a.mustRelease(t, id)
	marker := "last-words-" + randHex(6)
	code, _, b := a.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/exec"), map[string]any{
		"command": "i=0; while [ $i -lt 3000 ]; do head -c 10000 /dev/zero | tr '\\0' x; echo; i=$((i+1)); done > /proc/1/fd/1; echo " + marker + " > /proc/1/fd/1",
		"user":    "root", "timeout": "120s"}, tok)
	if code != http.StatusOK || !strings.Contains(string(b), `"exitCode":0`) {
		t.Fatalf("writing 30 MB to the agent's stdout: HTTP %d %s", code, b)
	}
	// The newest output reaches the logs: everything before it was
	// written to the engine's files.
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
		c, _, body := a.mustCall(t, http.MethodGet, "/v1/leases/"+id+"/logs?tail=5", nil, tok)
		return c == http.StatusOK && strings.Contains(string(body), marker)
	}) {
		t.Fatal("the newest output never reached the lease's logs")
	}
	fs := files(t, r.GetLease().GetContainerId())
	var total int64
	for name, size := range fs {
		total += size
		t.Logf("%s: %d bytes", name, size)
	}
	const slack = 64 << 10 // a json-file entry may end past max-size
	if len(fs) > outputMaxFiles || total > outputMaxBytes*outputMaxFiles+slack {
		t.Errorf("30 MB written to the sandbox's stdout left %d files, %d bytes on the host; want at most %d files of %d bytes", len(fs), total, outputMaxFiles, outputMaxBytes)
	}
	if total < outputMaxBytes {
		t.Errorf("only %d bytes kept: the output did not reach the engine's files, the check proves nothing", total)
	}
	if st := a.mustGet(t, id).GetState(); st != orchv1.LeaseState_LEASE_STATE_READY {
		t.Errorf("the lease is %s", st)
	}
}

// TestOutputBoundedDocker runs outputBounded on Docker: the container's
// json-file log and its rotated siblings.
func TestOutputBoundedDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, withOutputBound)
	outputBounded(t, o.api, minimalImage, func(t *testing.T, cid string) map[string]int64 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := dockerCLI(ctx, "inspect", "-f", "{{.HostConfig.LogConfig.Type}} {{.LogPath}}", cid)
		if err != nil {
			t.Fatalf("docker inspect %s: %v: %s", cid, err, out)
		}
		typ, path, _ := strings.Cut(strings.TrimSpace(out), " ")
		if typ != "json-file" || path == "" {
			t.Fatalf("log driver %q, log path %q", typ, path)
		}
		return filesWithPrefix(t, path)
	})
}

// TestOutputBoundedContainerd runs outputBounded on containerd: the task's
// log file and its rotated siblings in the sandbox's state directory.
func TestOutputBoundedContainerd(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, withOutputBound)
	outputBounded(t, o.api, minimalImage, func(t *testing.T, cid string) map[string]int64 {
		env.track(cid)
		return filesWithPrefix(t, filepath.Join(containerd.DefaultStateDir, "sandboxes", cid, "log"))
	})
}

// filesWithPrefix returns the files named path or path.SUFFIX, with their
// sizes.
func filesWithPrefix(t *testing.T, path string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	base := filepath.Base(path)
	for _, e := range ents {
		if n := e.Name(); n == base || strings.HasPrefix(n, base+".") {
			info, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			out[n] = info.Size()
		}
	}
	return out
}
