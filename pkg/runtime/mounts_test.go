package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestParseHostMountPolicy(t *testing.T) {
	p, err := ParseHostMountPolicy(" /srv/projects:rw, /data:ro,/etc/x/ ")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.String(), "/srv/projects:rw,/data:ro,/etc/x:ro"; got != want {
		t.Fatalf("policy = %q, want %q", got, want)
	}
	if p, err := ParseHostMountPolicy(""); err != nil || len(p) != 0 {
		t.Fatalf("empty policy = %v, %v", p, err)
	}
	for _, bad := range []string{"relative:rw", "/a:rx", ":rw"} {
		if _, err := ParseHostMountPolicy(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseHostMountPolicy(%q) = %v, want InvalidArgument", bad, err)
		}
	}
}

func TestHostMountPolicyResolve(t *testing.T) {
	root := t.TempDir()
	root, _ = filepath.EvalSymlinks(root)
	rw := filepath.Join(root, "projects")
	ro := filepath.Join(root, "data")
	outside := filepath.Join(root, "secret")
	for _, d := range []string{rw, filepath.Join(rw, "app"), ro, outside, filepath.Join(root, "projects-evil")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A symlink under the allowed prefix that leads out of it.
	if err := os.Symlink(outside, filepath.Join(rw, "escape")); err != nil {
		t.Fatal(err)
	}
	// A symlink outside that leads in.
	if err := os.Symlink(filepath.Join(rw, "app"), filepath.Join(root, "link-in")); err != nil {
		t.Fatal(err)
	}
	p, err := ParseHostMountPolicy(rw + ":rw," + ro + ":ro")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path     string
		readOnly bool
		want     string // resolved path; "" when refused
		deny     bool   // PermissionDenied (else InvalidArgument) when refused
	}{
		{rw, false, rw, false},
		{filepath.Join(rw, "app"), false, filepath.Join(rw, "app"), false},
		{filepath.Join(rw, "app"), true, filepath.Join(rw, "app"), false},
		{filepath.Join(ro), true, ro, false},
		{filepath.Join(ro), false, "", true},                             // rw under a ro prefix
		{outside, true, "", true},                                        // not under any prefix
		{filepath.Join(rw, "escape"), true, "", true},                    // symlink escape
		{filepath.Join(rw, "app", "..", "..", "secret"), true, "", true}, // .. escape
		{filepath.Join(root, "projects-evil"), true, "", true},           // shares a string prefix only
		{filepath.Join(root, "link-in"), false, filepath.Join(rw, "app"), false},
		{filepath.Join(rw, "missing"), true, "", false}, // does not exist
		{"relative/path", true, "", false},
	}
	for _, c := range cases {
		got, err := p.Resolve("mounts[0].host_path", c.path, c.readOnly)
		if c.want != "" {
			if err != nil || got != c.want {
				t.Errorf("Resolve(%q, ro=%v) = %q, %v; want %q", c.path, c.readOnly, got, err, c.want)
			}
			continue
		}
		switch {
		case err == nil:
			t.Errorf("Resolve(%q, ro=%v) = %q, want an error", c.path, c.readOnly, got)
		case c.deny && !errdefs.IsPermissionDenied(err), !c.deny && !errdefs.IsInvalidArgument(err):
			t.Errorf("Resolve(%q, ro=%v) error = %v, wrong category (deny=%v)", c.path, c.readOnly, err, c.deny)
		case !strings.Contains(err.Error(), c.path):
			t.Errorf("Resolve(%q) error %q does not name the path", c.path, err)
		}
	}
	// The empty policy allows nothing, and says so.
	if _, err := HostMountPolicy(nil).Resolve("mounts[0].host_path", rw, true); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), rw) {
		t.Errorf("empty policy: %v", err)
	}
}

func TestValidateMounts(t *testing.T) {
	ok := []Mount{
		{Type: MountVolume, Source: "berth-ws-0123abcd", Target: "/workspace"},
		{Type: MountBind, Source: "/srv/projects/app", Target: "/workspace/app", ReadOnly: true},
	}
	if err := ValidateMounts("mounts", ok); err != nil {
		t.Fatal(err)
	}
	bad := map[string]Mount{
		"mounts[0].target":     {Type: MountVolume, Source: "v", Target: "relative"},
		"mounts[0].target ":    {Type: MountVolume, Source: "v", Target: "/a/../b"},
		"mounts[0].target  ":   {Type: MountVolume, Source: "v", Target: "/"},
		"mounts[0].target   ":  {Type: MountVolume, Source: "v", Target: "/.berth/x"},
		"mounts[0].source":     {Type: MountVolume, Source: "-bad", Target: "/w"},
		"mounts[0].host_path":  {Type: MountBind, Source: "rel", Target: "/w"},
		"mounts[0].type":       {Type: "tmpfs", Source: "x", Target: "/w"},
		"mounts[0].target    ": {Type: MountVolume, Source: "v", Target: "/proc"},
	}
	for field, m := range bad {
		err := ValidateMounts("mounts", []Mount{m})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("ValidateMounts(%+v) = %v, want InvalidArgument naming %s", m, err, field)
		}
	}
	dup := []Mount{{Type: MountVolume, Source: "a", Target: "/w"}, {Type: MountVolume, Source: "b", Target: "/w"}}
	if err := ValidateMounts("mounts", dup); !errdefs.IsInvalidArgument(err) {
		t.Errorf("duplicate target: %v", err)
	}
	spec := Spec{LeaseID: "l1", Image: "berth/base", AgentToken: "t", Mounts: []Mount{{Type: MountVolume, Source: "v", Target: "x"}}}
	if err := spec.Validate(); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Spec.Validate with a bad mount = %v", err)
	}
}

func TestSortMounts(t *testing.T) {
	in := []Mount{{Target: "/workspace/a/b"}, {Target: "/data"}, {Target: "/workspace"}, {Target: "/workspace/a"}}
	out := SortMounts(in)
	idx := map[string]int{}
	for i, m := range out {
		idx[m.Target] = i
	}
	if !(idx["/workspace"] < idx["/workspace/a"] && idx["/workspace/a"] < idx["/workspace/a/b"]) {
		t.Fatalf("order %v", out)
	}
}
