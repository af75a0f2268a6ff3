package lease

import (
	"context"
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
	img := runtime.SnapshotImage{Name: opts.Name, Tag: tag, Ref: runtime.SnapshotRef(tag), ID: "sha256:" + tag,
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
	m := startSnapManager(t, rt, func(c *Config) { c.AllowedImages = []string{"berth/"}; c.DefaultImage = "berth/base" })
	ctx := context.Background()
	src, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-1", Owner: "alice", Image: "berth/base", User: "1000:1000"})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := m.Snapshot(ctx, src.ID, "Bad Name"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad name: %v, want InvalidArgument", err)
	}
	if _, err := m.Snapshot(ctx, "no-such-lease", "x"); !errdefs.IsNotFound(err) {
		t.Errorf("unknown lease: %v, want NotFound", err)
	}
	auto, err := m.Snapshot(ctx, src.ID, "")
	if err != nil || !strings.HasPrefix(auto.Name, src.ID+"-") {
		t.Fatalf("Snapshot without a name: %+v %v", auto, err)
	}
	s, err := m.Snapshot(ctx, src.ID, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Owner != "alice" || s.LeaseID != src.ID || s.ConversationID != "c-1" || s.Image != "berth/base" || s.User != "1000:1000" || s.Ref != runtime.SnapshotRef(runtime.SnapshotTag("test", "alice", "s1")) {
		t.Errorf("snapshot = %+v", s)
	}
	if rt.of[s.Tag] != src.ContainerID {
		t.Errorf("snapshot of container %q, want %q", rt.of[s.Tag], src.ContainerID)
	}
	if _, err := m.Snapshot(ctx, src.ID, "s1"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("taken name: %v", err)
	}
	if got, _ := m.Get(ctx, src.ID); got.State != StateReady {
		t.Errorf("source after its snapshot: %s", got.State)
	}

	if list, err := m.Snapshots(ctx, SnapshotFilter{Owner: "alice"}); err != nil || len(list) != 2 {
		t.Errorf("alice's snapshots: %v %v", list, err)
	}
	if list, _ := m.Snapshots(ctx, SnapshotFilter{Owner: "bob"}); len(list) != 0 {
		t.Errorf("bob sees %v", list)
	}
	if list, _ := m.Snapshots(ctx, SnapshotFilter{AnyOwner: true, LeaseID: src.ID}); len(list) != 2 {
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

	if err := m.RemoveSnapshot(ctx, "s1", "bob", false); !errdefs.IsNotFound(err) {
		t.Errorf("bob removes alice's snapshot: %v", err)
	}
	if err := m.RemoveSnapshot(ctx, "s1", "alice", false); err != nil {
		t.Errorf("alice removes her snapshot: %v", err)
	}
	if _, err := m.GetSnapshot(ctx, "s1", "", true); !errdefs.IsNotFound(err) {
		t.Errorf("removed snapshot: %v", err)
	}
}

func TestSnapshotOtherImagesAllowedAndRuntimeWithout(t *testing.T) {
	rt := newSnapRuntime()
	// Only python is allowed besides the default: a fork of a python
	// lease runs although berth/snapshot is not in the list, and its
	// user defaults follow python (the image's own user), not berth's.
	m := startSnapManager(t, rt, func(c *Config) { c.AllowedImages = []string{"python"}; c.DefaultUser = "sandbox" })
	ctx := context.Background()
	src, _, _, err := m.Acquire(ctx, AcquireRequest{ConversationID: "c-1", Owner: "o", Image: "python:3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshot(ctx, src.ID, "py"); err != nil {
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
	if _, err := plain.Snapshot(ctx, l.ID, "x"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Snapshot on a runtime without Snapshotter: %v, want FailedPrecondition", err)
	}
	if _, _, _, err := plain.Acquire(ctx, AcquireRequest{ConversationID: "c-2", Snapshot: "x"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("fork on a runtime without Snapshotter: %v, want FailedPrecondition", err)
	}
}
