package users_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/pkg/agent/users"
	"github.com/berth-dev/berth/pkg/errdefs"
)

func writeDB(t *testing.T) (passwd, group string) {
	t.Helper()
	dir := t.TempDir()
	passwd, group = filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/bash\ntoor:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(group, []byte("root:x:0:\nsandbox:x:1000:\ndocker:x:999:sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return passwd, group
}

func TestLookup(t *testing.T) {
	passwd, group := writeDB(t)
	for _, tc := range []struct {
		spec           string
		name           string
		uid, gid       uint32
		home           string
		groups         int
		wantInvalidArg bool
	}{
		{spec: "", name: "root", uid: 0, gid: 0, home: "/root"},
		{spec: "sandbox", name: "sandbox", uid: 1000, gid: 1000, home: "/home/sandbox", groups: 1},
		{spec: "1000", name: "sandbox", uid: 1000, gid: 1000, home: "/home/sandbox", groups: 1},
		{spec: "sandbox:root", name: "sandbox", uid: 1000, gid: 0, home: "/home/sandbox"}, // an explicit group: no supplementary ones
		{spec: "4242:4242", name: "4242", uid: 4242, gid: 4242, home: "/"},
		{spec: "no-such-user", wantInvalidArg: true},
		{spec: "sandbox:no-such-group", wantInvalidArg: true},
	} {
		id, err := users.Lookup(tc.spec, passwd, group)
		if tc.wantInvalidArg {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("Lookup(%q) = %+v, %v; want InvalidArgument", tc.spec, id, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Lookup(%q): %v", tc.spec, err)
			continue
		}
		if id.Name != tc.name || id.UID != tc.uid || id.GID != tc.gid || id.Home != tc.home || len(id.Groups) != tc.groups {
			t.Errorf("Lookup(%q) = %+v", tc.spec, id)
		}
	}
	if env := (users.Identity{Name: "sandbox", Home: "/home/sandbox"}).Env(); env["HOME"] != "/home/sandbox" || env["USER"] != "sandbox" || env["LOGNAME"] != "sandbox" {
		t.Errorf("Env = %v", env)
	}
}

func TestResolverRootPolicy(t *testing.T) {
	passwd, group := writeDB(t)
	r := &users.Resolver{AllowRoot: false, Passwd: passwd, Group: group}
	def, err := users.Lookup("sandbox", passwd, group)
	if err != nil {
		t.Fatal(err)
	}
	r.Default = def
	if id, err := r.Resolve(""); err != nil || id.UID != 1000 {
		t.Errorf("Resolve(default) = %+v, %v", id, err)
	}
	// Every spelling of uid 0, including another name for it, is refused.
	for _, spec := range []string{"root", "0", "0:0", "toor", "root:sandbox"} {
		if _, err := r.Resolve(spec); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("Resolve(%q) with root forbidden: %v, want PermissionDenied", spec, err)
		}
	}
	if id, err := r.Resolve("sandbox:root"); err != nil || id.UID != 1000 || id.GID != 0 {
		t.Errorf("Resolve(sandbox:root) = %+v, %v; a root group is not root", id, err)
	}
	r.AllowRoot = true
	if id, err := r.Resolve("root"); err != nil || id.UID != 0 {
		t.Errorf("Resolve(root) with root allowed = %+v, %v", id, err)
	}
	if _, err := users.NewResolver("root", false); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("NewResolver(root, deny) = %v, want PermissionDenied", err)
	}
}
