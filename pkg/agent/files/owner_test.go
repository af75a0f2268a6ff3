package files

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/testenv"
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
