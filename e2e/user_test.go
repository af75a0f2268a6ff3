package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// proxyExec runs command as user (empty: the lease's) through the
// orchestrator's proxy with the lease token.
func proxyExec(t *testing.T, a *api, id, token, user, command string) (int, execResult) {
	t.Helper()
	code, _, b := a.mustCall(t, http.MethodPost, "/v1/sandboxes/"+id+"/v1/exec",
		map[string]any{"command": command, "user": user, "timeout": "30s"}, token)
	var r execResult
	if code == http.StatusOK {
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("exec result %s: %v", b, err)
		}
	} else {
		r.Stderr = string(b)
	}
	return code, r
}

// TestLeaseUserThroughOrchestrator: on berth/base, a lease's commands run as
// "sandbox" (uid 1000) by default, its uploads belong to that user, the
// agent's token is out of the commands' reach, and with AllowRootUser off
// root is PERMISSION_DENIED at acquire and per command.
func TestLeaseUserThroughOrchestrator(t *testing.T) {
	requireDocker(t)
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	r := o.api.mustAcquire(t, "user-"+randHex(4), baseImage, "300s")
	id, tok := r.GetLease().GetId(), r.GetToken()
	if u := r.GetLease().GetUser(); u != "sandbox" {
		t.Errorf("lease user = %q, want sandbox", u)
	}
	if code, res := proxyExec(t, o.api, id, tok, "", `id -u; id -un; echo $HOME`); code != 200 || res.Stdout != "1000\nsandbox\n/home/sandbox\n" {
		t.Errorf("default user: %d %+v", code, res)
	}
	if code, _, b := o.api.mustCall(t, http.MethodPut, "/v1/sandboxes/"+id+"/v1/files/workspace/sub/up.txt", "hello", tok); code/100 != 2 {
		t.Fatalf("upload: %d %s", code, b)
	}
	if _, res := proxyExec(t, o.api, id, tok, "", `stat -c %u:%g /workspace/sub /workspace/sub/up.txt`); res.Stdout != "1000:1000\n1000:1000\n" {
		t.Errorf("upload owners: %+v", res)
	}
	agentTok := o.agentToken(id)
	if _, res := proxyExec(t, o.api, id, tok, "", `cat /.berth/token /proc/1/environ; for p in $(pgrep sandbox-agent); do cat /proc/$p/environ; done; kill -9 1`); res.ExitCode == 0 ||
		strings.Contains(res.Stdout+res.Stderr, agentTok) {
		t.Errorf("a command reached the agent's token or killed the agent: %+v", res)
	}
	if code, res := proxyExec(t, o.api, id, tok, "root", `id -u`); code != 200 || res.Stdout != "0\n" {
		t.Errorf("root allowed by default: %d %+v", code, res)
	}

	t.Run("RootForbidden", func(t *testing.T) {
		dir, _ := newDataDir(t)
		o := startOrch(t, dir, func(c *orchestrator.Config) { c.AllowRootUser = false })
		code, _, b := o.api.mustCall(t, http.MethodPost, "/v1/leases", map[string]any{"conversationId": "root-" + randHex(4), "image": baseImage, "user": "root"})
		if code != http.StatusForbidden || !strings.Contains(string(b), "root") {
			t.Errorf("acquire as root under the policy: %d %s, want 403", code, b)
		}
		r := o.api.mustAcquire(t, "nonroot-"+randHex(4), baseImage, "300s")
		id, tok := r.GetLease().GetId(), r.GetToken()
		for _, u := range []string{"root", "0", "0:0"} {
			code, res := proxyExec(t, o.api, id, tok, u, `id -u`)
			if code != http.StatusForbidden {
				t.Errorf("exec as %s under the policy: %d %+v, want 403", u, code, res)
			} else if e := parseErr(t, []byte(res.Stderr)); e.Code != 7 { // PERMISSION_DENIED
				t.Errorf("exec as %s: error code %d (%s), want 7 PERMISSION_DENIED", u, e.Code, e.Message)
			}
		}
		if code, res := proxyExec(t, o.api, id, tok, "", `id -u`); code != 200 || res.Stdout != "1000\n" {
			t.Errorf("default user under the policy: %d %+v", code, res)
		}
		if l := o.api.mustGet(t, id); l.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
			t.Errorf("lease %s after refused commands", l.GetState())
		}
	})
}
