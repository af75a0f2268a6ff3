package runtime

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// pinFixture is a real directory tree: root/prefix (allowed read-write)
// with prefix/a/b and a file prefix/f, and root/outside (not allowed) with
// a file "secret".
type pinFixture struct {
	root, prefix, outside string
	policy                HostMountPolicy
}

func newPinFixture(t *testing.T) pinFixture {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := pinFixture{root: root, prefix: filepath.Join(root, "prefix"), outside: filepath.Join(root, "outside")}
	for _, d := range []string{filepath.Join(f.prefix, "a", "b"), f.outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{filepath.Join(f.prefix, "f"), filepath.Join(f.outside, "secret")} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.policy = HostMountPolicy{{Path: f.prefix}}
	return f
}

// fileID is path's device and inode (following symlinks).
func fileID(t *testing.T, path string) FileID {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)} //nolint:unconvert // widths differ by platform
}

// pin pins path read-write under f's policy and returns the mount.
func (f pinFixture) pin(t *testing.T, path string) Mount {
	t.Helper()
	src, id, err := f.policy.Pin("mounts[0].host_path", path, false)
	if err != nil {
		t.Fatalf("Pin(%s): %v", path, err)
	}
	return Mount{Type: MountBind, Source: src, Target: "/mnt/x", Pin: id}
}

// swap replaces dir by a symlink to target, as a sandbox that mounts the
// parent of dir can.
func swap(t *testing.T, dir, target string) {
	t.Helper()
	if err := os.Rename(dir, dir+".orig"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
}

func TestPinRecordsWhatWasChecked(t *testing.T) {
	f := newPinFixture(t)
	for _, p := range []string{f.prefix, filepath.Join(f.prefix, "a", "b"), filepath.Join(f.prefix, "f")} {
		m := f.pin(t, p)
		if m.Source != p || m.Pin != fileID(t, p) {
			t.Errorf("Pin(%s) = %s %s, want the path and device:inode %s", p, m.Source, m.Pin, fileID(t, p))
		}
		if err := f.policy.Verify("mounts[0].host_path", m); err != nil {
			t.Errorf("Verify of an unchanged %s: %v", p, err)
		}
	}
}

func TestPinFollowsSymlinksOnlyIntoThePrefix(t *testing.T) {
	f := newPinFixture(t)
	in, out := filepath.Join(f.prefix, "in"), filepath.Join(f.prefix, "out")
	if err := os.Symlink(filepath.Join(f.prefix, "a"), in); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(f.outside, out); err != nil {
		t.Fatal(err)
	}
	if m := f.pin(t, filepath.Join(in, "b")); m.Source != filepath.Join(f.prefix, "a", "b") {
		t.Errorf("Pin through a symlink within the prefix: %s, want it resolved", m.Source)
	}
	_, _, err := f.policy.Pin("mounts[0].host_path", filepath.Join(out, "secret"), true)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), f.outside) {
		t.Errorf("Pin through a symlink out of the prefix: %v, want PermissionDenied naming %s", err, f.outside)
	}
}

// TestVerifyRefusesChangedHostPaths: every way a sandbox can change the
// source of a mount between two binds is refused.
func TestVerifyRefusesChangedHostPaths(t *testing.T) {
	for _, c := range []struct {
		name   string
		path   string // under the prefix ("a/b")
		change func(t *testing.T, f pinFixture)
		want   string // in the error
	}{
		{"swapped for a symlink out of the prefix", "a", func(t *testing.T, f pinFixture) {
			swap(t, filepath.Join(f.prefix, "a"), f.outside)
		}, "is a symlink"},
		{"swapped for a symlink within the prefix", "a/b", func(t *testing.T, f pinFixture) {
			swap(t, filepath.Join(f.prefix, "a", "b"), filepath.Join(f.prefix, "a"))
		}, "is a symlink"},
		{"a parent swapped for a symlink", "a/b", func(t *testing.T, f pinFixture) {
			if err := os.MkdirAll(filepath.Join(f.outside, "b"), 0o755); err != nil {
				t.Fatal(err)
			}
			swap(t, filepath.Join(f.prefix, "a"), f.outside)
		}, filepath.Join("prefix", "a") + " is a symlink"},
		{"a file swapped for a symlink", "f", func(t *testing.T, f pinFixture) {
			swap(t, filepath.Join(f.prefix, "f"), filepath.Join(f.outside, "secret"))
		}, "is a symlink"},
		{"replaced by another directory", "a", func(t *testing.T, f pinFixture) {
			if err := os.Rename(filepath.Join(f.prefix, "a"), filepath.Join(f.prefix, "old")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(f.prefix, "a"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "another file now"},
		{"removed", "a/b", func(t *testing.T, f pinFixture) {
			if err := os.Remove(filepath.Join(f.prefix, "a", "b")); err != nil {
				t.Fatal(err)
			}
		}, "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newPinFixture(t)
			m := f.pin(t, filepath.Join(f.prefix, c.path))
			c.change(t, f)
			err := f.policy.Verify("mounts[1].host_path", m)
			if !errdefs.IsFailedPrecondition(err) || !errors.Is(err, ErrHostPathChanged) {
				t.Fatalf("Verify after the change: %v, want FailedPrecondition and ErrHostPathChanged", err)
			}
			for _, s := range []string{"mounts[1].host_path", m.Source, c.want, "refusing to bind it again"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestVerifyChecksThePolicyOfNow(t *testing.T) {
	f := newPinFixture(t)
	m := f.pin(t, filepath.Join(f.prefix, "a"))
	for name, p := range map[string]HostMountPolicy{
		"none":      nil,
		"elsewhere": {{Path: f.outside}},
		"read-only": {{Path: f.prefix, ReadOnly: true}},
	} {
		if err := p.Verify("mounts[0].host_path", m); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no longer allowed") {
			t.Errorf("policy %s: Verify = %v, want FailedPrecondition (no longer allowed)", name, err)
		}
	}
	m.ReadOnly = true
	if err := (HostMountPolicy{{Path: f.prefix, ReadOnly: true}}).Verify("mounts[0].host_path", m); err != nil {
		t.Errorf("a read-only mount under a read-only prefix: %v", err)
	}
}

// TestVerifyWithoutPin: a mount recorded before pins existed is still
// refused when a component is a symlink, and passes otherwise.
func TestVerifyWithoutPin(t *testing.T) {
	f := newPinFixture(t)
	m := f.pin(t, filepath.Join(f.prefix, "a"))
	m.Pin = FileID{}
	if err := f.policy.Verify("mounts[0].host_path", m); err != nil {
		t.Errorf("unchanged, no pin: %v", err)
	}
	swap(t, m.Source, f.outside)
	if err := f.policy.Verify("mounts[0].host_path", m); !errors.Is(err, ErrHostPathChanged) {
		t.Errorf("swapped, no pin: %v, want ErrHostPathChanged", err)
	}
	if err := f.policy.Verify("mounts[0].host_path", Mount{Type: MountVolume, Source: "vol", Target: "/w"}); err != nil {
		t.Errorf("a volume is not checked: %v", err)
	}
}

// TestPinNestedPrefixes: with a read-write prefix inside another, a
// sandbox mounting the outer one replaces the inner prefix by a symlink;
// the policy resolved before (Resolved) takes the inner prefix literally,
// so nothing under the symlink's target is allowed.
func TestPinNestedPrefixes(t *testing.T) {
	f := newPinFixture(t)
	inner := filepath.Join(f.prefix, "a")
	policy := HostMountPolicy{{Path: f.prefix}, {Path: inner}}.Resolved()
	swap(t, inner, f.outside)
	if _, _, err := policy.Pin("mounts[0].host_path", filepath.Join(inner, "secret"), true); !errdefs.IsPermissionDenied(err) {
		t.Errorf("Pin under a swapped inner prefix: %v, want PermissionDenied", err)
	}
}

func TestResolvedPolicy(t *testing.T) {
	f := newPinFixture(t)
	link := filepath.Join(f.root, "link")
	if err := os.Symlink(f.prefix, link); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(f.root, "missing")
	got := HostMountPolicy{{Path: link, ReadOnly: true}, {Path: missing}}.Resolved()
	if want := (HostMountPolicy{{Path: f.prefix, ReadOnly: true}, {Path: missing}}); got.String() != want.String() {
		t.Errorf("Resolved = %s, want %s", got, want)
	}
}

func TestStatNoFollow(t *testing.T) {
	f := newPinFixture(t)
	if id, err := statNoFollow("/"); err != nil || id != fileID(t, "/") {
		t.Errorf("statNoFollow(/) = %s, %v", id, err)
	}
	for _, bad := range []string{"relative", "/a/../b", "/a/"} {
		if _, err := statNoFollow(bad); err == nil {
			t.Errorf("statNoFollow(%q) accepted", bad)
		}
	}
	link := filepath.Join(f.root, "link")
	if err := os.Symlink(f.prefix, link); err != nil {
		t.Fatal(err)
	}
	var se *SymlinkError
	if _, err := statNoFollow(filepath.Join(link, "a")); !errors.As(err, &se) || se.Path != link {
		t.Errorf("statNoFollow through a symlink: %v, want a SymlinkError naming %s", err, link)
	}
}

func TestFileIDJSON(t *testing.T) {
	m := Mount{Type: MountBind, Source: "/s", Target: "/t", Pin: FileID{Dev: 1<<64 - 1, Ino: 42}}
	b, err := json.Marshal(m)
	if err != nil || !strings.Contains(string(b), `"pin":"18446744073709551615:42"`) {
		t.Fatalf("marshal: %s, %v", b, err)
	}
	var got Mount
	if err := json.Unmarshal(b, &got); err != nil || got.Pin != m.Pin {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if b, _ := json.Marshal(Mount{Type: MountBind}); strings.Contains(string(b), "pin") {
		t.Errorf("zero pin written: %s", b)
	}
	if err := json.Unmarshal([]byte(`{"pin":"12"}`), &got); err == nil {
		t.Error("a pin without an inode accepted")
	}
}
