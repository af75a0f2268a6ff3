package cli

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

// treeOf describes a local tree: each path's mode, mtime (not for the
// root) and content or link target.
func treeOf(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", rel, fi.Mode())
		if rel != "." {
			line += fmt.Sprintf(" %d", fi.ModTime().Unix())
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// makeSrcTree makes a small tree with modes, a symlink, an empty
// directory and old times.
func makeSrcTree(t *testing.T, dir string) {
	t.Helper()
	for _, err := range []error{
		os.MkdirAll(filepath.Join(dir, "bin"), 0o755),
		os.MkdirAll(filepath.Join(dir, "empty"), 0o700),
		os.WriteFile(filepath.Join(dir, "bin", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755),
		os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o600),
		os.Symlink("bin/run.sh", filepath.Join(dir, "run")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	old := time.Unix(1_500_000_000, 0)
	for _, p := range []string{"bin/run.sh", "secret", "empty", "bin"} {
		if err := os.Chtimes(filepath.Join(dir, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCpDirectories(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "cpdir", "-o", "json")
	var acq struct {
		Lease struct{ ID string } `json:"lease"`
		Token string
	}
	if err := json.Unmarshal([]byte(out), &acq); err != nil {
		t.Fatal(err)
	}
	id, tok := acq.Lease.ID, acq.Token
	sh := func(line string) string {
		t.Helper()
		code, out, errs := runTool(t, s, tok, tool{name: "exec"}, id, "--", "sh", "-c", line)
		if code != 0 {
			t.Fatalf("exec %q: %d %s", line, code, errs)
		}
		return out
	}
	cp := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runTool(t, s, tok, tool{"cp", stdin}, args...)
	}
	root := strings.TrimSpace(sh("pwd"))
	src := filepath.Join(t.TempDir(), "src")
	os.Mkdir(src, 0o750)
	makeSrcTree(t, src)

	// Up: a new DST gets SRC's contents; an existing one gets DST/src; SRC/. merges.
	if code, _, errs := cp("", src, id+":"+root+"/up"); code != 0 || !strings.Contains(errs, "entries") {
		t.Fatalf("cp dir up: %d %s", code, errs)
	}
	if got := sh("cd up && ls -A && ./run && stat -c '%a %Y' . bin/run.sh secret empty && readlink run"); got !=
		"bin\nempty\nrun\nsecret\nran\n750 \n755 1500000000\n600 1500000000\n700 1500000000\nbin/run.sh\n" &&
		!strings.HasPrefix(got, "bin\nempty\nrun\nsecret\nran\n750 ") {
		t.Errorf("uploaded tree: %q", got)
	}
	if got := sh("stat -c '%a %Y' up/bin/run.sh up/secret up/empty"); got != "755 1500000000\n600 1500000000\n700 1500000000\n" {
		t.Errorf("modes and times: %q", got)
	}
	if code, _, errs := cp("", src, id+":"+root+"/up"); code != 0 {
		t.Fatalf("cp dir into an existing dir: %d %s", code, errs)
	}
	if got := sh("ls -A up/src"); got != "bin\nempty\nrun\nsecret\n" {
		t.Errorf("into an existing directory: %q", got)
	}
	want := treeOf(t, src)
	os.WriteFile(filepath.Join(src, "added"), []byte("new\n"), 0o644)
	if code, _, errs := cp("", src+"/.", id+":"+root+"/up"); code != 0 {
		t.Fatalf("cp SRC/. : %d %s", code, errs)
	}
	if got := sh("cat up/added; ls -A up | wc -l"); got != "new\n6\n" {
		t.Errorf("SRC/. merge: %q", got)
	}

	// Down: a new DST, an existing one, and SRC/.
	outDir := t.TempDir()
	if code, _, errs := cp("", id+":"+root+"/up", filepath.Join(outDir, "new")); code != 0 {
		t.Fatalf("cp dir down: %d %s", code, errs)
	}
	if got := treeOf(t, filepath.Join(outDir, "new", "src")); got != want {
		t.Errorf("downloaded tree:\n%s\nwant:\n%s", got, want)
	}
	if code, _, errs := cp("", id+":"+root+"/up/src", outDir); code != 0 {
		t.Fatalf("cp dir down into a dir: %d %s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(outDir, "src", "bin", "run.sh")); err != nil {
		t.Errorf("into an existing local directory: %v", err)
	}

	// -: a tar stream on stdin and stdout.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "./piped/x.txt", Typeflag: tar.TypeReg, Mode: 0o640, Size: 6})
	tw.Write([]byte("piped\n"))
	tw.Close()
	sh("mkdir -p tarin")
	if code, _, errs := cp(tb.String(), "-", id+":"+root+"/tarin"); code != 0 {
		t.Fatalf("cp - DIR: %d %s", code, errs)
	}
	if got := sh("cat tarin/piped/x.txt; stat -c %a tarin/piped/x.txt"); got != "piped\n640\n" {
		t.Errorf("tar from stdin: %q", got)
	}
	code, out, errs := cp("", id+":"+root+"/tarin", "-")
	if code != 0 {
		t.Fatalf("cp DIR -: %d %s", code, errs)
	}
	var names []string
	tr := tar.NewReader(strings.NewReader(out))
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if got := strings.Join(names, " "); got != "tarin/ tarin/piped/ tarin/piped/x.txt" {
		t.Errorf("tar on stdout: %q", got)
	}

	// A hostile archive is refused, naming the entry, and leaves nothing.
	tb.Reset()
	tw = tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.WriteHeader(&tar.Header{Name: "../escape.txt", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	code, _, errs = cp(tb.String(), "-", id+":"+root+"/tarin")
	if code != 1 || !strings.Contains(errs, `"../escape.txt"`) || !strings.Contains(errs, "(invalid argument)") {
		t.Errorf("hostile tar: %d %q", code, errs)
	}
	if got := sh("ls -A tarin; ls -A .. | grep -c escape || true"); got != "piped\n0\n" {
		t.Errorf("a refused archive left something: %q", got)
	}

	// Files keep working, and go into a directory named by DST.
	f := filepath.Join(t.TempDir(), "one.txt")
	os.WriteFile(f, []byte("one"), 0o644)
	if code, _, errs := cp("", f, id+":"+root+"/up/"); code != 0 {
		t.Fatalf("cp file DIR/: %d %s", code, errs)
	}
	if code, _, errs := cp("", f, id+":"+root+"/tarin"); code != 0 {
		t.Fatalf("cp file DIR: %d %s", code, errs)
	}
	if got := sh("cat up/one.txt tarin/one.txt"); got != "oneone" {
		t.Errorf("file into directories: %q", got)
	}
	if code, _, errs := cp("", id+":"+root+"/up/one.txt", outDir); code != 0 {
		t.Fatalf("cp file down into a dir: %d %s", code, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(outDir, "one.txt")); string(b) != "one" {
		t.Errorf("file down into a directory: %q", b)
	}
	// A symlink SRC is followed, both ways.
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(src, link)
	if code, _, errs := cp("", link, id+":"+root+"/vialink"); code != 0 {
		t.Fatalf("cp symlink-to-dir up: %d %s", code, errs)
	}
	if got := sh("cat vialink/secret"); got != "s" {
		t.Errorf("via a local symlink: %q", got)
	}
	sh("ln -s up/src remotelink")
	if code, _, errs := cp("", id+":"+root+"/remotelink", filepath.Join(outDir, "vialink")); code != 0 {
		t.Fatalf("cp symlink-to-dir down: %d %s", code, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(outDir, "vialink", "secret")); string(b) != "s" {
		t.Errorf("via a sandbox symlink: %q", b)
	}

	// A directory onto a file is refused.
	if code, _, errs := cp("", src, id+":"+root+"/up/one.txt"); code != 1 || !strings.Contains(errs, "not a directory") {
		t.Errorf("dir onto a file: %d %q", code, errs)
	}
}
