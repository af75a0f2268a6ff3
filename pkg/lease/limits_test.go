package lease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	bolt "go.etcd.io/bbolt"
)

func TestAcquireMaxResources(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Admission.MaxResources = runtime.Resources{NanoCPUs: 4e9, MemoryBytes: 8 << 30, PidsLimit: 4096, DiskBytes: 100 << 30}
	})
	ctx := context.Background()
	for _, c := range []struct {
		res   runtime.Resources
		field string
		msg   string
	}{
		{runtime.Resources{NanoCPUs: 4096e9}, "resources.cpus", "resources.cpus: 4096 exceeds the maximum 4"},
		{runtime.Resources{MemoryBytes: 1 << 50}, "resources.memory_bytes", "exceeds the maximum 8589934592"},
		{runtime.Resources{PidsLimit: 9e18}, "resources.pids", "exceeds the maximum 4096"},
		{runtime.Resources{DiskBytes: 1 << 40}, "resources.disk_bytes", "exceeds the maximum 107374182400"},
	} {
		_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "big", Resources: c.res})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: err = %v, want InvalidArgument %q", c.res, err, c.msg)
		}
	}
	if n := h.rt.creates(); n != 0 {
		t.Fatalf("%d sandboxes created for refused requests", n)
	}
	if recs := storedIDs(t, h); len(recs) != 0 {
		t.Fatalf("refused requests left records: %v", recs)
	}
	// At the maximum is fine.
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "max",
		Resources: runtime.Resources{NanoCPUs: 4e9, MemoryBytes: 8 << 30, PidsLimit: 4096, DiskBytes: 100 << 30}}); err != nil {
		t.Fatal(err)
	}
}

func TestAcquireEnvLabelsPortsBounds(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Admission.MaxEnvBytes = 1000
		c.Admission.MaxLabels = 2
		c.Admission.MaxPublicPorts = 1
	})
	ctx := context.Background()
	// 998 bytes of KEY=VALUE plus separators: exactly 1000.
	ok := map[string]string{"A": strings.Repeat("x", 500), "B": strings.Repeat("y", 494)}
	if n := envBytes(ok); n != 1000 {
		t.Fatalf("envBytes = %d", n)
	}
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "env-ok", Env: ok}); err != nil {
		t.Fatal(err)
	}
	ok["C"] = ""
	for name, req := range map[string]AcquireRequest{
		"env":          {ConversationID: "env-big", Env: ok},
		"labels":       {ConversationID: "labels", Labels: map[string]string{"a": "1", "b": "2", "c": "3"}},
		"public_ports": {ConversationID: "ports", PublicPorts: []int{8000, 8001}},
	} {
		_, _, _, err := h.m.Acquire(ctx, req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), name+":") {
			t.Errorf("%s: err = %v, want InvalidArgument naming it", name, err)
		}
	}
	// The default bound is 64 KiB in total, whatever the number of variables.
	h2 := newHarness(t, nil)
	env := map[string]string{}
	for i := range 3 {
		env[fmt.Sprintf("V%d", i)] = strings.Repeat("v", 30<<10) // each under the per-value bound
	}
	_, _, _, err := h2.m.Acquire(ctx, AcquireRequest{ConversationID: "env-default", Env: env})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "at most 65536") {
		t.Fatalf("96 KiB of env: %v", err)
	}
}

func TestImageAllowlist(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.DefaultImage = "registry.local/default:1"
		c.Admission.AllowedImages = []string{"berth/", "debian", "docker.io/library/alpine"}
	})
	ctx := context.Background()
	for _, img := range []string{"berth/base", "berth/base:latest", "docker.io/berth/minimal", "berth/x/y@sha256:" + strings.Repeat("a", 64),
		"debian", "debian:12", "library/debian:bookworm", "registry.local/default:1"} {
		if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "ok-" + img, Image: img}); err != nil {
			t.Errorf("%s: %v", img, err)
		}
	}
	for _, img := range []string{"berthevil/x", "debianx", "debian-evil:1", "evil.example/berth/base", "alpine", "ubuntu",
		"registry.local/default:2"} {
		_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "no-" + img, Image: img})
		if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "image:") || !strings.Contains(err.Error(), img) {
			t.Errorf("%s: err = %v, want PermissionDenied naming image", img, err)
		}
	}
	for _, img := range []string{"Invalid/UPPER:tag", "berth/base:", "a//b", "berth/base@sha256:short", strings.Repeat("a", 600)} {
		_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "bad", Image: img})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "image:") {
			t.Errorf("%.40s: err = %v, want InvalidArgument naming image", img, err)
		}
	}
	for _, id := range storedIDs(t, h) {
		if l := h.get(id); !strings.HasPrefix(l.ConversationID, "ok-") {
			t.Errorf("a refused image left a record: %+v", l)
		}
	}
	// "*" allows every image.
	all := newHarness(t, func(c *Config) { c.Admission.AllowedImages = []string{"*"} })
	if _, _, _, err := all.m.Acquire(ctx, AcquireRequest{ConversationID: "any", Image: "ubuntu:24.04"}); err != nil {
		t.Fatal(err)
	}
}

func TestPerOwnerLiveLimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission.MaxLivePerOwner = 2 })
	ctx := context.Background()
	acq := func(owner, conv string, noLimit bool) (Lease, error) {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: conv, Owner: owner, NoOwnerLimit: noLimit})
		return l, err
	}
	a1, err := acq("alice", "1", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acq("alice", "2", false); err != nil {
		t.Fatal(err)
	}
	_, err = acq("alice", "3", false)
	after, hinted := RetryAfter(err)
	if !errdefs.IsResourceExhausted(err) || !hinted || after < time.Second || !strings.Contains(err.Error(), `owner "alice" has 2 live leases`) {
		t.Fatalf("third lease of alice: %v (hint %v)", err, after)
	}
	// A retry of a live conversation is not a new lease: allowed.
	if l, err := acq("alice", "1", false); err != nil || l.ID != a1.ID {
		t.Fatalf("re-acquire: %v", err)
	}
	// Other owners are not affected; the operator's acquires are exempt.
	if _, err := acq("bob", "1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := acq("alice", "op", true); err != nil {
		t.Fatalf("NoOwnerLimit: %v", err)
	}
	// Releasing frees a slot (the exempt lease still counts: 2 live remain).
	if _, err := h.m.Release(ctx, a1.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := acq("alice", "3", false); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("alice still has 2 live: %v", err)
	}
	if l, err := acq("alice", "op", false); err != nil {
		t.Fatal(err)
	} else if _, err := h.m.Release(ctx, l.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := acq("alice", "3", false); err != nil {
		t.Fatalf("after two releases: %v", err)
	}
	// The count survives a restart (it is rebuilt from the store).
	h.restart()
	if _, err := acq("alice", "4", false); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("after restart: %v", err)
	}
}

func TestEndedLeaseDropsEnv(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c", Env: map[string]string{"SECRET": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := h.store.Get(l.ID); st.Env["SECRET"] != "v" {
		t.Fatalf("live lease lost its env: %+v", st.Env)
	}
	if _, err := h.m.Release(ctx, l.ID, ""); err != nil {
		t.Fatal(err)
	}
	// Release answers while the sandbox is still being removed (RELEASING);
	// the record loses its env once the lease has ended.
	eventually(t, 30*time.Second, "the released lease ended", func() bool { return h.get(l.ID).State.Ended() })
	if st, _ := h.store.Get(l.ID); st.Env != nil || h.get(l.ID).Env != nil {
		t.Fatalf("ended lease keeps env: %+v", st.Env)
	}
	// A failed creation too.
	h.rt.set(func(f *fakeRuntime) { f.createErr = errdefs.NotFound("image gone") })
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "f", Env: map[string]string{"BIG": strings.Repeat("x", 30000)}}); err == nil {
		t.Fatal("want the create error")
	}
	ls, _, _ := h.m.List(ctx, Filter{ConversationID: "f", IncludeEnded: true})
	if len(ls) != 1 || ls[0].State != StateFailed || ls[0].Env != nil {
		t.Fatalf("failed lease: %+v", ls)
	}
	if st, _ := h.store.Get(ls[0].ID); st.Env != nil {
		t.Fatalf("failed lease's record keeps env")
	}
}

// A store written before this change (conversations indexed by id alone,
// env kept on ended records) opens: its records load, ended ones lose env
// (in memory and on disk), and its live leases are indexed by owner.
func TestOldStoreOpens(t *testing.T) {
	h := newHarness(t, nil)
	live, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "shared", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	h.stop()
	// An ended record exactly as the previous version wrote it.
	old := `{"id":"06h0000000000000000000000a","conversation_id":"shared","owner":"bob","image":"berth/base",` +
		`"env":{"TOKEN":"old-secret"},"resources":{"NanoCPUs":0,"MemoryBytes":0,"PidsLimit":0},"state":"FAILED",` +
		`"reason":"create sandbox: boom","created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:01Z",` +
		`"expires_at":"2026-01-01T00:10:00Z","last_activity_at":"2026-01-01T00:00:00Z","ttl":600000000000,` +
		`"transitions":[{"from":"","to":"PENDING","reason":"acquired","at":"2026-01-01T00:00:00Z"},` +
		`{"from":"PENDING","to":"FAILED","reason":"create sandbox: boom","at":"2026-01-01T00:00:01Z"}],` +
		`"ended_at":"2026-01-01T00:00:01Z","cleaned":true}`
	db, err := bolt.Open(h.path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("leases")).Put([]byte("06h0000000000000000000000a"), []byte(old))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	h.cfg.Retention = -1 // keep the 2026-01-01 record
	h.start()
	ended := h.get("06h0000000000000000000000a")
	if ended.State != StateFailed || ended.Env != nil || ended.Owner != "bob" {
		t.Fatalf("old record: %+v", ended)
	}
	if st, err := h.store.Get(ended.ID); err != nil || st.Env != nil {
		t.Fatalf("old record on disk still has env: %+v %v", st.Env, err)
	}
	// alice's live lease is found again; bob's "shared" is a new lease.
	l, _, created, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "shared", Owner: "alice"})
	if err != nil || created || l.ID != live.ID {
		t.Fatalf("alice after restart: %v created=%v", err, created)
	}
	b, _, created, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "shared", Owner: "bob"})
	if err != nil || !created || b.ID == live.ID {
		t.Fatalf("bob after restart: %v created=%v", err, created)
	}
}

func TestEndedRecordsPerOwnerBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission.MaxEndedPerOwner = 3 })
	ctx := context.Background()
	var alice []string
	for i := range 6 {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: fmt.Sprint("a", i), Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.m.Release(ctx, l.ID, ""); err != nil {
			t.Fatal(err)
		}
		alice = append(alice, l.ID)
		time.Sleep(2 * time.Millisecond) // distinct EndedAt
	}
	for i := range 2 {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: fmt.Sprint("b", i), Owner: "bob"})
		if err != nil {
			t.Fatal(err)
		}
		h.m.Release(ctx, l.ID, "")
	}
	live, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "live", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	count := func(owner string) int {
		ls, _, _ := h.m.List(ctx, Filter{Owner: owner, IncludeEnded: true, States: []State{StateReleased}})
		return len(ls)
	}
	eventually(t, 5*time.Second, "alice's oldest ended records purged", func() bool { return count("alice") == 3 })
	if count("bob") != 2 {
		t.Fatalf("bob has %d ended records, want 2", count("bob"))
	}
	for i, id := range alice {
		_, err := h.m.Get(ctx, id)
		if kept := i >= 3; kept != (err == nil) {
			t.Errorf("alice's lease %d: kept=%v err=%v (want the newest 3 kept)", i, kept, err)
		}
		if _, serr := h.store.Get(id); (serr == nil) != (i >= 3) {
			t.Errorf("alice's lease %d on disk: %v", i, serr)
		}
	}
	if h.get(live.ID).State != StateReady {
		t.Fatal("the live lease was touched")
	}
}

func TestReleaseReasonSanitized(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	got, err := h.m.Release(context.Background(), l.ID, "bye \x1b[31mred\x1b[0m\u202e\nnext "+strings.Repeat("é", 1000))
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(got.Reason, "\x1b\n\u202e") || len(got.Reason) > MaxReasonLen || !strings.HasPrefix(got.Reason, "bye [31mred[0m next éé") {
		t.Fatalf("reason %q (%d bytes)", got.Reason, len(got.Reason))
	}
	if !strings.HasSuffix(got.Reason, "é") { // cut on a rune boundary
		t.Fatalf("reason cut inside a rune: %q", got.Reason[len(got.Reason)-4:])
	}
	l2, _ := h.acquire("d")
	ids, err := h.m.Reap(context.Background(), ReapFilter{IDs: []string{l2.ID}, Reason: "\x07\x07"})
	if err != nil || len(ids) != 1 || h.get(l2.ID).Reason != "reaped by operator" {
		t.Fatalf("reap with a reason of only control characters: %v %q", err, h.get(l2.ID).Reason)
	}
}

// storedIDs lists the record ids in the harness's store.
func storedIDs(t *testing.T, h *harness) []string {
	t.Helper()
	var ids []string
	if err := h.store.ForEach(func(l Lease) error {
		ids = append(ids, l.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestAcquireWorkDir checks AcquireRequest.WorkDir: refused unless an
// absolute path without control characters, else kept in the lease and
// given to the runtime.
func TestAcquireWorkDir(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	for _, d := range []string{"rel/dir", "/a\x01b", "/" + strings.Repeat("d", MaxWorkDirLen)} {
		_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "wd-bad", WorkDir: d})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "working_dir") {
			t.Errorf("WorkDir %.20q: err = %v, want InvalidArgument naming working_dir", d, err)
		}
	}
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "wd", WorkDir: "/srv/project"})
	if err != nil {
		t.Fatal(err)
	}
	if l.WorkDir != "/srv/project" {
		t.Errorf("lease WorkDir = %q", l.WorkDir)
	}
	h.rt.mu.Lock()
	defer h.rt.mu.Unlock()
	if n := len(h.rt.specs); n == 0 || h.rt.specs[n-1].WorkDir != "/srv/project" {
		t.Errorf("the runtime's specs %+v do not carry the work dir", h.rt.specs)
	}
}

// TestAdmissionConfigDefaults checks AdmissionConfig's defaults and the
// fields its errors name.
func TestAdmissionConfigDefaults(t *testing.T) {
	got, err := AdmissionConfig{}.withDefaults()
	want := AdmissionConfig{MaxLive: 100, MaxEnvBytes: 64 << 10, MaxLabels: 64, MaxPublicPorts: 16, DefaultUserImages: []string{"berth/"}}
	if err != nil || !reflect.DeepEqual(got, DefaultAdmissionConfig()) || !reflect.DeepEqual(got, want) {
		t.Fatalf("zero config = %+v, %v; want the defaults %+v", got, err, want)
	}
	got, _ = AdmissionConfig{MaxLive: -1, MaxLabels: -3, MaxLivePerOwner: 2}.withDefaults()
	if got.MaxLive != -1 || got.MaxLabels != 64 || got.MaxLivePerOwner != 2 || got.MaxEnvBytes != 64<<10 {
		t.Fatalf("partial config = %+v", got)
	}
	for field, c := range map[string]AdmissionConfig{
		"max_resources":     {MaxResources: runtime.Resources{MemoryBytes: -1}},
		"default_resources": {DefaultResources: runtime.Resources{PidsLimit: -1}},
	} {
		if _, err := c.withDefaults(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%+v: err = %v, want an invalid argument naming %s", c, err, field)
		}
	}
	for field, c := range map[string]AdmissionConfig{
		"max_env_bytes":    {MaxLabels: 1, MaxPublicPorts: 1},
		"max_labels":       {MaxEnvBytes: 1, MaxPublicPorts: 1},
		"max_public_ports": {MaxEnvBytes: 1, MaxLabels: 1},
	} {
		if err := c.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%+v: err = %v, want an invalid argument naming %s", c, err, field)
		}
	}
}

// TestNetworkConfigDefaults checks NetworkConfig's default mode and that
// Validate refuses a bad default policy and one above the ceiling.
func TestNetworkConfigDefaults(t *testing.T) {
	got, err := NetworkConfig{}.withDefaults()
	if err != nil || got.Default.Mode != NetworkOpen || got.Default.Mode != DefaultNetworkConfig().Default.Mode || got.Egress != nil || got.Ceiling.Bounded() {
		t.Fatalf("zero config = %+v, %v", got, err)
	}
	if _, err := (NetworkConfig{Default: NetworkPolicy{Mode: "wide"}}).withDefaults(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network.mode") {
		t.Errorf("bad default mode: %v", err)
	}
	c := NetworkConfig{Default: NetworkPolicy{Mode: NetworkOpen}, Ceiling: NetworkCeiling{MaxMode: egress.ModeRestricted}}
	if err := c.Validate(); !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "above the ceiling") {
		t.Errorf("default above the ceiling: %v", err)
	}
}
