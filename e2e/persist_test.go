package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// persistTarget is what the persistence scenario runs against: an
// orchestrator's API and address, and its runtime's volumes for the
// cleanup (which removes what a failed test left).
type persistTarget struct {
	a      *api
	addr   string
	vm     runtime.VolumeManager
	reap   func() // releases every live lease and waits for the sandboxes to go
	hostRW string // a directory the orchestrator allows read-write host mounts under
}

// TestPersistDocker runs the persistent workspace scenario on Docker.
func TestPersistDocker(t *testing.T) {
	requireDocker(t)
	requireImage(t, baseImage)
	hostRW := hostMountDir(t)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) { c.AllowHostMounts = hostRW + ":rw"; c.Clients = persistClients })
	persistScenario(t, persistTarget{a: o.api, addr: strings.TrimPrefix(o.base, "http://"), vm: dockerRT, hostRW: hostRW,
		reap: func() { removeContainers(runtime.LabelInstance + "=" + instance) }})
}

// TestPersistContainerd runs the persistent workspace scenario on
// containerd.
func TestPersistContainerd(t *testing.T) {
	rt := requireContainerd(t)
	requireCtrdImage(t, minimalImage)
	hostRW := hostMountDir(t)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, func(c *orchestrator.Config) { c.AllowHostMounts = hostRW + ":rw"; c.Clients = persistClients })
	persistScenario(t, persistTarget{a: o.api, addr: strings.TrimPrefix(o.base, "http://"), vm: rt, hostRW: hostRW,
		reap: func() { o.reapAll(t); waitNoLive(t, o.api) }})
}

// TestVolumeRetentionDocker: a volume unused for longer than the retention
// is removed; one in use is not.
func TestVolumeRetentionDocker(t *testing.T) {
	requireDocker(t)
	requireImage(t, baseImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) { c.Volumes.Retention = time.Second })
	tgt := persistTarget{a: o.api, vm: dockerRT, reap: func() { removeContainers(runtime.LabelInstance + "=" + instance) }}
	conv := "persist-ret-" + randHex(4)
	r := acquirePersist(t, tgt, conv)
	vol := r.GetLease().GetWorkspace().GetVolume()
	time.Sleep(2 * time.Second) // past the retention, but in use
	if v := getVolume(t, tgt.a, vol); v == nil || !v.GetInUse() {
		t.Fatalf("volume %s in use was reaped or is not in use: %+v", vol, v)
	}
	o.mustRelease(t, r.GetLease().GetId())
	began := time.Now()
	if !eventually(20*time.Second, 100*time.Millisecond, func() bool { return getVolume(t, tgt.a, vol) == nil }) {
		t.Fatalf("unused volume %s not reaped within 20s of a 1s retention", vol)
	}
	t.Logf("unused volume reaped %s after its lease's release (retention 1s)", time.Since(began).Round(time.Millisecond))
	if _, err := dockerCLI(context.Background(), "volume", "inspect", vol); err == nil {
		t.Errorf("the engine still has volume %s", vol)
	}
}

// persistClients is a client owner besides the operator, to check that a
// client sees only its own owner's volumes.
var persistClients = []orchestrator.Client{{Owner: "persist-team", Token: "persist-client-token-0123456789"}}

// hostMountDir is a fresh host directory (symlinks resolved) with a file
// "hello", writable by any sandbox user.
func hostMountDir(t *testing.T) string {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// acquirePersist acquires conv with workspace.persist and registers the
// removal of its volume (after its sandbox) at the end of the test.
func acquirePersist(t *testing.T, tgt persistTarget, conv string) *orchv1.AcquireResponse {
	t.Helper()
	body := map[string]any{"conversationId": conv, "ttl": "600s", "workspace": map[string]any{"persist": true}}
	code, _, b := tgt.a.mustCall(t, http.MethodPost, "/v1/leases", body)
	if code != http.StatusOK {
		t.Fatalf("acquire %s with workspace.persist: HTTP %d: %s", conv, code, b)
	}
	var r orchv1.AcquireResponse
	if err := decode(b, &r); err != nil {
		t.Fatal(err)
	}
	vol := r.GetLease().GetWorkspace().GetVolume()
	if !r.GetLease().GetWorkspace().GetPersist() || !strings.HasPrefix(vol, "berth-ws-") {
		t.Fatalf("lease workspace = %+v, want a berth-ws- volume", r.GetLease().GetWorkspace())
	}
	t.Cleanup(func() {
		tgt.reap()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		for range 50 { // the sandbox may still be going
			if err = tgt.vm.RemoveVolume(ctx, vol); err == nil || !errdefs.IsFailedPrecondition(err) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("cleanup: remove volume %s: %v", vol, err)
		}
	})
	return &r
}

// getVolume returns GET /v1/volumes/NAME, nil when it is 404.
func getVolume(t *testing.T, a *api, name string) *orchv1.Volume {
	t.Helper()
	code, _, b := a.mustCall(t, http.MethodGet, "/v1/volumes/"+name, nil)
	if code == http.StatusNotFound {
		return nil
	}
	if code != http.StatusOK {
		t.Fatalf("GET /v1/volumes/%s: HTTP %d: %s", name, code, b)
	}
	var v orchv1.Volume
	if err := decode(b, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// waitUnused waits until no lease uses volume name.
func waitUnused(t *testing.T, a *api, name string) *orchv1.Volume {
	t.Helper()
	var v *orchv1.Volume
	if !eventually(30*time.Second, 50*time.Millisecond, func() bool { v = getVolume(t, a, name); return v != nil && !v.GetInUse() }) {
		t.Fatalf("volume %s still in use (or gone) 30s after its lease's release: %+v", name, v)
	}
	return v
}

// waitNoLive waits until the orchestrator has no live lease.
func waitNoLive(t *testing.T, a *api) {
	eventually(time.Minute, 100*time.Millisecond, func() bool {
		ls, err := a.list("")
		return err == nil && len(ls) == 0
	})
}

// persistScenario: a file written to a persistent workspace is there when
// the conversation is acquired again after its release; volumes are listed
// and removed through REST and the CLI (refused while in use); a host path
// outside the allowed prefixes is refused naming it, one inside is mounted.
func persistScenario(t *testing.T, tgt persistTarget) {
	a := tgt.a
	conv := "persist-" + randHex(4)
	r := acquirePersist(t, tgt, conv)
	l, tok := r.GetLease(), r.GetToken()
	vol := l.GetWorkspace().GetVolume()
	pexec(t, a, l.GetId(), tok, "echo kept across leases > /workspace/note.txt && id -u > /workspace/uid")

	// In use: listed with its lease, not removable, and not in another
	// owner's list; a lease token may not ask.
	client := checkVolumeInUse(t, a, conv, vol, l.GetId())
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		if code, _, b := a.mustCall(t, m, "/v1/volumes/"+vol, nil, client); code != http.StatusNotFound {
			t.Errorf("client %s of another owner's volume: HTTP %d: %s; want 404", m, code, b)
		}
	}
	if code, _, b := a.mustCall(t, http.MethodGet, "/v1/volumes", nil, tok); code != http.StatusForbidden {
		t.Errorf("lease token list: HTTP %d: %s; want 403", code, b)
	}

	// Release, then acquire the conversation again: the file is there.
	a.mustRelease(t, l.GetId())
	v := waitUnused(t, a, vol)
	if v.GetSizeBytes() < int64(len("kept across leases\n")) || v.GetLastUsedAt() == nil {
		t.Errorf("released volume = %+v, want its size and last use", v)
	}
	began := time.Now()
	r2 := acquirePersist(t, tgt, conv)
	l2 := r2.GetLease()
	t.Logf("re-acquired conversation %s with its volume in %s", conv, time.Since(began).Round(time.Millisecond))
	if l2.GetId() == l.GetId() || l2.GetWorkspace().GetVolume() != vol {
		t.Fatalf("second lease %s volume %q, want a new lease on %s", l2.GetId(), l2.GetWorkspace().GetVolume(), vol)
	}
	if out, _ := pexec(t, a, l2.GetId(), r2.GetToken(), "cat /workspace/note.txt"); out != "kept across leases\n" {
		t.Errorf("the second lease reads %q from /workspace/note.txt", out)
	}
	// The workspace stays writable by the lease's user.
	pexec(t, a, l2.GetId(), r2.GetToken(), "touch /workspace/again")
	a.mustRelease(t, l2.GetId())
	waitUnused(t, a, vol)

	// The CLI lists and removes it.
	out, errs, code2 := cliRun(t, tgt.addr, "volume", "list", "-o", "json")
	if code2 != 0 || !strings.Contains(out, vol) {
		t.Fatalf("volume list -o json: exit %d: %s %s", code2, out, errs)
	}
	var listed struct {
		Volumes []struct {
			Name           string `json:"name"`
			ConversationID string `json:"conversationId"`
		} `json:"volumes"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("volume list -o json: %v: %s", err, out)
	}
	found := false
	for _, x := range listed.Volumes {
		found = found || (x.Name == vol && x.ConversationID == conv)
	}
	if !found {
		t.Errorf("volume list -o json has no %s of %s: %s", vol, conv, out)
	}
	if out, errs, code2 := cliRun(t, tgt.addr, "volume", "rm", vol); code2 != 0 || !strings.Contains(out, "removed "+vol) {
		t.Fatalf("volume rm: exit %d: %s %s", code2, out, errs)
	}
	if v := getVolume(t, a, vol); v != nil {
		t.Errorf("GET after rm: %+v", v)
	}
	if _, err := tgt.vm.InspectVolume(context.Background(), vol); !errdefs.IsNotFound(err) {
		t.Errorf("the runtime still has volume %s: %v", vol, err)
	}

	// Host paths: outside the allowed prefix refused naming the path (also
	// through a symlink), inside mounted.
	escape := filepath.Join(tgt.hostRW, "escape")
	if err := os.Symlink("/etc", escape); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/etc", escape} {
		body := map[string]any{"conversationId": "persist-bad-" + randHex(4), "mounts": []map[string]any{{"hostPath": p, "target": "/mnt/x", "readOnly": true}}}
		code, _, b := a.mustCall(t, http.MethodPost, "/v1/leases", body)
		if e := parseErr(t, b); code != http.StatusForbidden || !strings.Contains(e.Message, p) {
			t.Errorf("mount of %s: HTTP %d: %s; want 403 naming the path", p, code, b)
		}
	}
	body := map[string]any{"conversationId": "persist-host-" + randHex(4), "mounts": []map[string]any{{"hostPath": tgt.hostRW, "target": "/mnt/project"}}}
	code, _, b := a.mustCall(t, http.MethodPost, "/v1/leases", body)
	if code != http.StatusOK {
		t.Fatalf("acquire with an allowed host mount: HTTP %d: %s", code, b)
	}
	var r3 orchv1.AcquireResponse
	if err := decode(b, &r3); err != nil {
		t.Fatal(err)
	}
	defer a.mustRelease(t, r3.GetLease().GetId())
	if ms := r3.GetLease().GetMounts(); len(ms) != 1 || ms[0].GetHostPath() != tgt.hostRW {
		t.Errorf("lease mounts = %+v", ms)
	}
	if out, _ := pexec(t, a, r3.GetLease().GetId(), r3.GetToken(), "cat /mnt/project/hello && echo back > /mnt/project/out"); out != "from the host\n" {
		t.Errorf("host mount reads %q", out)
	}
	if got, err := os.ReadFile(filepath.Join(tgt.hostRW, "out")); err != nil || string(got) != "back\n" {
		t.Errorf("host file written through the mount = %q, %v", got, err)
	}
}

// TestPersistDiskLimitDocker: the disk limit covers the persistent
// workspace: writing past it into /workspace (the volume, not the
// container's layer) fails the lease for its disk, and the volume keeps
// the files.
func TestPersistDiskLimitDocker(t *testing.T) {
	requireDocker(t)
	requireImage(t, baseImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) {
		c.Disk.Interval, c.Disk.Grace = 200*time.Millisecond, 500*time.Millisecond
	})
	tgt := persistTarget{a: o.api, vm: dockerRT, reap: func() { removeContainers(runtime.LabelInstance + "=" + instance) }}
	conv := "persist-disk-" + randHex(4)
	body := map[string]any{"conversationId": conv, "ttl": "600s", "workspace": map[string]any{"persist": true},
		"resources": map[string]any{"diskBytes": 4 << 20}}
	code, _, b := o.mustCall(t, http.MethodPost, "/v1/leases", body)
	if code != http.StatusOK {
		t.Fatalf("acquire: HTTP %d: %s", code, b)
	}
	var r orchv1.AcquireResponse
	if err := decode(b, &r); err != nil {
		t.Fatal(err)
	}
	vol := r.GetLease().GetWorkspace().GetVolume()
	t.Cleanup(func() {
		tgt.reap()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := tgt.vm.RemoveVolume(ctx, vol); err != nil {
			t.Errorf("cleanup: remove volume %s: %v", vol, err)
		}
	})
	id := r.GetLease().GetId()
	pexec(t, o.api, id, r.GetToken(), "head -c 6291456 /dev/zero > /workspace/big")
	var l *orchv1.Lease
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
		l = o.mustGet(t, id)
		return l.GetState() == orchv1.LeaseState_LEASE_STATE_FAILED
	}) {
		t.Fatalf("lease %s not FAILED 30s after writing 6 MiB into a 4 MiB workspace: %s (%s), usage %+v", id, l.GetState(), l.GetReason(), l.GetUsage())
	}
	if !strings.Contains(l.GetReason(), "disk limit") {
		t.Errorf("reason %q, want the disk limit", l.GetReason())
	}
	if v, err := tgt.vm.InspectVolume(context.Background(), vol); err != nil || v.SizeBytes < 6<<20 {
		t.Errorf("volume after the failure: %+v, %v; want its 6 MiB kept", v, err)
	}
}

// checkVolumeInUse checks that volume vol of conversation conv, in use by
// lease leaseID, is listed with that lease, refused by DELETE (in use),
// and left out of the list of another owner's client, whose token it
// returns.
func checkVolumeInUse(t *testing.T, a *api, conv, vol, leaseID string) string {
	t.Helper()
	code, _, b := a.mustCall(t, http.MethodGet, "/v1/volumes?conversationId="+conv, nil)
	var list orchv1.ListVolumesResponse
	if code != http.StatusOK || decode(b, &list) != nil || len(list.GetVolumes()) != 1 || list.GetVolumes()[0].GetName() != vol ||
		list.GetVolumes()[0].GetLeaseId() != leaseID {
		t.Fatalf("GET /v1/volumes?conversationId=%s: HTTP %d: %s", conv, code, b)
	}
	code, _, b = a.mustCall(t, http.MethodDelete, "/v1/volumes/"+vol, nil)
	if e := parseErr(t, b); code != http.StatusBadRequest || !strings.Contains(e.Message, "in use") {
		t.Fatalf("DELETE of a volume in use: HTTP %d: %s; want 400 FAILED_PRECONDITION", code, b)
	}
	client := persistClients[0].Token
	if code, _, b := a.mustCall(t, http.MethodGet, "/v1/volumes", nil, client); code != http.StatusOK || strings.Contains(string(b), vol) {
		t.Errorf("another owner's client list: HTTP %d: %s; want 200 without %s", code, b, vol)
	}
	return client
}
