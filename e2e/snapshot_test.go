package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// Client tokens of the snapshot tests: alice forks her own snapshots, bob
// may not see them.
const (
	aliceToken = "e2e-alice-token-0123456789"
	bobToken   = "e2e-bob-token-0123456789ab"
)

func withSnapshotClients(c *orchestrator.Config) {
	c.Clients = append(c.Clients, orchestrator.Client{Owner: "alice", Token: aliceToken}, orchestrator.Client{Owner: "bob", Token: bobToken})
}

// snapshotCall posts :snapshot for lease id with name and the token,
// requires 200 and returns the snapshot.
func snapshotCall(tb testing.TB, a *api, id, name, tok string) *orchv1.LeaseSnapshot {
	tb.Helper()
	code, _, b := a.mustCall(tb, http.MethodPost, "/v1/leases/"+id+":snapshot", map[string]any{"name": name}, tok)
	if code != http.StatusOK {
		tb.Fatalf("POST /v1/leases/%s:snapshot: HTTP %d: %s", id, code, b)
	}
	var s orchv1.LeaseSnapshot
	if err := decode(b, &s); err != nil {
		tb.Fatal(err)
	}
	return &s
}

// snapshotNames lists the snapshot names the token sees.
func snapshotNames(tb testing.TB, a *api, tok string) []string {
	tb.Helper()
	code, _, b := a.mustCall(tb, http.MethodGet, "/v1/snapshots", nil, tok)
	if code != http.StatusOK {
		tb.Fatalf("GET /v1/snapshots: HTTP %d: %s", code, b)
	}
	var r orchv1.ListSnapshotsResponse
	if err := decode(b, &r); err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, s := range r.GetSnapshots() {
		names = append(names, s.GetName())
	}
	sort.Strings(names)
	return names
}

// forkAcquire acquires conversation conv from snapshot name with tok.
func forkAcquire(a *api, conv, name, tok string) (int, []byte, *orchv1.AcquireResponse) {
	code, _, b, err := a.call(http.MethodPost, "/v1/leases", map[string]any{"conversationId": conv, "snapshot": name, "ttl": "600s"}, tok)
	if err != nil {
		return 0, []byte(err.Error()), nil
	}
	var r orchv1.AcquireResponse
	if code == http.StatusOK {
		if err := decode(b, &r); err != nil {
			return 0, []byte(err.Error()), nil
		}
	}
	return code, b, &r
}

// snapshotFork is the fork scenario on one backend: alice's lease writes
// a file and is snapshotted; the source keeps running; a fork from the
// snapshot has the file and the source's user, and its writes stay its
// own; bob can neither see nor fork nor remove alice's snapshot; the
// snapshot cannot be removed while the fork's sandbox exists; after the
// fork's release it can. gone reports whether a container no longer
// exists.
func snapshotFork(t *testing.T, a *api, image string, gone func(cid string) bool) {
	code, _, b := a.mustCall(t, http.MethodPost, "/v1/leases", map[string]any{"conversationId": "c-snap-src", "image": image, "ttl": "600s"}, aliceToken)
	if code != http.StatusOK {
		t.Fatalf("acquire: HTTP %d: %s", code, b)
	}
	var src orchv1.AcquireResponse
	if err := decode(b, &src); err != nil {
		t.Fatal(err)
	}
	sid, stok := src.GetLease().GetId(), src.GetToken()
	pexec(t, a, sid, stok, `mkdir -p /workspace/proj && echo forked-notes > /workspace/proj/notes.txt`)

	name := "e2e-" + runID + "-" + randHex(4)
	began := time.Now()
	snap := snapshotCall(t, a, sid, name, aliceToken)
	t.Logf("snapshot %s of %s: %d bytes in %s (server: %s)", snap.GetName(), image, snap.GetSizeBytes(),
		time.Since(began).Round(time.Millisecond), snap.GetDuration().AsDuration().Round(time.Millisecond))
	if !strings.HasPrefix(snap.GetRef(), runtime.SnapshotRef(name)+"-") || snap.GetOwner() != "alice" || snap.GetLeaseId() != sid || snap.GetSizeBytes() <= 0 {
		t.Fatalf("snapshot = %v", snap)
	}
	code, _, b = a.mustCall(t, http.MethodPost, "/v1/leases/"+sid+":snapshot", map[string]any{"name": name}, aliceToken)
	if code != http.StatusConflict {
		t.Errorf("a second snapshot named %s: HTTP %d: %s, want 409", name, code, b)
	}
	code, _, b = a.mustCall(t, http.MethodPost, "/v1/leases/"+sid+":snapshot", map[string]any{"name": "Not A Name"}, aliceToken)
	if code != http.StatusBadRequest || !strings.Contains(string(b), "name") {
		t.Errorf("snapshot with a bad name: HTTP %d: %s, want 400 naming name", code, b)
	}
	// The source runs on.
	if l := a.mustGet(t, sid); l.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
		t.Fatalf("source after its snapshot: %s (%s)", l.GetState(), l.GetReason())
	}
	if out, _ := pexec(t, a, sid, stok, `cat /workspace/proj/notes.txt`); out != "forked-notes\n" {
		t.Fatalf("source after its snapshot: %q", out)
	}

	// A paused lease can be snapshotted and stays paused as it was.
	for _, mode := range []string{"freeze", "hibernate"} {
		pauseCall(t, a, sid, mode)
		ps := snapshotCall(t, a, sid, name+"-"+mode, aliceToken)
		if l := a.mustGet(t, sid); l.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED || l.GetPaused() != mode {
			t.Errorf("%s lease after its snapshot: %s %q", mode, l.GetState(), l.GetPaused())
		}
		if code, _, b := a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+ps.GetName(), nil, aliceToken); code != http.StatusOK {
			t.Errorf("remove snapshot %s: HTTP %d: %s", ps.GetName(), code, b)
		}
		pauseCall(t, a, sid, "")
	}

	if got := snapshotNames(t, a, aliceToken); len(got) != 1 || got[0] != name {
		t.Errorf("alice's snapshots = %v, want [%s]", got, name)
	}
	if got := snapshotNames(t, a, bobToken); len(got) != 0 {
		t.Errorf("bob sees %v of alice's snapshots", got)
	}
	if code, b, _ := forkAcquire(a, "c-bob-fork", name, bobToken); code != http.StatusNotFound {
		t.Errorf("bob forks alice's snapshot: HTTP %d: %s, want 404", code, b)
	}
	if code, _, b := a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+name, nil, bobToken); code != http.StatusNotFound {
		t.Errorf("bob removes alice's snapshot: HTTP %d: %s, want 404", code, b)
	}

	code, b, fork := forkAcquire(a, "c-snap-fork", name, aliceToken)
	if code != http.StatusOK {
		t.Fatalf("fork: HTTP %d: %s", code, b)
	}
	fl := fork.GetLease()
	fid, ftok := fl.GetId(), fork.GetToken()
	if fl.GetImage() != snap.GetRef() || fl.GetUser() != src.GetLease().GetUser() ||
		!strings.Contains(fl.GetTransitions()[0].GetReason(), "fork of snapshot "+name) {
		t.Errorf("fork lease: image %q user %q (source %q) first reason %q", fl.GetImage(), fl.GetUser(), src.GetLease().GetUser(), fl.GetTransitions()[0].GetReason())
	}
	out, _ := pexec(t, a, fid, ftok, `cat /workspace/proj/notes.txt; id -un; echo fork-only > /workspace/proj/fork.txt`)
	if !strings.HasPrefix(out, "forked-notes\n") {
		t.Fatalf("fork: %q, want the snapshotted file", out)
	}
	if out, _ := pexec(t, a, sid, stok, `test -e /workspace/proj/fork.txt && echo leaked || echo separate`); out != "separate\n" {
		t.Errorf("the fork's write reached the source: %q", out)
	}

	code, _, b = a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+name, nil, aliceToken)
	if code != http.StatusBadRequest || !strings.Contains(string(b), "in use") {
		t.Errorf("remove a snapshot in use: HTTP %d: %s, want 400 (failed precondition)", code, b)
	}
	fcid := fl.GetContainerId()
	a.mustCall(t, http.MethodDelete, "/v1/leases/"+fid, nil, aliceToken)
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool { return gone(fcid) }) {
		t.Fatalf("the fork's container %s is still there after its release", fcid)
	}
	if code, _, b := a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+name, nil, aliceToken); code != http.StatusOK {
		t.Fatalf("remove the snapshot: HTTP %d: %s", code, b)
	}
	if got := snapshotNames(t, a, operatorToken); len(got) != 0 {
		t.Errorf("snapshots after removal: %v", got)
	}
	if code, _, b := a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+name, nil, aliceToken); code != http.StatusNotFound {
		t.Errorf("remove a removed snapshot: HTTP %d: %s, want 404", code, b)
	}
	if code, b, _ := forkAcquire(a, "c-snap-fork-2", name, aliceToken); code != http.StatusNotFound || !strings.Contains(string(b), "snapshot") {
		t.Errorf("fork of a removed snapshot: HTTP %d: %s, want 404 naming snapshot", code, b)
	}
}

// removeSnapshotImages removes, at the end of a test, the Docker images
// labelled with instance (snapshots the test left), after the instance's
// containers.
func removeSnapshotImages(tb testing.TB, instance string) {
	tb.Cleanup(func() {
		removeContainers(runtime.LabelInstance + "=" + instance)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := dockerCLI(ctx, "images", "-q", "--no-trunc", "--filter", "label="+runtime.LabelSnapshot, "--filter", "label="+runtime.LabelInstance+"="+instance)
		if err != nil {
			tb.Errorf("cleanup: docker images: %v: %s", err, out)
			return
		}
		for _, id := range strings.Fields(out) {
			tb.Errorf("cleanup: snapshot image %s of instance %s was left behind; removing it", id, instance)
			_, _ = dockerCLI(ctx, "rmi", "-f", id)
		}
	})
}

// TestSnapshotForkDocker runs on berth/minimal: a commit on fuse-overlayfs
// compares the whole filesystem, seconds for berth/base (TestConformanceBase
// and make bench cover that image).
func TestSnapshotForkDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, instance := newDataDir(t)
	removeSnapshotImages(t, instance)
	o := startOrch(t, dir, withSnapshotClients)
	snapshotFork(t, o.api, minimalImage, func(cid string) bool { return containerGone(t, cid) })
}

// removeCtrdSnapshots removes, at the end of a test, the containerd
// snapshots of env's instance the test left, after its sandboxes.
func removeCtrdSnapshots(tb testing.TB, env *ctrdEnv) {
	rt := ctrd.rt
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		left, err := rt.Snapshots(ctx, runtime.Selector{runtime.LabelInstance: env.instance})
		if err != nil {
			tb.Errorf("cleanup: list snapshots: %v", err)
		}
		if len(left) == 0 {
			return
		}
		boxes, _ := rt.List(ctx, runtime.Selector{runtime.LabelInstance: env.instance})
		for _, sb := range boxes {
			env.track(sb.ID)
			_ = rt.Remove(ctx, sb.ID)
		}
		for _, s := range left {
			tb.Errorf("cleanup: snapshot %s was left behind; removing it", s.Name)
			if err := rt.RemoveSnapshot(ctx, s.Tag); err != nil {
				tb.Errorf("cleanup: %v", err)
			}
		}
	})
}

func TestSnapshotForkContainerd(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	removeCtrdSnapshots(t, env)
	o := startCtrdOrch(t, env, withSnapshotClients)
	snapshotFork(t, o.api, minimalImage, func(cid string) bool {
		env.track(cid)
		gone, err := ctrdGone(context.Background(), o.rt, cid)
		return err == nil && gone
	})
}

// TestSnapshotBench measures (BERTH_BENCH=1, make bench) the time and
// size of a snapshot of a berth/base sandbox after writing 1 MiB and 100
// small files, on Docker and on containerd, and the fork's cold acquire.
func TestSnapshotBench(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for make bench (BERTH_BENCH=1)")
	}
	const write = `mkdir -p /workspace/b && head -c 1048576 /dev/urandom > /workspace/b/blob && for i in $(seq 100); do echo $i > /workspace/b/f$i; done`
	type backend struct {
		name  string
		a     *api
		image string
	}
	var backends []backend
	{
		requireImage(t, baseImage)
		dir, instance := newDataDir(t)
		removeSnapshotImages(t, instance)
		o := startOrch(t, dir)
		backends = append(backends, backend{"docker", o.api, baseImage})
	}
	requireCtrdImage(t, baseImage)
	{
		env := newCtrdEnv(t)
		removeCtrdSnapshots(t, env)
		o := startCtrdOrch(t, env)
		backends = append(backends, backend{"containerd", o.api, baseImage})
	}
	for _, be := range backends {
		r := be.a.mustAcquire(t, "c-snapbench", be.image, "600s")
		id, tok := r.GetLease().GetId(), r.GetToken()
		pexec(t, be.a, id, tok, write)
		const runs = 3
		var took, server []time.Duration
		var size int64
		for i := range runs {
			name := fmt.Sprintf("bench-%s-%s-%d", runID, randHex(3), i)
			t0 := time.Now()
			s := snapshotCall(t, be.a, id, name, operatorToken)
			took = append(took, time.Since(t0))
			server = append(server, s.GetDuration().AsDuration())
			size = s.GetSizeBytes()
			if i == runs-1 {
				t0 = time.Now()
				f, err := be.a.acquire("c-snapbench-fork", runtime.SnapshotRef(name), "600s")
				if err != nil {
					t.Fatal(err)
				}
				fork := time.Since(t0)
				fmt.Printf("SNAPSHOT-BENCH %-10s fork acquire (cold, from the snapshot): %.0f ms\n", be.name, ms(fork))
				be.a.mustRelease(t, f.GetLease().GetId())
				eventually(30*time.Second, 100*time.Millisecond, func() bool {
					code, _, _, _ := be.a.call(http.MethodDelete, "/v1/snapshots/"+name, nil)
					return code == http.StatusOK || code == http.StatusNotFound
				})
			} else if code, _, b := be.a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+name, nil); code != http.StatusOK {
				t.Fatalf("remove snapshot: HTTP %d: %s", code, b)
			}
		}
		fmt.Printf("SNAPSHOT-BENCH %-10s snapshot of a berth/base sandbox after writing 1 MiB + 100 files: p50 %.0f ms (server %.0f ms), max %.0f ms, size %d bytes (%d runs)\n",
			be.name, ms(percentile(took, 50)), ms(percentile(server, 50)), ms(percentile(took, 100)), size, runs)
		be.a.mustRelease(t, id)
	}
}

// TestSnapshotCLI drives `orchestrator lease snapshot`, `snapshot list|rm`
// and `lease acquire --snapshot` (the real binary) against a Docker
// orchestrator.
func TestSnapshotCLI(t *testing.T) {
	requireImage(t, minimalImage)
	dir, instance := newDataDir(t)
	removeSnapshotImages(t, instance)
	addr := freeAddr(t)
	startProc(t, dir, addr)

	leaseOf := func(out string) (id, image string) {
		t.Helper()
		var acq struct {
			Lease struct {
				ID    string `json:"id"`
				Image string `json:"image"`
			} `json:"lease"`
		}
		if err := json.Unmarshal([]byte(out), &acq); err != nil || acq.Lease.ID == "" {
			t.Fatalf("acquire -o json: %v\n%s", err, out)
		}
		return acq.Lease.ID, acq.Lease.Image
	}
	out, errs, code := cliRun(t, addr, "lease", "acquire", "--conversation", "cli-snap", "--image", minimalImage, "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: exit %d: %s", code, errs)
	}
	src, _ := leaseOf(out)
	name := "cli-" + runID + "-" + randHex(3)
	out, errs, code = cliRun(t, addr, "lease", "snapshot", src, "--name", name, "-o", "json")
	var snap struct {
		Name      string `json:"name"`
		Ref       string `json:"ref"`
		SizeBytes string `json:"sizeBytes"`
		Duration  string `json:"duration"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &snap) != nil || snap.Name != name || !strings.HasPrefix(snap.Ref, runtime.SnapshotRef(name)+"-") || snap.Duration == "" {
		t.Fatalf("lease snapshot -o json: exit %d %q %s", code, out, errs)
	}
	if _, errs, code := cliRun(t, addr, "lease", "snapshot", src, "--name", name); code != 1 || !strings.Contains(errs, "already exists") {
		t.Errorf("lease snapshot with a taken name: exit %d %q", code, errs)
	}
	if out, _, code := cliRun(t, addr, "snapshot", "list"); code != 0 || !strings.HasPrefix(out, "NAME") || !strings.Contains(out, name) {
		t.Errorf("snapshot list: exit %d\n%s", code, out)
	}
	out, errs, code = cliRun(t, addr, "lease", "acquire", "--conversation", "cli-snap-fork", "--snapshot", name, "-o", "json")
	if code != 0 {
		t.Fatalf("acquire --snapshot: exit %d: %s", code, errs)
	}
	fork, image := leaseOf(out)
	if image != snap.Ref {
		t.Errorf("fork image %q", image)
	}
	if _, errs, code := cliRun(t, addr, "snapshot", "rm", name); code != 1 || !strings.Contains(errs, "in use") {
		t.Errorf("snapshot rm of a snapshot in use: exit %d %q", code, errs)
	}
	if _, errs, code := cliRun(t, addr, "lease", "release", fork); code != 0 {
		t.Fatalf("release the fork: exit %d %s", code, errs)
	}
	var rmOut string
	if !eventually(30*time.Second, 200*time.Millisecond, func() bool {
		rmOut, _, code = cliRun(t, addr, "snapshot", "rm", name)
		return code == 0
	}) {
		t.Fatalf("snapshot rm after the fork's release: exit %d", code)
	}
	if rmOut != "removed "+name+"\n" {
		t.Errorf("snapshot rm: %q", rmOut)
	}
	if out, _, code := cliRun(t, addr, "snapshot", "list", "-o", "json"); code != 0 || strings.Contains(out, name) {
		t.Errorf("snapshot list -o json after rm: exit %d %s", code, out)
	}
	cliRun(t, addr, "lease", "release", src)
}
