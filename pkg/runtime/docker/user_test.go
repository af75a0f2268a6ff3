package docker_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/docker"
)

// agentCall sends one REST request to sb's agent and returns the status and
// body.
func agentCall(t *testing.T, sb runtime.Sandbox, token, method, path, body string) (int, []byte) {
	t.Helper()
	return testenv.AgentCall(t, sb.Endpoint, token, method, path, body)
}

// runAs runs command in sb as user through the agent's REST exec.
func runAs(t *testing.T, sb runtime.Sandbox, token, user, command string) (int, testenv.ExecResult) {
	t.Helper()
	return testenv.AgentExec(t, sb.Endpoint, token, user, command)
}

// TestLeaseUser runs berth/base sandboxes with Spec.User "sandbox" (uid
// 1000): commands run as it by default, uploads belong to it, the agent's
// token (file and environment) and the agent itself are out of its reach,
// and root is available per command unless DenyRootUser forbids it.
func TestLeaseUser(t *testing.T) {
	requireDocker(t)
	if !imagePresent(t, baseImage) {
		testenv.SkipOrFailf(t, "%s not present (make images)", baseImage)
	}
	for _, inj := range []docker.Injection{docker.InjectCopy, docker.InjectVolume} {
		t.Run(string(inj), func(t *testing.T) {
			rt := newRuntime(t, func(c *docker.Config) { c.Injection = inj })
			ctx := context.Background()
			spec := testSpec(t, rt, baseImage)
			spec.User = "sandbox"
			sb, err := rt.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			tok := spec.AgentToken
			if _, res := runAs(t, sb, tok, "", `id -u; id -g; id -un; echo "$HOME $USER $LOGNAME"; pwd`); res.ExitCode != 0 ||
				res.Stdout != "1000\n1000\nsandbox\n/home/sandbox sandbox sandbox\n/workspace\n" {
				t.Errorf("default user: %+v", res)
			}
			// The agent is root and out of the command's reach.
			if _, res := runAs(t, sb, tok, "", `cat /.berth/token; cat /proc/1/environ; for p in $(pgrep -f sandbox-agent); do cat /proc/$p/environ; done; kill -9 1`); res.ExitCode == 0 ||
				strings.Contains(res.Stdout, tok) || strings.Contains(res.Stderr, tok) {
				t.Errorf("the command reached the agent's token or killed it: %+v", res)
			}
			if _, res := runAs(t, sb, tok, "", `grep -c . /proc/1/status >/dev/null && awk '/^Uid:/{print $2}' /proc/1/status`); strings.TrimSpace(res.Stdout) != "0" {
				t.Errorf("the agent (PID 1) runs as uid %q, want 0", res.Stdout)
			}
			// Uploads (and the parents they create) and mkdir belong to it.
			if code, b := agentCall(t, sb, tok, http.MethodPut, "/v1/files/workspace/a/b/up.txt", "hello"); code/100 != 2 {
				t.Fatalf("upload: %d %s", code, b)
			}
			for _, p := range []string{"/workspace", "/workspace/a", "/workspace/a/b", "/workspace/a/b/up.txt"} {
				if st := statInContainer(t, sb.ID, p); st.uid != 1000 || st.gid != 1000 {
					t.Errorf("%s owned by %d:%d, want 1000:1000", p, st.uid, st.gid)
				}
			}
			if _, res := runAs(t, sb, tok, "", `echo more >> /workspace/a/b/up.txt && cat /workspace/a/b/up.txt`); res.ExitCode != 0 {
				t.Errorf("the user cannot write its upload: %+v", res)
			}
			// Root per command (the policy allows it here).
			if code, res := runAs(t, sb, tok, "root", `id -u; cat /.berth/token >/dev/null && echo token-readable`); code != 200 || res.Stdout != "0\ntoken-readable\n" && inj == docker.InjectCopy {
				t.Errorf("exec as root: %d %+v", code, res)
			}
			if code, res := runAs(t, sb, tok, "nobody", `id -un`); code != 200 || res.Stdout != "nobody\n" {
				t.Errorf("exec as nobody: %d %+v", code, res)
			}
			if code, res := runAs(t, sb, tok, "no-such-user", `true`); code != http.StatusBadRequest {
				t.Errorf("exec as a missing user: %d %+v, want 400", code, res)
			}
		})
	}
	t.Run("DenyRootUser", func(t *testing.T) {
		rt := newRuntime(t)
		ctx := context.Background()
		spec := testSpec(t, rt, baseImage)
		spec.User, spec.DenyRootUser = "sandbox", true
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range []string{"root", "0", "0:0", "sandbox:root"} {
			code, res := runAs(t, sb, spec.AgentToken, u, `id`)
			if u == "sandbox:root" {
				// uid 1000 with group root: not uid 0, allowed.
				if code != 200 || !strings.HasPrefix(res.Stdout, "uid=1000(sandbox) gid=0(root)") {
					t.Errorf("exec as %s: %d %+v", u, code, res)
				}
				continue
			}
			if code != http.StatusForbidden || !strings.Contains(res.Stderr, "PERMISSION_DENIED") && !strings.Contains(res.Stderr, "root") {
				t.Errorf("exec as %s under DenyRootUser: %d %+v, want 403", u, code, res)
			}
		}
		if _, res := runAs(t, sb, spec.AgentToken, "", `id -u`); res.Stdout != "1000\n" {
			t.Errorf("default user under DenyRootUser: %+v", res)
		}
		// The file API acts as the user too: no writing where only root can.
		if code, b := agentCall(t, sb, spec.AgentToken, http.MethodPut, "/v1/files/etc/berth-test", "x"); code != http.StatusForbidden {
			t.Errorf("upload into /etc under DenyRootUser: %d %s, want 403", code, b)
		}
		if code, b := agentCall(t, sb, spec.AgentToken, http.MethodGet, "/v1/files/etc/shadow", ""); code != http.StatusForbidden {
			t.Errorf("download of /etc/shadow under DenyRootUser: %d %.100s, want 403", code, b)
		}
		if code, b := agentCall(t, sb, spec.AgentToken, http.MethodPut, "/v1/files/workspace/ok/up.txt", "x"); code/100 != 2 {
			t.Errorf("upload into /workspace under DenyRootUser: %d %s", code, b)
		} else if st := statInContainer(t, sb.ID, "/workspace/ok/up.txt"); st.uid != 1000 || st.gid != 1000 {
			t.Errorf("upload owned by %d:%d, want 1000:1000", st.uid, st.gid)
		}
		// A root default user cannot start under the policy.
		spec2 := testSpec(t, rt, baseImage)
		spec2.User, spec2.DenyRootUser = "root", true
		if _, err := rt.Create(ctx, spec2); err == nil || !strings.Contains(err.Error(), "root") {
			t.Errorf("Create with a root default user under DenyRootUser: %v, want a failure naming root", err)
		}
	})
}
