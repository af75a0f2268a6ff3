package lease

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// snapRuntime is the fake runtime plus a runtime.Snapshotter that keeps
// snapshots in a map.
type snapRuntime struct {
	*fakeRuntime
	smu   sync.Mutex
	snaps map[string]runtime.SnapshotImage // by tag
	of    map[string]string                // snapshot tag → container id it was taken of
	size  int64                            // of each snapshot (default 42)
}

func newSnapRuntime() *snapRuntime {
	return &snapRuntime{fakeRuntime: newFakeRuntime(), snaps: map[string]runtime.SnapshotImage{}, of: map[string]string{}}
}

func (s *snapRuntime) Snapshot(_ context.Context, id string, opts runtime.SnapshotOptions) (runtime.SnapshotImage, error) {
	if err := runtime.ValidSnapshotOptions(opts); err != nil {
		return runtime.SnapshotImage{}, err
	}
	s.smu.Lock()
	defer s.smu.Unlock()
	tag := opts.Tagged()
	if _, ok := s.snaps[tag]; ok {
		return runtime.SnapshotImage{}, errdefs.AlreadyExists("snapshot %s", tag)
	}
	size := s.size
	if size == 0 {
		size = 42
	}
	img := runtime.SnapshotImage{Name: opts.Name, Tag: tag, Ref: runtime.SnapshotRef(tag), ID: fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(tag))),
		Size: size, CreatedAt: time.Now(), Labels: runtime.SnapshotLabels(opts, "")}
	s.snaps[tag], s.of[tag] = img, id
	return img, nil
}

func (s *snapRuntime) Snapshots(_ context.Context, sel runtime.Selector) ([]runtime.SnapshotImage, error) {
	s.smu.Lock()
	defer s.smu.Unlock()
	var out []runtime.SnapshotImage
	for _, img := range s.snaps {
		if sel.Matches(img.Labels) {
			out = append(out, img)
		}
	}
	return out, nil
}

func (s *snapRuntime) RemoveSnapshot(_ context.Context, tag string) error {
	s.smu.Lock()
	defer s.smu.Unlock()
	if _, ok := s.snaps[tag]; !ok {
		return errdefs.NotFound("snapshot %s", tag)
	}
	delete(s.snaps, tag)
	return nil
}

// startSnapManager starts a Manager over rt (a bbolt file in a temp dir).
func startSnapManager(t *testing.T, rt Runtime, tweak func(*Config)) *Manager {
	t.Helper()
	st, err := OpenBolt(filepath.Join(t.TempDir(), DBFileName))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{InstanceID: "test", Secret: testSecret, Store: st, Runtime: rt}
	if tweak != nil {
		tweak(&cfg)
	}
	m, cancel := startManager(t, cfg)
	t.Cleanup(func() {
		cancel()
		_ = m.Close()
		_ = st.Close()
	})
	return m
}

func TestSnapshotAndFork(t *testing.T) {
	rt := newSnapRuntime()
	m := startSnapManager(t, rt, func(c *Config) { c.Admission.AllowedImages = []string{"berth/"}; c.DefaultImage = "berth/base" })
	ctx := context.Background()
	src, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-1", Owner: "alice", Image: "berth/base", User: "1000:1000"})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := m.Snapshots().Take(ctx, src.ID, "Bad Name"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad name: %v, want InvalidArgument", err)
	}
	if _, err := m.Snapshots().Take(ctx, "no-such-lease", "x"); !errdefs.IsNotFound(err) {
		t.Errorf("unknown lease: %v, want NotFound", err)
	}
	auto, err := m.Snapshots().Take(ctx, src.ID, "")
	if err != nil || !strings.HasPrefix(auto.Name, src.ID+"-") {
		t.Fatalf("Snapshot without a name: %+v %v", auto, err)
	}
	s, err := m.Snapshots().Take(ctx, src.ID, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Owner != "alice" || s.LeaseID != src.ID || s.ConversationID != "c-1" || s.Image != "berth/base" || s.User != "1000:1000" || s.Ref != runtime.SnapshotRef(runtime.SnapshotTag("test", "alice", "s1")) {
		t.Errorf("snapshot = %+v", s)
	}
	if rt.of[s.Tag] != src.ContainerID {
		t.Errorf("snapshot of container %q, want %q", rt.of[s.Tag], src.ContainerID)
	}
	if _, err := m.Snapshots().Take(ctx, src.ID, "s1"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("taken name: %v", err)
	}
	if got, _ := m.Get(ctx, src.ID); got.State != StateReady {
		t.Errorf("source after its snapshot: %s", got.State)
	}

	if list, err := m.Snapshots().List(ctx, SnapshotFilter{Owner: "alice"}); err != nil || len(list) != 2 {
		t.Errorf("alice's snapshots: %v %v", list, err)
	}
	if list, _ := m.Snapshots().List(ctx, SnapshotFilter{Owner: "bob"}); len(list) != 0 {
		t.Errorf("bob sees %v", list)
	}
	if list, _ := m.Snapshots().List(ctx, SnapshotFilter{AnyOwner: true, LeaseID: src.ID}); len(list) != 2 {
		t.Errorf("every owner's snapshots of the lease: %v", list)
	}

	// Forks: only the owner (or AnySnapshot); image and snapshot not both.
	if _, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-bob", Owner: "bob", Snapshot: "s1"}); !errdefs.IsNotFound(err) {
		t.Errorf("bob forks alice's snapshot: %v, want NotFound", err)
	}
	if _, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-x", Owner: "alice", Snapshot: "s1", Image: "berth/minimal"}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "snapshot") {
		t.Errorf("snapshot and image: %v, want InvalidArgument naming snapshot", err)
	}
	fork, _, created, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-2", Owner: "alice", Snapshot: "s1"})
	if err != nil || !created {
		t.Fatalf("fork: %v", err)
	}
	if fork.Image != s.Ref || fork.User != "1000:1000" || !strings.Contains(fork.Transitions[0].Reason, "fork of snapshot s1") {
		t.Errorf("fork = image %q user %q first reason %q", fork.Image, fork.User, fork.Transitions[0].Reason)
	}
	// image=berth/snapshot:NAME is the same request (allowed although
	// berth/snapshot is a berth/ image anyway); AnySnapshot lets bob fork.
	if _, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-3", Owner: "bob", Image: "berth/snapshot:s1", AnySnapshot: true}); err != nil {
		t.Errorf("operator fork by image reference: %v", err)
	}
	if _, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-4", Owner: "alice", Snapshot: "gone"}); !errdefs.IsNotFound(err) {
		t.Errorf("fork of a missing snapshot: %v", err)
	}

	if err := m.Snapshots().Remove(ctx, "s1", "bob", false); !errdefs.IsNotFound(err) {
		t.Errorf("bob removes alice's snapshot: %v", err)
	}
	if err := m.Snapshots().Remove(ctx, "s1", "alice", false); err != nil {
		t.Errorf("alice removes her snapshot: %v", err)
	}
	if _, err := m.Snapshots().Get(ctx, "s1", "", true); !errdefs.IsNotFound(err) {
		t.Errorf("removed snapshot: %v", err)
	}
}

func TestSnapshotOtherImagesAllowedAndRuntimeWithout(t *testing.T) {
	rt := newSnapRuntime()
	// Only python is allowed besides the default: a fork of a python
	// lease runs although berth/snapshot is not in the list, and its
	// user defaults follow python (the image's own user), not berth's.
	m := startSnapManager(t, rt, func(c *Config) { c.Admission.AllowedImages = []string{"python"}; c.Admission.DefaultUser = "sandbox" })
	ctx := context.Background()
	src, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-1", Owner: "o", Image: "python:3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshots().Take(ctx, src.ID, "py"); err != nil {
		t.Fatal(err)
	}
	fork, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-2", Owner: "o", Snapshot: "py"})
	if err != nil {
		t.Fatalf("fork of an allowed image's snapshot: %v", err)
	}
	if fork.User != src.User {
		t.Errorf("fork user %q, want the source's %q", fork.User, src.User)
	}

	plain := startSnapManager(t, newFakeRuntime(), nil)
	l, _, _, err := plain.Acquire(ctx, AcquireRequest{ConversationID: "c-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Snapshots().Take(ctx, l.ID, "x"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Snapshot on a runtime without Snapshotter: %v, want FailedPrecondition", err)
	}
	if _, _, _, err := plain.Acquire(ctx, AcquireRequest{ConversationID: "c-2", Snapshot: "x"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("fork on a runtime without Snapshotter: %v, want FailedPrecondition", err)
	}
}

// TestForkSpellings: bob asks for alice's snapshot by every spelling of its
// reference and never forks it (NotFound like a missing one, or
// InvalidArgument naming the field for ids and digests); alice forks hers
// by every spelling of the snapshot repository.
func TestForkSpellings(t *testing.T) {
	rt := newSnapRuntime()
	m := startSnapManager(t, rt, func(c *Config) { c.Admission.AllowedImages = []string{AllowAllImages} })
	ctx := context.Background()
	src, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-src", Owner: "alice", Image: "berth/base"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Snapshots().Take(ctx, src.ID, "base")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshots().Take(ctx, src.ID, "latest"); err != nil {
		t.Fatal(err)
	}
	hexID := strings.TrimPrefix(s.ID, "sha256:")
	for i, tc := range []struct {
		image, snapshot string
		want            func(error) bool
		field           string
	}{
		{image: "berth/snapshot:base", want: errdefs.IsNotFound, field: "image"},
		{image: "docker.io/berth/snapshot:base", want: errdefs.IsNotFound, field: "image"},
		{image: "index.docker.io/berth/snapshot:base", want: errdefs.IsNotFound, field: "image"},
		{image: "berth/snapshot", want: errdefs.IsNotFound, field: "image"},
		{image: s.Ref, want: errdefs.IsNotFound, field: "image"},
		{image: "docker.io/" + s.Ref, want: errdefs.IsNotFound, field: "image"},
		{snapshot: "base", want: errdefs.IsNotFound, field: "snapshot"},
		{snapshot: s.Tag, want: errdefs.IsNotFound, field: "snapshot"},
		{snapshot: "index.docker.io/berth/snapshot:base", want: errdefs.IsNotFound, field: "snapshot"},
		{image: "berth/snapshot@sha256:" + hexID, want: errdefs.IsInvalidArgument, field: "image"},
		{image: s.ID, want: errdefs.IsInvalidArgument, field: "image"},
		{image: hexID, want: errdefs.IsInvalidArgument, field: "image"},
		{image: hexID[:12], want: errdefs.IsInvalidArgument, field: "image"},
		{image: "sha256:" + hexID[:6], want: errdefs.IsInvalidArgument, field: "image"},
		{snapshot: "berth/snapshot@sha256:" + hexID, want: errdefs.IsInvalidArgument, field: "snapshot"},
	} {
		l, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: fmt.Sprintf("c-bob-%d", i), Owner: "bob", Image: tc.image, Snapshot: tc.snapshot})
		if err == nil {
			t.Errorf("bob acquires image %q snapshot %q: forked %s", tc.image, tc.snapshot, l.Image)
			continue
		}
		if !tc.want(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("bob acquires image %q snapshot %q: %v, want the category naming %s", tc.image, tc.snapshot, err, tc.field)
		}
	}
	for i, image := range []string{"berth/snapshot:base", "docker.io/berth/snapshot:base", "index.docker.io/berth/snapshot:base", "berth/snapshot"} {
		l, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: fmt.Sprintf("c-alice-%d", i), Owner: "alice", Image: image})
		if err != nil || !strings.HasPrefix(l.Image, "berth/snapshot:") {
			t.Errorf("alice forks %q: %s %v", image, l.Image, err)
		}
	}
	if len(rt.snaps) != 2 {
		t.Errorf("snapshots: %v", rt.snaps)
	}
}

// TestSnapshotNamesPerOwner: alice and bob each have a snapshot named base;
// bob's name does not collide with (nor reveal) alice's; each forks and
// removes their own; the operator lists both and must say whose.
func TestSnapshotNamesPerOwner(t *testing.T) {
	rt := newSnapRuntime()
	m := startSnapManager(t, rt, nil)
	ctx := context.Background()
	var srcs = map[string]Lease{}
	for _, owner := range []string{"alice", "bob"} {
		l, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		srcs[owner] = l
		if _, err := m.Snapshots().Take(ctx, l.ID, "base"); err != nil {
			t.Fatalf("%s's snapshot base: %v", owner, err)
		}
	}
	a, err := m.Snapshots().Get(ctx, "base", "alice", false)
	if err != nil || a.Owner != "alice" || a.LeaseID != srcs["alice"].ID {
		t.Fatalf("alice's base: %+v %v", a, err)
	}
	b, err := m.Snapshots().Get(ctx, "base", "bob", false)
	if err != nil || b.Owner != "bob" || b.LeaseID != srcs["bob"].ID || b.Tag == a.Tag {
		t.Fatalf("bob's base: %+v %v (alice's tag %s)", b, err, a.Tag)
	}
	if _, err := m.Snapshots().Get(ctx, "base", "carol", false); !errdefs.IsNotFound(err) {
		t.Errorf("carol's base: %v, want NotFound", err)
	}
	fork, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-fork", Owner: "bob", Snapshot: "base"})
	if err != nil || fork.Image != b.Ref || rt.of[b.Tag] != srcs["bob"].ContainerID {
		t.Errorf("bob's fork of base: %s %v, want %s", fork.Image, err, b.Ref)
	}
	// The operator: every owner's; a shared name needs the owner or the tag.
	if list, _ := m.Snapshots().List(ctx, SnapshotFilter{AnyOwner: true}); len(list) != 2 {
		t.Errorf("operator lists %v", list)
	}
	if _, err := m.Snapshots().Get(ctx, "base", "", true); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), a.Tag) {
		t.Errorf("operator gets the shared name: %v, want InvalidArgument listing the tags", err)
	}
	if got, err := m.Snapshots().Get(ctx, "base", "bob", true); err != nil || got.Tag != b.Tag {
		t.Errorf("operator gets bob's base: %+v %v", got, err)
	}
	if err := m.Snapshots().Remove(ctx, a.Tag, "", true); err != nil {
		t.Errorf("operator removes alice's base by its tag: %v", err)
	}
	if _, err := m.Snapshots().Get(ctx, "base", "alice", false); !errdefs.IsNotFound(err) {
		t.Errorf("alice's base after its removal: %v", err)
	}
	if _, err := m.Snapshots().Get(ctx, "base", "bob", false); err != nil {
		t.Errorf("bob's base after alice's removal: %v", err)
	}
}

// TestSnapshotLimits: an owner's snapshots beyond Snapshots.MaxPerOwner, or
// adding more than Snapshots.MaxBytesPerOwner bytes, are RESOURCE_EXHAUSTED
// naming the limit; other owners are not affected; one over the bytes
// limit is not kept.
func TestSnapshotLimits(t *testing.T) {
	rt := newSnapRuntime()
	m := startSnapManager(t, rt, func(c *Config) { c.Snapshots.MaxPerOwner = 2 })
	ctx := context.Background()
	l, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"s1", "s2"} {
		if _, err := m.Snapshots().Take(ctx, l.ID, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Snapshots().Take(ctx, l.ID, "s3"); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "max_snapshots_per_owner") {
		t.Errorf("third snapshot: %v, want ResourceExhausted naming max_snapshots_per_owner", err)
	}
	bl, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshots().Take(ctx, bl.ID, "s1"); err != nil {
		t.Errorf("bob's first snapshot: %v", err)
	}

	rt2 := newSnapRuntime()
	rt2.size = 40
	m2 := startSnapManager(t, rt2, func(c *Config) { c.Snapshots.MaxBytesPerOwner = 100 })
	l2, _, _, err := m2.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"s1", "s2"} {
		if _, err := m2.Snapshots().Take(ctx, l2.ID, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m2.Snapshots().Take(ctx, l2.ID, "s3"); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "max_snapshot_bytes_per_owner") {
		t.Errorf("snapshot over the bytes limit: %v, want ResourceExhausted naming max_snapshot_bytes_per_owner", err)
	}
	if list, _ := m2.Snapshots().List(ctx, SnapshotFilter{Owner: "alice"}); len(list) != 2 {
		t.Errorf("alice's snapshots after the refused one: %v", list)
	}
}

// TestSnapshotOldTag: a snapshot an older version stored under its bare
// name is found by its labels: its owner forks and removes it, another
// owner does not see it, and the owner cannot take the name again.
func TestSnapshotOldTag(t *testing.T) {
	rt := newSnapRuntime()
	m := startSnapManager(t, rt, nil)
	ctx := context.Background()
	l, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	old, err := rt.Snapshot(ctx, l.ContainerID, runtime.SnapshotOptions{Name: "old", Labels: map[string]string{
		runtime.LabelSnapshotOwner: "alice", runtime.LabelInstance: "test"}})
	if err != nil || old.Ref != "berth/snapshot:old" {
		t.Fatalf("old-style snapshot: %+v %v", old, err)
	}
	if _, err := m.Snapshots().Take(ctx, l.ID, "old"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("alice takes the name of her old snapshot: %v, want AlreadyExists", err)
	}
	if _, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-bob", Owner: "bob", Image: "berth/snapshot:old"}); !errdefs.IsNotFound(err) {
		t.Errorf("bob forks alice's old snapshot: %v, want NotFound", err)
	}
	if f, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-fork", Owner: "alice", Snapshot: "old"}); err != nil || f.Image != old.Ref {
		t.Errorf("alice forks her old snapshot: %s %v", f.Image, err)
	}
	if err := m.Snapshots().Remove(ctx, "old", "alice", false); err != nil {
		t.Errorf("alice removes her old snapshot: %v", err)
	}
}

// TestSnapshotConfigDefaults: the library's default is no limit, and every
// value is accepted as given (0 or negative: no limit).
func TestSnapshotConfigDefaults(t *testing.T) {
	got, err := SnapshotConfig{}.withDefaults()
	if err != nil || got != DefaultSnapshotConfig() || got != (SnapshotConfig{}) {
		t.Fatalf("zero config = %+v, %v; want no limits", got, err)
	}
	for _, c := range []SnapshotConfig{{MaxPerOwner: 3, MaxBytesPerOwner: 1 << 20}, {MaxPerOwner: -1, MaxBytesPerOwner: -1}} {
		if got, err := c.withDefaults(); err != nil || got != c {
			t.Errorf("%+v: withDefaults = %+v, %v; want it unchanged", c, got, err)
		}
	}
}
