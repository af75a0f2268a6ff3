package containerd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/conformance"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
)

// removeRemappedSnapshots removes the remapped image snapshots of range
// base (kept by the runtime as a cache; tests leave nothing behind).
func removeRemappedSnapshots(tb testing.TB, rt *containerd.Runtime, base uint32) {
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	sn := rt.Client().SnapshotService(containerd.DefaultSnapshotter)
	var keys []string
	_ = sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if strings.HasPrefix(info.Name, fmt.Sprintf("berth-userns-%d-", base)) {
			keys = append(keys, info.Name)
		}
		return nil
	})
	for _, k := range keys {
		err := sn.Remove(ctx, k)
		if err == nil {
			continue
		}
		// containerd 1.6's garbage collector removes a child snapshot (e.g.
		// one only a failed Create's lease held) without unlisting it from
		// its parent, whose Remove then fails with "cannot remove snapshot
		// with child" forever. Dropping the gc.root label lets the garbage
		// collector take the parent instead.
		info, serr := sn.Stat(ctx, k)
		if serr == nil {
			delete(info.Labels, "containerd.io/gc.root")
			_, serr = sn.Update(ctx, info, "labels.containerd.io/gc.root")
		}
		if serr != nil {
			tb.Errorf("remove remapped snapshot %s: %v; unlabel: %v", k, err, serr)
		}
	}
}

// agentREST sends one REST request to sb's agent.
func agentREST(t *testing.T, sb runtime.Sandbox, token, method, path, body string) (int, string) {
	t.Helper()
	code, b := testenv.AgentCall(t, sb.Endpoint, token, method, path, body)
	return code, string(b)
}

// shOut runs command in sb as user and returns its output; anything but
// exit code 0 fails t.
func shOut(t *testing.T, sb runtime.Sandbox, token, user, command string) string {
	t.Helper()
	code, res := testenv.AgentExec(t, sb.Endpoint, token, user, command)
	if code != 200 || res.ExitCode != 0 {
		t.Fatalf("exec %q as %q: %d %+v", command, user, code, res)
	}
	return res.Stdout
}

// hostIDs returns the real uid and gid of host pid pid from /proc.
func hostIDs(t *testing.T, pid int) (uid, gid string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "Uid:" {
			uid = f[1]
		}
		if len(f) >= 2 && f[0] == "Gid:" {
			gid = f[1]
		}
	}
	return uid, gid
}

// TestUserNamespaces runs berth/base with UserNamespaces: the sandbox's
// root (the agent) is uid UserNSBase on the host, its user "sandbox" is
// UserNSBase+1000, files it creates belong to those host ids, and inside
// it looks like an ordinary root and uid 1000.
func TestUserNamespaces(t *testing.T) {
	requireContainerd(t)
	if !baseOK {
		testenv.SkipOrFailf(t, "%s is not present (make images, with Docker running to import it)", baseImage)
	}
	const base = 200000
	rt := newRuntime(t, func(c *containerd.Config) { c.UserNamespaces, c.UserNSBase = true, base })
	t.Cleanup(func() { removeRemappedSnapshots(t, rt, base) }) // after the sandbox's removal
	spec := testSpec(t, baseImage)
	spec.User = "sandbox"
	spec.ReadyTimeout = 10 * time.Minute // the first sandbox of the image remaps it
	began := time.Now()
	sb := create(t, rt, spec)
	t.Logf("first Create with user namespaces (remaps the image unless already done): %s", time.Since(began).Round(time.Millisecond))
	pid := taskPid(t, rt, sb.ID)
	if uid, gid := hostIDs(t, pid); uid != strconv.Itoa(base) || gid != strconv.Itoa(base) {
		t.Errorf("the agent (host pid %d) runs as host uid %s gid %s, want %d", pid, uid, gid, base)
	}
	if got := strings.Fields(shOut(t, sb, spec.AgentToken, "", "cat /proc/self/uid_map")); strings.Join(got, " ") != fmt.Sprintf("0 %d 65536", base) {
		t.Errorf("uid_map = %q", got)
	}
	if got := shOut(t, sb, spec.AgentToken, "", "id -u; id -g"); got != "1000\n1000\n" {
		t.Errorf("default user inside: %q", got)
	}
	if got := shOut(t, sb, spec.AgentToken, "root", "id -u; touch /etc/root-can-write && echo ok"); got != "0\nok\n" {
		t.Errorf("root inside: %q", got)
	}
	// A command's host uid: find it by its unique command line.
	marker := fmt.Sprintf("sleep 77.%d", time.Now().UnixNano()%1000)
	body, _ := json.Marshal(map[string]any{"command": marker})
	if code, b := agentREST(t, sb, spec.AgentToken, http.MethodPost, "/v1/processes", string(body)); code != 200 {
		t.Fatalf("start %q: %d %s", marker, code, b)
	}
	found := false
	for deadline := time.Now().Add(5 * time.Second); !found && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			p, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			if strings.ReplaceAll(string(cmd), "\x00", " ") == marker+" " {
				found = true
				if uid, _ := hostIDs(t, p); uid != strconv.Itoa(base+1000) {
					t.Errorf("the command %q (host pid %d) runs as host uid %s, want %d", marker, p, uid, base+1000)
				} else {
					t.Logf("host view: agent pid %d uid %d, command pid %d uid %s", pid, base, p, uid)
				}
			}
		}
	}
	if !found {
		t.Errorf("command %q not found on the host", marker)
	}
	// Uploads belong to the sandbox's user, i.e. base+1000 on the host.
	if code, b := agentREST(t, sb, spec.AgentToken, http.MethodPut, "/v1/files/workspace/u.txt", "x"); code/100 != 2 {
		t.Fatalf("upload: %d %s", code, b)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/root/workspace/u.txt", pid), &st); err != nil || st.Uid != base+1000 {
		t.Errorf("upload on the host: uid %d, %v; want %d", st.Uid, err, base+1000)
	}
}

// TestConformanceUserNS runs the conformance suite with user namespaces.
func TestConformanceUserNS(t *testing.T) {
	requireContainerd(t)
	if testing.Short() {
		t.Skip("-short")
	}
	const base = 400000
	images := conformance.Images{Empty: emptyImage, BadUser: badUserImage}
	if shellOK {
		images.Shell = shellImage
	}
	conformance.Run(t, func(t *testing.T) runtime.Runtime {
		rt := newRuntime(t, func(c *containerd.Config) { c.UserNamespaces, c.UserNSBase = true, base })
		t.Cleanup(func() { removeRemappedSnapshots(t, rt, base) })
		return rt
	}, images, conformance.WithKill(kill), conformance.WithUnmanaged(unmanaged))
}
