package conformance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// testMounts checks Spec.Mounts and runtime.VolumeManager: a workspace
// volume outlives its sandbox and a second sandbox mounting it finds the
// files; a host directory is mounted read-only or read-write as asked
// (refused under LimitHostMounts); Usage counts the volume (not under
// LimitVolumeSize); a volume in use cannot be removed; removal is
// idempotent and leaves nothing.
func (s *suite) testMounts(t *testing.T) {
	t.Parallel()
	s.needShell(t)
	vm, ok := s.rt.(runtime.VolumeManager)
	if !ok {
		// An optional interface, like Freezer and Snapshotter: not
		// implementing it is the backend's choice, not a missing tool.
		t.Skipf("%T does not implement runtime.VolumeManager", s.rt)
	}
	ctx := context.Background()
	vol := "berth-conf-" + s.runID + "-ws"
	// Registered before the sandboxes' removal, so it runs after it.
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := vm.RemoveVolume(cctx, vol); err != nil {
			t.Errorf("cleanup: RemoveVolume %s: %v", vol, err)
		}
	})
	roDir, rwDir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(roDir, "hello"), []byte("from-host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Writable by the sandbox's root whatever host uid it is (user namespaces).
	for dir, mode := range map[string]os.FileMode{roDir: 0o755, rwDir: 0o777} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	spec := s.spec(s.images.Shell)
	spec.Mounts = []runtime.Mount{
		{Type: runtime.MountVolume, Source: vol, Target: "/workspace", VolumeLabels: runtime.VolumeLabels("conf-owner", spec.ConversationID)},
		{Type: runtime.MountBind, Source: roDir, Target: "/mnt/ro", ReadOnly: true},
		{Type: runtime.MountBind, Source: rwDir, Target: "/mnt/rw"},
	}
	hostMounts := !s.lacks(t, LimitHostMounts)
	if !hostMounts {
		if _, err := s.rt.Create(ctx, spec); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("Create with host mounts = %v, want FailedPrecondition (the runtime declares %q)", err, LimitHostMounts)
		}
		spec.Mounts = spec.Mounts[:1]
	}
	sb := s.create(t, spec)
	s.sh(t, sb, spec.AgentToken, "echo persisted > /workspace/f && head -c 1048576 /dev/zero > /workspace/big")
	if hostMounts {
		s.sh(t, sb, spec.AgentToken, "echo written > /mnt/rw/out")
		if got := s.sh(t, sb, spec.AgentToken, "cat /mnt/ro/hello"); got != "from-host\n" {
			t.Errorf("read-only host mount: cat = %q", got)
		}
		if res := s.exec(t, sb, spec.AgentToken, map[string]any{"command": "echo x > /mnt/ro/new", "timeout": "10s"}); res.ExitCode == 0 {
			t.Errorf("writing to a read-only host mount succeeded")
		}
		if b, err := os.ReadFile(filepath.Join(rwDir, "out")); err != nil || string(b) != "written\n" {
			t.Errorf("read-write host mount: host file = %q, %v", b, err)
		}
	}

	vols, err := vm.ListVolumes(ctx, runtime.Selector{runtime.LabelConversation: spec.ConversationID})
	if err != nil {
		t.Fatalf("ListVolumes: %v", err)
	}
	if len(vols) != 1 || vols[0].Name != vol || vols[0].Owner != "conf-owner" || vols[0].ConversationID != spec.ConversationID {
		t.Fatalf("ListVolumes = %+v, want %s of conf-owner", vols, vol)
	}
	v, err := vm.InspectVolume(ctx, vol)
	if err != nil {
		t.Fatalf("InspectVolume: %v", err)
	}
	if v.CreatedAt.IsZero() {
		t.Errorf("InspectVolume = %+v, want a creation time", v)
	}
	if !s.lacks(t, LimitVolumeSize) {
		if v.SizeBytes < 1<<20 {
			t.Errorf("InspectVolume = %+v, want ≥ 1 MiB", v)
		}
		if u, err := s.rt.Usage(ctx, sb.ID); err != nil || u.DiskBytes < 1<<20 {
			t.Errorf("Usage = %+v, %v; want the volume's 1 MiB counted", u, err)
		}
	}
	if err := vm.RemoveVolume(ctx, vol); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("RemoveVolume of a mounted volume = %v, want FailedPrecondition", err)
	}
	if _, err := vm.InspectVolume(ctx, "berth-conf-"+s.runID+"-missing"); !errdefs.IsNotFound(err) {
		t.Errorf("InspectVolume(missing) = %v, want NotFound", err)
	}

	if err := s.rt.Remove(ctx, sb.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	spec2 := s.spec(s.images.Shell)
	spec2.Mounts = spec.Mounts[:1]
	sb2 := s.create(t, spec2)
	if got := s.sh(t, sb2, spec2.AgentToken, "cat /workspace/f"); strings.TrimSpace(got) != "persisted" {
		t.Errorf("a second sandbox on the volume reads %q, want persisted", got)
	}
	if err := s.rt.Remove(ctx, sb2.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := vm.RemoveVolume(ctx, vol); err != nil {
		t.Fatalf("RemoveVolume: %v", err)
	}
	if _, err := vm.InspectVolume(ctx, vol); !errdefs.IsNotFound(err) {
		t.Errorf("InspectVolume after RemoveVolume = %v, want NotFound", err)
	}
	if err := vm.RemoveVolume(ctx, vol); err != nil {
		t.Errorf("RemoveVolume twice = %v, want success", err)
	}
}
