package lease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// fakeVolumes is the fake runtime's volume state: the volumes its creates
// mounted, minus those removed.
var fakeVolumes sync.Map // *fakeRuntime → *fakeVolumeSet

type fakeVolumeSet struct {
	mu      sync.Mutex
	removed map[string]bool
}

func (f *fakeRuntime) volumeSet() *fakeVolumeSet {
	v, _ := fakeVolumes.LoadOrStore(f, &fakeVolumeSet{removed: map[string]bool{}})
	return v.(*fakeVolumeSet)
}

// ListVolumes implements runtime.VolumeManager from the recorded specs.
func (f *fakeRuntime) ListVolumes(_ context.Context, sel runtime.Selector) ([]runtime.Volume, error) {
	vs := f.volumeSet()
	f.mu.Lock()
	specs := append([]runtime.Spec(nil), f.specs...)
	f.mu.Unlock()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	seen := map[string]bool{}
	var out []runtime.Volume
	for _, s := range specs {
		for _, m := range s.Mounts {
			if m.Type != runtime.MountVolume || seen[m.Source] || vs.removed[m.Source] || !sel.Matches(m.VolumeLabels) {
				continue
			}
			seen[m.Source] = true
			v := runtime.Volume{Name: m.Source, SizeBytes: -1, CreatedAt: time.Now().Add(-time.Hour)}
			v.SetLabels(m.VolumeLabels)
			out = append(out, v)
		}
	}
	return out, nil
}

func (f *fakeRuntime) InspectVolume(ctx context.Context, name string) (runtime.Volume, error) {
	vols, _ := f.ListVolumes(ctx, nil)
	for _, v := range vols {
		if v.Name == name {
			v.SizeBytes = 42
			return v, nil
		}
	}
	return runtime.Volume{}, errdefs.NotFound("volume %s not found", name)
}

func (f *fakeRuntime) RemoveVolume(_ context.Context, name string) error {
	vs := f.volumeSet()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	vs.removed[name] = true
	return nil
}

func (f *fakeRuntime) lastSpec() runtime.Spec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.specs[len(f.specs)-1]
}

func TestPersistentWorkspace(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	req := AcquireRequest{ConversationID: "c1", Owner: "alice", Persist: true}
	l, _, _, err := h.m.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	want := VolumeName("alice", "c1")
	if l.Volume != want || !strings.HasPrefix(want, VolumeNamePrefix) || !runtime.ValidVolumeName(want) {
		t.Fatalf("lease volume = %q, want %q", l.Volume, want)
	}
	if VolumeName("bob", "c1") == want {
		t.Fatal("two owners share a volume")
	}
	spec := h.rt.lastSpec()
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != want || spec.Mounts[0].Target != "/workspace" ||
		spec.Mounts[0].VolumeLabels[runtime.LabelOwner] != "alice" || spec.Mounts[0].VolumeLabels[runtime.LabelInstance] != "test" {
		t.Fatalf("spec mounts = %+v", spec.Mounts)
	}
	vols, err := h.m.Volumes().List(ctx, VolumeFilter{Owner: "alice"})
	if err != nil || len(vols) != 1 || vols[0].LeaseID != l.ID || vols[0].ConversationID != "c1" {
		t.Fatalf("ListVolumes = %+v, %v", vols, err)
	}
	if other, _ := h.m.Volumes().List(ctx, VolumeFilter{Owner: "bob"}); len(other) != 0 {
		t.Fatalf("bob sees %+v", other)
	}
	if err := h.m.Volumes().Remove(ctx, want); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), l.ID) {
		t.Fatalf("RemoveVolume in use = %v, want FailedPrecondition naming the lease", err)
	}
	if _, err := h.m.Release(ctx, l.ID, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "volume no longer in use", func() bool {
		v, err := h.m.Volumes().Inspect(ctx, want)
		return err == nil && !v.InUse()
	})
	v, _ := h.m.Volumes().Inspect(ctx, want)
	if v.SizeBytes != 42 || time.Since(v.LastUsedAt) > time.Minute {
		t.Errorf("InspectVolume = %+v", v)
	}
	// The last use is durable.
	h.restart()
	v2, err := h.m.Volumes().Inspect(ctx, want)
	if err != nil || !v2.LastUsedAt.Equal(v.LastUsedAt) {
		t.Errorf("after restart: %+v, %v; want last used %s", v2, err, v.LastUsedAt)
	}
	// Acquiring the conversation again mounts the same volume.
	l2, _, _, err := h.m.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if l2.ID == l.ID || l2.Volume != want || h.rt.lastSpec().Mounts[0].Source != want {
		t.Fatalf("second lease %s volume %q", l2.ID, l2.Volume)
	}
	if _, err := h.m.Release(ctx, l2.ID, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "volume removable", func() bool { return h.m.Volumes().Remove(ctx, want) == nil })
	if _, err := h.m.Volumes().Inspect(ctx, want); !errdefs.IsNotFound(err) {
		t.Errorf("InspectVolume after remove = %v", err)
	}
	if err := h.m.Volumes().Remove(ctx, want); !errdefs.IsNotFound(err) {
		t.Errorf("RemoveVolume twice = %v, want NotFound", err)
	}
}

func TestPersistDefault(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Volumes.PersistWorkspaces = true })
	l, _ := h.acquire("c-default")
	if l.Volume != VolumeName("", "c-default") {
		t.Fatalf("volume = %q with PersistWorkspaces", l.Volume)
	}
}

func TestVolumeRetention(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	h := newHarness(t, func(c *Config) {
		c.Volumes.Retention = 300 * time.Millisecond
		c.Volumes.ReapInterval = 50 * time.Millisecond
	})
	ctx := context.Background()
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c-ret", Persist: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // older than the retention, but in use
	if vols, _ := h.m.Volumes().List(ctx, VolumeFilter{}); len(vols) != 1 {
		t.Fatalf("a volume in use was reaped: %+v", vols)
	}
	if _, err := h.m.Release(ctx, l.ID, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "unused volume reaped", func() bool {
		vols, _ := h.m.Volumes().List(ctx, VolumeFilter{})
		return len(vols) == 0
	})
}

func TestHostMounts(t *testing.T) {
	root := t.TempDir()
	root, _ = filepath.EvalSymlinks(root)
	proj, data, secret := filepath.Join(root, "projects"), filepath.Join(root, "data"), filepath.Join(root, "secret")
	for _, d := range []string{filepath.Join(proj, "app"), data, secret} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(secret, filepath.Join(proj, "escape")); err != nil {
		t.Fatal(err)
	}
	policy, err := runtime.ParseHostMountPolicy(proj + ":rw," + data + ":ro")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.Volumes.HostMounts = policy })
	ctx := context.Background()
	acq := func(conv string, mounts ...HostMount) (Lease, error) {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: conv, Mounts: mounts})
		return l, err
	}
	l, err := acq("ok", HostMount{HostPath: filepath.Join(proj, "app", "..", "app"), Target: "/src"}, HostMount{HostPath: data, Target: "/data", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Mounts) != 2 || l.Mounts[0].Source != filepath.Join(proj, "app") || !l.Mounts[1].ReadOnly {
		t.Fatalf("lease mounts = %+v", l.Mounts)
	}
	if got := h.rt.lastSpec().Mounts; len(got) != 2 || got[0].Type != runtime.MountBind {
		t.Fatalf("spec mounts = %+v", got)
	}
	for _, c := range []struct {
		m    HostMount
		deny bool
	}{
		{HostMount{HostPath: filepath.Join(proj, "escape"), Target: "/x", ReadOnly: true}, true},
		{HostMount{HostPath: secret, Target: "/x", ReadOnly: true}, true},
		{HostMount{HostPath: data, Target: "/x"}, true}, // rw under ro
		{HostMount{HostPath: filepath.Join(proj, "nope"), Target: "/x"}, false},
		{HostMount{HostPath: proj, Target: "/.berth"}, false},
	} {
		_, err := acq("bad", c.m)
		switch {
		case c.deny && !errdefs.IsPermissionDenied(err), !c.deny && !errdefs.IsInvalidArgument(err):
			t.Errorf("mount %+v: %v (deny=%v)", c.m, err, c.deny)
		case c.deny && !strings.Contains(err.Error(), c.m.HostPath):
			t.Errorf("mount %+v: error %q does not name the path", c.m, err)
		}
	}
	// The persistent workspace's target is taken.
	if _, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "dup", Persist: true, Mounts: []HostMount{{HostPath: proj, Target: "/workspace"}}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("host mount on /workspace with persist: %v", err)
	}
	// Nothing is allowed by default.
	h2 := newHarness(t, nil)
	if _, _, _, err := h2.m.Acquire(ctx, AcquireRequest{ConversationID: "x", Mounts: []HostMount{{HostPath: proj, Target: "/src"}}}); !errdefs.IsPermissionDenied(err) {
		t.Errorf("default policy: %v", err)
	}
}

// TestHostMountSwapRefused: a sandbox that can write to the parent of its
// host mount's source replaces the source by a symlink out of the allowed
// prefix. Neither a resume from hibernate nor an in-place restart binds it
// again: the resume is refused (the lease stays PAUSED), the restart fails
// the lease at once, and the runtime is never asked to start the container.
func TestHostMountSwapRefused(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	prefix, outside := filepath.Join(root, "prefix"), filepath.Join(root, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.Volumes.HostMounts = runtime.HostMountPolicy{{Path: prefix}} })
	ctx := context.Background()
	acquireSwapped := func(conv string) Lease {
		t.Helper()
		sub := filepath.Join(prefix, conv)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: conv, Mounts: []HostMount{
			{HostPath: prefix, Target: "/mnt/p"}, {HostPath: sub, Target: "/mnt/a"}}})
		if err != nil {
			t.Fatal(err)
		}
		if l.Mounts[1].Pin == (runtime.FileID{}) {
			t.Fatalf("mount not pinned: %+v", l.Mounts[1])
		}
		if err := os.Rename(sub, sub+".orig"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, sub); err != nil {
			t.Fatal(err)
		}
		return l
	}

	l := acquireSwapped("hib")
	if _, err := h.m.Pause(ctx, l.ID, PauseHibernate); err != nil {
		t.Fatal(err)
	}
	_, err := h.m.Resume(ctx, l.ID)
	if !errdefs.IsFailedPrecondition(err) || !errors.Is(err, runtime.ErrHostPathChanged) || !strings.Contains(err.Error(), "mounts[1].host_path") {
		t.Fatalf("resume after the swap: %v, want FailedPrecondition naming mounts[1].host_path", err)
	}
	if got := h.get(l.ID); got.State != StatePaused {
		t.Fatalf("after the refused resume: %s (%s), want PAUSED", got.State, got.Reason)
	}

	l = acquireSwapped("rst")
	h.rt.kill(l.ContainerID, 137, false)
	eventually(t, 5*time.Second, "failed", func() bool { return h.get(l.ID).State == StateFailed })
	if got := h.get(l.ID); !strings.Contains(got.Reason, "mounts[1].host_path") || !strings.Contains(got.Reason, "is a symlink") {
		t.Fatalf("reason %q, want the changed host mount", got.Reason)
	}
	if n := h.rt.restartCount(); n != 0 {
		t.Fatalf("the runtime was asked to restart %d times, want none", n)
	}
}
