package archive_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/agent/files/archive"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// parallel is ExtractOptions.Parallel for the tests (TestMain runs them
// with 1 and 4).
var parallel = 1

func TestMain(m *testing.M) {
	if code := m.Run(); code != 0 {
		os.Exit(code)
	}
	parallel = 4
	os.Exit(m.Run())
}

// entry is one tar entry of a hand-made archive.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
}

func makeTar(t *testing.T, ents ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body)), ModTime: time.Unix(1_600_000_000, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// snapshot describes a tree: path -> type, mode, mtime, content or link.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v %d", fi.Mode(), fi.ModTime().Unix())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += " " + string(b)
		}
		if rel == "." {
			desc = fmt.Sprintf("%v", fi.Mode()) // the root's time changes with its entries
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diff(a, b map[string]string) string {
	var out []string
	for k, v := range a {
		if b[k] != v {
			out = append(out, fmt.Sprintf("%s: %q vs %q", k, v, b[k]))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k+": only in the second tree")
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// sampleTree makes files with modes, a symlink, a hard link, empty
// directories and old mtimes.
func sampleTree(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "empty", "deeper"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "bin", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o600))
	must(os.WriteFile(filepath.Join(dir, "readme"), []byte("hello"), 0o644))
	must(os.Link(filepath.Join(dir, "readme"), filepath.Join(dir, "bin", "readme-hard")))
	must(os.Symlink("../readme", filepath.Join(dir, "bin", "readme-link")))
	must(os.Symlink("missing", filepath.Join(dir, "dangling")))
	must(os.Mkdir(filepath.Join(dir, "ro"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "ro", "f"), nil, 0o444))
	must(os.Chmod(filepath.Join(dir, "ro"), 0o555))
	t.Cleanup(func() { os.Chmod(filepath.Join(dir, "ro"), 0o755) })
	old := time.Unix(1_500_000_000, 0)
	for _, p := range []string{"bin/run.sh", "secret", "readme", "ro/f", "empty/deeper", "empty", "bin", "ro"} {
		must(os.Chtimes(filepath.Join(dir, p), old, old))
	}
}

func roundTrip(t *testing.T, src, dst string, opts archive.ExtractOptions) archive.Result {
	if opts.Parallel == 0 {
		opts.Parallel = parallel
	}
	t.Helper()
	var buf bytes.Buffer
	if err := archive.Write(context.Background(), &buf, src, archive.WriteOptions{Name: "."}); err != nil {
		t.Fatal(err)
	}
	res, err := archive.Extract(context.Background(), dst, &buf, opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestRoundTripKeepsModesLinksTimes(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	os.Mkdir(src, 0o750)
	sampleTree(t, src)
	dst := filepath.Join(t.TempDir(), "a", "dst")
	res := roundTrip(t, src, dst, archive.ExtractOptions{CreateParents: true, Parallel: parallel})
	if !res.Created || res.Entries < 10 {
		t.Fatalf("result %+v", res)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(dst, "ro"), 0o755) })
	if d := diff(snapshot(t, src), snapshot(t, dst)); d != "" {
		t.Fatalf("trees differ:\n%s", d)
	}
	a, _ := os.Stat(filepath.Join(dst, "readme"))
	b, _ := os.Stat(filepath.Join(dst, "bin", "readme-hard"))
	if !os.SameFile(a, b) {
		t.Fatal("hard link not kept")
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), archive.StagingPrefix+"*")); len(left) > 0 {
		t.Fatalf("staging left: %v", left)
	}
}

func TestWriteNamesLikeDockerCp(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	os.MkdirAll(filepath.Join(src, "d"), 0o755)
	os.WriteFile(filepath.Join(src, "d", "f"), []byte("x"), 0o644)
	var buf bytes.Buffer
	if err := archive.Write(context.Background(), &buf, src, archive.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if got := strings.Join(names, " "); got != "src/ src/d/ src/d/f" {
		t.Fatalf("names %q", got)
	}
	if _, err := os.Stat("/nonexistent"); err == nil {
		t.Skip("/nonexistent exists on this machine")
	}
	if err := archive.Write(context.Background(), &buf, "/nonexistent/x", archive.WriteOptions{}); !os.IsNotExist(err) {
		t.Fatalf("missing source: %v", err)
	}
}

func TestMergeIntoExistingDirectory(t *testing.T) {
	dst := t.TempDir()
	os.MkdirAll(filepath.Join(dst, "src", "keep"), 0o755)
	os.WriteFile(filepath.Join(dst, "src", "old.txt"), []byte("old"), 0o644)
	os.WriteFile(filepath.Join(dst, "src", "a.txt"), []byte("before"), 0o644)
	tarb := makeTar(t,
		entry{name: "src/", typ: tar.TypeDir, mode: 0o700},
		entry{name: "src/a.txt", typ: tar.TypeReg, body: "after"},
		entry{name: "src/new/b.txt", typ: tar.TypeReg, body: "b"},
	)
	res, err := archive.Extract(context.Background(), dst, bytes.NewReader(tarb), archive.ExtractOptions{Parallel: parallel})
	if err != nil || res.Created || res.Entries != 3 {
		t.Fatalf("%+v %v", res, err)
	}
	for p, want := range map[string]string{"src/old.txt": "old", "src/a.txt": "after", "src/new/b.txt": "b"} {
		if b, _ := os.ReadFile(filepath.Join(dst, p)); string(b) != want {
			t.Errorf("%s = %q, want %q", p, b, want)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dst, "src")); fi.Mode().Perm() != 0o700 {
		t.Errorf("merged directory mode %v", fi.Mode())
	}
	if _, err := os.Stat(filepath.Join(dst, "src", "keep")); err != nil {
		t.Error("existing directory lost")
	}
	if left, _ := filepath.Glob(filepath.Join(dst, archive.StagingPrefix+"*")); len(left) > 0 {
		t.Fatalf("staging left: %v", left)
	}

	// A file over a directory is refused before anything moves.
	before := snapshot(t, dst)
	tarb = makeTar(t, entry{name: "src/z.txt", typ: tar.TypeReg, body: "z"}, entry{name: "src/keep", typ: tar.TypeReg, body: "x"})
	_, err = archive.Extract(context.Background(), dst, bytes.NewReader(tarb), archive.ExtractOptions{Parallel: parallel})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("file over directory: %v", err)
	}
	if d := diff(before, snapshot(t, dst)); d != "" {
		t.Fatalf("refused merge changed the tree:\n%s", d)
	}
}

func TestStripComponents(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "out")
	tarb := makeTar(t, entry{name: "src/", typ: tar.TypeDir, mode: 0o711}, entry{name: "src/a", typ: tar.TypeReg, body: "a"})
	if _, err := archive.Extract(context.Background(), dst, bytes.NewReader(tarb), archive.ExtractOptions{StripComponents: 1, Parallel: parallel}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a")); string(b) != "a" {
		t.Fatalf("a = %q", b)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o711 {
		t.Fatalf("mode %v", fi.Mode())
	}
}

func TestTenThousandFiles(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	body := bytes.Repeat([]byte("x"), 1024)
	for d := range 100 {
		dir := filepath.Join(src, fmt.Sprintf("d%03d", d))
		os.MkdirAll(dir, 0o755)
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", f)), body, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	dst := filepath.Join(t.TempDir(), "dst")
	start := time.Now()
	res := roundTrip(t, src, dst, archive.ExtractOptions{Parallel: parallel})
	t.Logf("10,000 files round trip: %v", time.Since(start))
	if res.Entries != 10_101 || res.Bytes != 10_000*1024 {
		t.Fatalf("result %+v", res)
	}
	if d := diff(snapshot(t, src), snapshot(t, dst)); d != "" {
		t.Fatalf("trees differ:\n%.2000s", d)
	}
}

func TestRefusedEntriesLeaveNothing(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name  string
		ents  []entry
		entry string
	}{
		{"dot-dot", []entry{{name: "ok", typ: tar.TypeReg}, {name: "../x", typ: tar.TypeReg, body: "x"}}, `"../x"`},
		{"dot-dot inside", []entry{{name: "a/../../x", typ: tar.TypeReg}}, `"a/../../x"`},
		{"absolute", []entry{{name: "/etc/x", typ: tar.TypeReg, body: "x"}}, `"/etc/x"`},
		{"through symlink", []entry{{name: "etc", typ: tar.TypeSymlink, link: "sub"}, {name: "etc/passwd", typ: tar.TypeReg, body: "x"}}, `"etc/passwd"`},
		{"absolute symlink", []entry{{name: "etc", typ: tar.TypeSymlink, link: "/etc"}}, `"etc"`},
		{"escaping symlink", []entry{{name: "a/up", typ: tar.TypeSymlink, link: "../../x"}}, `"a/up"`},
		{"climbing symlink chain", []entry{{name: "d/a/s2", typ: tar.TypeSymlink, link: ".."}, {name: "d/a/s1", typ: tar.TypeSymlink, link: "s2/../.."}}, `"d/a/s1"`},
		{"hardlink outside", []entry{{name: "h", typ: tar.TypeLink, link: "../" + filepath.Base(outside) + "/f"}}, `"h"`},
		{"hardlink absolute", []entry{{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}}, `"h"`},
		{"hardlink to unknown", []entry{{name: "h", typ: tar.TypeLink, link: "nothere"}}, `"h"`},
		{"device", []entry{{name: "null", typ: tar.TypeChar}}, `"null"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			for _, dst := range []string{filepath.Join(parent, "new"), parent} {
				_, err := archive.Extract(context.Background(), dst, bytes.NewReader(makeTar(t, tc.ents...)), archive.ExtractOptions{Parallel: parallel})
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.entry) {
					t.Fatalf("into %s: %v, want InvalidArgument naming %s", dst, err, tc.entry)
				}
				if ents, _ := os.ReadDir(parent); len(ents) != 0 {
					t.Fatalf("left behind: %v", ents)
				}
			}
		})
	}
}

func TestTruncatedArchiveLeavesNothing(t *testing.T) {
	big := strings.Repeat("y", 10_000)
	tarb := makeTar(t, entry{name: "a", typ: tar.TypeReg, body: "a"}, entry{name: "d/", typ: tar.TypeDir}, entry{name: "d/big", typ: tar.TypeReg, body: big})
	for _, cut := range []int{700, 2048, 5000, len(tarb) - 1100} {
		parent := t.TempDir()
		for _, dst := range []string{filepath.Join(parent, "new"), parent} {
			_, err := archive.Extract(context.Background(), dst, bytes.NewReader(tarb[:cut]), archive.ExtractOptions{Parallel: parallel})
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("cut at %d: %v", cut, err)
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 0 {
				t.Fatalf("cut at %d: left behind: %v", cut, ents)
			}
		}
	}
	// Not tar at all.
	_, err := archive.Extract(context.Background(), filepath.Join(t.TempDir(), "x"), strings.NewReader(strings.Repeat("garbage!", 200)), archive.ExtractOptions{Parallel: parallel})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("garbage: %v", err)
	}
}

func TestCancelledLeavesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	parent := t.TempDir()
	_, err := archive.Extract(ctx, filepath.Join(parent, "x"), bytes.NewReader(makeTar(t, entry{name: "a", typ: tar.TypeReg})), archive.ExtractOptions{Parallel: parallel})
	if err == nil {
		t.Fatal("no error")
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}

func TestTargetErrors(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o644)
	tarb := makeTar(t, entry{name: "a", typ: tar.TypeReg})
	if _, err := archive.Extract(context.Background(), f, bytes.NewReader(tarb), archive.ExtractOptions{Parallel: parallel}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("onto a file: %v", err)
	}
	if _, err := archive.Extract(context.Background(), filepath.Join(dir, "no", "dst"), bytes.NewReader(tarb), archive.ExtractOptions{Parallel: parallel}); !errdefs.IsNotFound(err) {
		t.Errorf("missing parent: %v", err)
	}
	if _, err := archive.Extract(context.Background(), "rel", bytes.NewReader(tarb), archive.ExtractOptions{Parallel: parallel}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative: %v", err)
	}
}

// Later entries of the same name replace earlier ones, as tar x does, and
// hard links see the file they name, with or without parallel writers.
func TestRepeatedEntries(t *testing.T) {
	tarb := makeTar(t,
		entry{name: "a", typ: tar.TypeReg, body: "first"},
		entry{name: "h", typ: tar.TypeLink, link: "a"},
		entry{name: "a", typ: tar.TypeReg, body: "second"},
		entry{name: "s", typ: tar.TypeSymlink, link: "a"},
		entry{name: "s", typ: tar.TypeReg, body: "file now"},
		entry{name: "l", typ: tar.TypeReg, body: "link"},
		entry{name: "l", typ: tar.TypeSymlink, link: "a"},
	)
	dst := filepath.Join(t.TempDir(), "d")
	if _, err := archive.Extract(context.Background(), dst, bytes.NewReader(tarb), archive.ExtractOptions{Parallel: parallel}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"a": "second", "h": "first", "s": "file now", "l": "second"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if fi, _ := os.Lstat(filepath.Join(dst, "l")); fi.Mode()&fs.ModeSymlink == 0 {
		t.Error("l is not a symlink")
	}
}
