package files

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestChownCreated: with Config.Chown, uploads, the parents they create,
// MakeDir's directories and a move's target belong to the default user,
// while existing directories keep their owner.
func TestChownCreated(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "chown needs root")
	}
	f := New(Config{Chown: func(p string) error { return os.Lchown(p, 1000, 1000) }})
	ctx := context.Background()
	dir := t.TempDir()
	owner := func(p string) uint32 {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid
	}
	if _, err := f.Upload(ctx, UploadOptions{Path: dir + "/a/b/up.txt", CreateParents: true, Mode: 0o755 | os.ModeSetuid}, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if err := f.MakeDir(ctx, dir+"/m/n", true, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/rootfile", []byte("r"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Move(ctx, dir+"/rootfile", dir+"/m/moved", false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "a/b", "a/b/up.txt", "m", "m/n", "m/moved"} {
		if u := owner(filepath.Join(dir, p)); u != 1000 {
			t.Errorf("%s owned by uid %d, want 1000", p, u)
		}
	}
	if u := owner(dir); u != 0 {
		t.Errorf("the existing parent changed owner to %d", u)
	}
	// The mode is set after the chown, which would clear set-id bits.
	if fi, err := os.Stat(dir + "/a/b/up.txt"); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("upload mode %v, %v; want setuid kept", fi.Mode(), err)
	}
}

// TestAsUser: with Config.AsUser every operation runs with that user's
// file-system ids: it can write where the user can (and what it creates is
// the user's), and gets PermissionDenied where only root could.
func TestAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "switching file-system ids needs root")
	}
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // testing makes them 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mine := filepath.Join(dir, "mine")
	if err := os.Mkdir(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mine, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := New(Config{AsUser: &Identity{UID: 1000, GID: 1000}})
	for i := 0; i < 20; i++ { // many calls: threads must come back as root
		if _, err := f.Upload(ctx, UploadOptions{Path: mine + "/a/up.txt", CreateParents: true}, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Upload(ctx, UploadOptions{Path: dir + "/root-only.txt"}, strings.NewReader("x")); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("upload into root's directory as 1000: %v, want PermissionDenied", err)
		}
		if _, err := f.Open(ctx, secret, 0, 0); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("open root's 0600 file as 1000: %v, want PermissionDenied", err)
		}
		if err := f.MakeDir(ctx, dir+"/d", false, 0); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("mkdir in root's directory as 1000: %v", err)
		}
		// The agent's own file operations stay root's.
		if err := os.WriteFile(dir+"/still-root.txt", []byte("r"), 0o600); err != nil {
			t.Fatalf("the agent lost root after AsUser calls: %v", err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(mine+"/a/up.txt", &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("upload owned by %d:%d, %v; want 1000:1000", st.Uid, st.Gid, err)
	}
}
