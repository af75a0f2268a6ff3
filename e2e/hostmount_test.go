package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// swapTarget is what the host-mount swap attack runs against: an
// orchestrator allowing read-write host mounts under prefix, and a way to
// kill a sandbox's container behind its back (for the in-place restart).
type swapTarget struct {
	a      *api
	prefix string
	image  string
	kill   func(tb testing.TB, cid string)
}

// TestHostMountSwapDocker: a tenant cannot make a host mount follow a
// symlink it swapped in, on Docker (hibernate/resume and in-place restart).
func TestHostMountSwapDocker(t *testing.T) {
	requireDocker(t)
	requireImage(t, baseImage)
	prefix := hostMountDir(t)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) { c.AllowHostMounts = prefix + ":rw" })
	tgt := swapTarget{a: o.api, prefix: prefix, image: baseImage,
		kill: func(tb testing.TB, cid string) { mustDocker(tb, "kill", cid) }}
	t.Run("hibernate", func(t *testing.T) { hostMountSwapResume(t, tgt) })
	t.Run("restart", func(t *testing.T) { hostMountSwapRestart(t, tgt) })
}

// TestHostMountSwapContainerd is TestHostMountSwapDocker on containerd.
func TestHostMountSwapContainerd(t *testing.T) {
	rt := requireContainerd(t)
	requireCtrdImage(t, minimalImage)
	prefix := hostMountDir(t)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, func(c *orchestrator.Config) { c.AllowHostMounts = prefix + ":rw" })
	tgt := swapTarget{a: o.api, prefix: prefix, image: minimalImage,
		kill: func(tb testing.TB, cid string) { killCtrdTask(tb, rt, cid) }}
	t.Run("hibernate", func(t *testing.T) { hostMountSwapResume(t, tgt) })
	t.Run("restart", func(t *testing.T) { hostMountSwapRestart(t, tgt) })
}

// swapAttack acquires a lease mounting the allowed prefix at /mnt/p and its
// sub-directory "a" at /mnt/a (read-write), then, as the tenant inside the
// sandbox, replaces the host directory prefix/a (seen as /mnt/p/a; "a" is
// a fresh name for each call) with a
// symlink to outside, a host directory not under the prefix. It returns the
// lease id, its token and container id.
func swapAttack(t *testing.T, tgt swapTarget, conv, outside string) (id, tok, cid string) {
	t.Helper()
	name := "a-" + randHex(4)
	sub := filepath.Join(tgt.prefix, name)
	if err := os.Mkdir(sub, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sub, 0o777); err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"conversationId": conv, "ttl": "600s", "image": tgt.image, "mounts": []map[string]any{
		{"hostPath": tgt.prefix, "target": "/mnt/p"},
		{"hostPath": sub, "target": "/mnt/a"},
	}}
	code, _, b := tgt.a.mustCall(t, http.MethodPost, "/v1/leases", body)
	if code != http.StatusOK {
		t.Fatalf("acquire with host mounts: HTTP %d: %s", code, b)
	}
	var r orchv1.AcquireResponse
	if err := decode(b, &r); err != nil {
		t.Fatal(err)
	}
	id, tok, cid = r.GetLease().GetId(), r.GetToken(), r.GetLease().GetContainerId()
	t.Cleanup(func() {
		tgt.a.call(http.MethodDelete, "/v1/leases/"+id, nil) //nolint:errcheck // best effort; the orchestrator's cleanup reaps too
	})
	pexec(t, tgt.a, id, tok, `echo mine > /mnt/a/mine`)
	// The attack: the live bind at /mnt/a is not affected; the next bind of
	// prefix/a (a start of the stopped container) would follow the symlink.
	out, _ := pexec(t, tgt.a, id, tok, `mv /mnt/p/`+name+` /mnt/p/`+name+`.orig && ln -s `+outside+` /mnt/p/`+name+` && readlink /mnt/p/`+name)
	if strings.TrimSpace(out) != outside {
		t.Fatalf("the swap inside the sandbox: readlink = %q, want %q", out, outside)
	}
	if fi, err := os.Lstat(sub); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("host side after the swap: %s is not a symlink (%v, %v)", sub, fi, err)
	}
	return id, tok, cid
}

// outsideDir is a host directory outside every allowed prefix, writable by
// any sandbox user, with one file "hello".
func outsideDir(t *testing.T) string { return hostMountDir(t) }

// requireOutsideUntouched fails when anything but "hello" is in outside.
func requireOutsideUntouched(t *testing.T, outside string) {
	t.Helper()
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"hello"}) {
		t.Fatalf("the host directory %s outside the allowed prefix now holds %v: the sandbox wrote through the swapped-in symlink", outside, names)
	}
}

// requireNotOutside fails when the sandbox of READY lease id sees outside
// at /mnt/a (the mount followed the symlink): it writes a file there as
// the tenant would and looks for it on the host.
func requireNotOutside(t *testing.T, tgt swapTarget, id, tok, outside string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, res, err := tgt.a.proxyExec(ctx, id, tok, map[string]any{"command": `ls /mnt/a; echo pwned > /mnt/a/pwned`})
	t.Logf("in the sandbox after the bind again: %+v %v", res, err)
	requireOutsideUntouched(t, outside)
	if strings.Contains(res.Stdout, "hello") {
		t.Fatalf("the sandbox's /mnt/a shows the host directory %s outside the allowed prefix: %q", outside, res.Stdout)
	}
}

// hostMountSwapResume: after the swap, hibernate and resume. The resume is
// refused (the host path changed since the acquire), the lease stays
// PAUSED with its container stopped, and nothing is written outside the
// prefix.
func hostMountSwapResume(t *testing.T, tgt swapTarget) {
	outside := outsideDir(t)
	id, tok, _ := swapAttack(t, tgt, "hm-swap-hib-"+randHex(4), outside)
	pauseCall(t, tgt.a, id, "hibernate")
	code, _, b := tgt.a.mustCall(t, http.MethodPost, "/v1/leases/"+id+":resume", map[string]any{})
	if code == http.StatusOK {
		requireNotOutside(t, tgt, id, tok, outside)
		t.Fatalf("resume after the swap: HTTP 200, want it refused: %s", b)
	}
	msg := parseErr(t, b).Message
	t.Logf("resume refused: HTTP %d: %s", code, msg)
	if code != http.StatusBadRequest && code != http.StatusConflict && code != http.StatusPreconditionFailed ||
		!strings.Contains(msg, "mounts[1].host_path") || !strings.Contains(msg, "symlink") {
		t.Fatalf("resume after the swap: HTTP %d %q, want a failed precondition naming mounts[1].host_path and the symlink", code, msg)
	}
	if l := tgt.a.mustGet(t, id); l.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED {
		t.Fatalf("after the refused resume the lease is %s (%s), want PAUSED", l.GetState(), l.GetReason())
	}
	requireOutsideUntouched(t, outside)
}

// hostMountSwapRestart: after the swap, the container is killed behind
// berth's back; the in-place restart refuses to bind the changed path, so
// the lease fails with the reason, and nothing is written outside.
func hostMountSwapRestart(t *testing.T, tgt swapTarget) {
	outside := outsideDir(t)
	id, tok, cid := swapAttack(t, tgt, "hm-swap-rst-"+randHex(4), outside)
	tgt.kill(t, cid)
	var l *orchv1.Lease
	if !eventually(60*time.Second, 100*time.Millisecond, func() bool {
		l = tgt.a.mustGet(t, id)
		return l.GetState() == orchv1.LeaseState_LEASE_STATE_FAILED ||
			l.GetState() == orchv1.LeaseState_LEASE_STATE_READY && l.GetRestarts() > 0
	}) {
		t.Fatalf("60s after the kill the lease is %s (%s), want FAILED (or READY again)", l.GetState(), l.GetReason())
	}
	if l.GetState() == orchv1.LeaseState_LEASE_STATE_READY {
		requireNotOutside(t, tgt, id, tok, outside)
		t.Fatalf("restarted in place after the swap (%s), want the restart refused", l.GetReason())
	}
	t.Logf("restart refused: %s", l.GetReason())
	if !strings.Contains(l.GetReason(), "mounts[1].host_path") || !strings.Contains(l.GetReason(), "symlink") {
		t.Fatalf("lease FAILED with reason %q, want it to name mounts[1].host_path and the symlink", l.GetReason())
	}
	requireOutsideUntouched(t, outside)
}

// TestHostMountSwapAcrossRestartDocker: the check survives an orchestrator
// restart. The tenant swaps its mount's source for a symlink and the lease
// is hibernated; a new orchestrator on the same data dir (the lease and
// what its acquire checked read back from the store) refuses the resume.
func TestHostMountSwapAcrossRestartDocker(t *testing.T) {
	requireDocker(t)
	requireImage(t, baseImage)
	prefix := hostMountDir(t)
	dir, _ := newDataDir(t)
	allow := func(c *orchestrator.Config) { c.AllowHostMounts = prefix + ":rw" }
	o := startOrch(t, dir, allow)
	outside := outsideDir(t)
	id, tok, _ := swapAttack(t, swapTarget{a: o.api, prefix: prefix, image: baseImage}, "hm-swap-orch-"+randHex(4), outside)
	pauseCall(t, o.api, id, "hibernate")
	o.stop(t)
	o = startOrch(t, dir, allow)
	code, _, b := o.mustCall(t, http.MethodPost, "/v1/leases/"+id+":resume", map[string]any{})
	if code == http.StatusOK {
		requireNotOutside(t, swapTarget{a: o.api}, id, tok, outside)
		t.Fatalf("resume after the swap and an orchestrator restart: HTTP 200, want it refused: %s", b)
	}
	if msg := parseErr(t, b).Message; !strings.Contains(msg, "mounts[1].host_path") || !strings.Contains(msg, "symlink") {
		t.Fatalf("resume after an orchestrator restart: HTTP %d %q, want it refused naming mounts[1].host_path", code, msg)
	}
	requireOutsideUntouched(t, outside)
	o.mustRelease(t, id)
}
