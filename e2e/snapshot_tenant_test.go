package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// Client tokens of the tenant tests: two teams on one orchestrator.
const (
	teamAToken = "e2e-team-a-token-0123456789"
	teamBToken = "e2e-team-b-token-0123456789"
)

// Per-owner snapshot limits of the tenant tests: team-a's third snapshot
// is over the count, team-b's 8 MiB snapshot over the bytes.
const (
	tenantMaxSnapshots     = 2
	tenantMaxSnapshotBytes = 4 << 20
)

// withTenants adds the two teams' client tokens, allows every image (so
// that ids and digests reach the engine unless berth refuses them) and
// sets small per-owner snapshot limits.
func withTenants(c *orchestrator.Config) {
	c.Clients = append(c.Clients, orchestrator.Client{Owner: "team-a", Token: teamAToken}, orchestrator.Client{Owner: "team-b", Token: teamBToken})
	c.Admission.AllowedImages = []string{"*"}
	c.Snapshots.MaxPerOwner = tenantMaxSnapshots
	c.Snapshots.MaxBytesPerOwner = tenantMaxSnapshotBytes
}

// tenantAcquire acquires conversation conv with body's other fields and
// tok; it returns the HTTP status, the body and the answer on 200.
func tenantAcquire(tb testing.TB, a *api, conv string, body map[string]any, tok string) (int, []byte, *orchv1.AcquireResponse) {
	tb.Helper()
	req := map[string]any{"conversationId": conv, "ttl": "600s"}
	for k, v := range body {
		req[k] = v
	}
	code, _, b := a.mustCall(tb, http.MethodPost, "/v1/leases", req, tok)
	var r orchv1.AcquireResponse
	if code == http.StatusOK {
		if err := decode(b, &r); err != nil {
			tb.Fatal(err)
		}
	}
	return code, b, &r
}

// mustTenantLease acquires image as tok and writes content to
// /workspace/secret.txt; it returns the lease.
func mustTenantLease(tb testing.TB, a *api, conv, image, content, tok string) *orchv1.AcquireResponse {
	tb.Helper()
	code, b, r := tenantAcquire(tb, a, conv, map[string]any{"image": image}, tok)
	if code != http.StatusOK {
		tb.Fatalf("acquire %s: HTTP %d: %s", conv, code, b)
	}
	pexec(tb, a, r.GetLease().GetId(), r.GetToken(), "echo "+content+" > /workspace/secret.txt")
	return r
}

// snapshotTenants is the hostile-tenant scenario on one backend: team-a
// snapshots a lease holding a secret (as NAME and as "latest"); team-b
// asks for it by every spelling of its reference, its image id, id
// prefixes and digests, and is refused each time with a 4xx naming the
// field, never READY with the secret; team-b takes its own snapshot NAME
// (no 409: names are per owner) and each team forks its own; the operator
// sees both and must say which; the per-owner count and bytes limits answer
// 429 naming the limit.
func snapshotTenants(t *testing.T, a *api, image string) {
	secret := "team-a-secret-" + randHex(8)
	src := mustTenantLease(t, a, "c-a-src", image, secret, teamAToken)
	name := "e2e-" + runID + "-" + randHex(4)
	snap := snapshotCall(t, a, src.GetLease().GetId(), name, teamAToken)
	latest := snapshotCall(t, a, src.GetLease().GetId(), "latest", teamAToken)
	hexID := strings.TrimPrefix(snap.GetId(), "sha256:")
	t.Logf("team-a's snapshot %s: ref %s id %s (%d bytes); latest: %s", name, snap.GetRef(), snap.GetId(), snap.GetSizeBytes(), latest.GetRef())
	if len(hexID) != 64 {
		t.Fatalf("snapshot id %q", snap.GetId())
	}

	// team-b's attacks: each must be refused, naming the field.
	attacks := []struct{ field, value string }{
		{"image", "index.docker.io/berth/snapshot:" + name},
		{"image", "docker.io/berth/snapshot:" + name},
		{"image", "berth/snapshot:" + name},
		{"image", "berth/snapshot"},
		{"image", "docker.io/berth/snapshot"},
		{"image", "index.docker.io/berth/snapshot:latest"},
		{"image", snap.GetRef()},
		{"image", "docker.io/" + snap.GetRef()},
		{"image", "berth/snapshot@sha256:" + hexID},
		{"image", "docker.io/berth/snapshot@sha256:" + hexID},
		{"image", image + "@sha256:" + hexID},
		{"image", "sha256:" + hexID},
		{"image", hexID},
		{"image", hexID[:12]},
		{"image", hexID[:3]},
		{"image", "sha256:" + hexID[:8]},
		{"image", "library/" + hexID[:12]},
		{"image", "Berth/snapshot:" + name},
		{"snapshot", name},
		{"snapshot", "latest"},
		{"snapshot", "index.docker.io/berth/snapshot:" + name},
		{"snapshot", strings.TrimPrefix(snap.GetRef(), "berth/snapshot:")},
		{"snapshot", "berth/snapshot@sha256:" + hexID},
	}
	for i, at := range attacks {
		code, b, r := tenantAcquire(t, a, fmt.Sprintf("c-b-attack-%d", i), map[string]any{at.field: at.value}, teamBToken)
		if code == http.StatusOK {
			out, _ := pexec(t, a, r.GetLease().GetId(), r.GetToken(), "cat /workspace/secret.txt 2>/dev/null || echo no-secret")
			t.Errorf("team-b acquires %s %q: READY (image %s), secret file: %q", at.field, at.value, r.GetLease().GetImage(), out)
			a.mustCall(t, http.MethodDelete, "/v1/leases/"+r.GetLease().GetId(), nil, teamBToken)
			continue
		}
		if code < 400 || code >= 500 || !strings.Contains(string(b), at.field) || strings.Contains(string(b), secret) {
			t.Errorf("team-b acquires %s %q: HTTP %d: %s, want a 4xx naming %s", at.field, at.value, code, b, at.field)
		}
	}
	for _, path := range []string{"/v1/snapshots/" + name, "/v1/snapshots/latest"} {
		if code, _, b := a.mustCall(t, http.MethodDelete, path, nil, teamBToken); code != http.StatusNotFound {
			t.Errorf("team-b DELETE %s: HTTP %d: %s, want 404", path, code, b)
		}
	}

	// team-b's own snapshot of the same name: no 409, a snapshot of its own.
	bsrc := mustTenantLease(t, a, "c-b-src", image, "team-b-data", teamBToken)
	bsnap := snapshotCall(t, a, bsrc.GetLease().GetId(), name, teamBToken)
	if bsnap.GetOwner() != "team-b" || bsnap.GetRef() == snap.GetRef() || bsnap.GetId() == snap.GetId() {
		t.Errorf("team-b's snapshot %s = %v (team-a's %v)", name, bsnap, snap)
	}
	for _, tc := range []struct{ tok, want string }{{teamBToken, "team-b-data"}, {teamAToken, secret}} {
		code, b, r := tenantAcquire(t, a, "c-fork-"+randHex(4), map[string]any{"snapshot": name}, tc.tok)
		if code != http.StatusOK {
			t.Fatalf("fork of %s: HTTP %d: %s", name, code, b)
		}
		if out, _ := pexec(t, a, r.GetLease().GetId(), r.GetToken(), "cat /workspace/secret.txt"); out != tc.want+"\n" {
			t.Errorf("fork of %s: %q, want %q", name, out, tc.want)
		}
		a.mustCall(t, http.MethodDelete, "/v1/leases/"+r.GetLease().GetId(), nil, tc.tok)
	}
	if got := snapshotNames(t, a, teamBToken); len(got) != 1 || got[0] != name {
		t.Errorf("team-b's snapshots = %v, want [%s]", got, name)
	}
	if got := snapshotNames(t, a, operatorToken); len(got) != 3 {
		t.Errorf("the operator's snapshots = %v, want team-a's two and team-b's one", got)
	}
	if code, _, b := a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+name, nil, operatorToken); code != http.StatusBadRequest || !strings.Contains(string(b), "tag") {
		t.Errorf("operator DELETE of a name two owners use: HTTP %d: %s, want 400 asking for the tag", code, b)
	}

	// Limits: team-a has two snapshots, its third is over the count;
	// team-b's 8 MiB snapshot is over the bytes and not kept.
	code, _, b := a.mustCall(t, http.MethodPost, "/v1/leases/"+src.GetLease().GetId()+":snapshot", map[string]any{"name": name + "-3"}, teamAToken)
	if code != http.StatusTooManyRequests || !strings.Contains(string(b), "max_snapshots_per_owner") {
		t.Errorf("team-a's third snapshot: HTTP %d: %s, want 429 naming max_snapshots_per_owner", code, b)
	}
	pexec(t, a, bsrc.GetLease().GetId(), bsrc.GetToken(), "head -c 8388608 /dev/urandom > /workspace/big")
	code, _, b = a.mustCall(t, http.MethodPost, "/v1/leases/"+bsrc.GetLease().GetId()+":snapshot", map[string]any{"name": name + "-big"}, teamBToken)
	if code != http.StatusTooManyRequests || !strings.Contains(string(b), "max_snapshot_bytes_per_owner") {
		t.Errorf("team-b's 8 MiB snapshot: HTTP %d: %s, want 429 naming max_snapshot_bytes_per_owner", code, b)
	}
	if got := snapshotNames(t, a, teamBToken); len(got) != 1 {
		t.Errorf("team-b's snapshots after the refused one = %v", got)
	}

	// Each team removes its own (the forks are released).
	for _, tc := range []struct {
		tok   string
		names []string
	}{{teamAToken, []string{name, "latest"}}, {teamBToken, []string{name}}} {
		for _, n := range tc.names {
			if !eventually(time.Minute, 200*time.Millisecond, func() bool {
				code, _, _ := a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+n, nil, tc.tok)
				return code == http.StatusOK
			}) {
				t.Errorf("remove snapshot %s: never 200", n)
			}
		}
	}
	if got := snapshotNames(t, a, operatorToken); len(got) != 0 {
		t.Errorf("snapshots left: %v", got)
	}
}

// TestSnapshotTenantsDocker runs snapshotTenants on Docker.
func TestSnapshotTenantsDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, instance := newDataDir(t)
	removeSnapshotImages(t, instance)
	o := startOrch(t, dir, withTenants)
	snapshotTenants(t, o.api, minimalImage)
}

// TestSnapshotTenantsContainerd runs snapshotTenants on containerd.
func TestSnapshotTenantsContainerd(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	removeCtrdSnapshots(t, env)
	o := startCtrdOrch(t, env, withTenants)
	snapshotTenants(t, o.api, minimalImage)
}
