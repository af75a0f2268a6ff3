package git

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestDiffUnifiedMixed(t *testing.T) {
	t.Parallel()
	dir, first, _ := mixedRepo(t)
	g := New(Config{WorkDir: dir})
	ctx := context.Background()

	d, err := g.Diff(ctx, DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := expectedUnified(t, dir, "HEAD"); d.Unified != want {
		t.Errorf("unified diff differs from git's:\n--- got\n%s\n--- want\n%s", d.Unified, want)
	}
	for _, s := range []string{
		"rename from old.txt", "rename to new.txt",
		"Binary files a/bin.dat and b/bin.dat differ",
		"Binary files a/data.gen and b/data.gen differ",
		"diff --git a/dir/untracked file.txt b/dir/untracked file.txt\nnew file mode 100644",
		"+untracked\n", "-a1\n+a2\n", "+++ b/héllo.txt",
	} {
		if !strings.Contains(d.Unified, s) {
			t.Errorf("unified diff lacks %q", s)
		}
	}
	if strings.Contains(d.Unified, "ignored.log") {
		t.Error("unified diff includes an ignored file")
	}
	if d.Path != "" || d.Kind != KindUnspecified || d.Binary {
		t.Errorf("unified diff has file fields: %+v", d)
	}

	// Against an older commit.
	d, err = g.Diff(ctx, DiffOptions{Ref: first})
	if err != nil {
		t.Fatal(err)
	}
	if want := expectedUnified(t, dir, first); d.Unified != want {
		t.Errorf("diff against %s differs from git's", first)
	}
	// The index is untouched: diffing wrote nothing to .git/index.
	before, _ := os.Stat(filepath.Join(dir, ".git/index"))
	if _, err := g.Diff(ctx, DiffOptions{}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(filepath.Join(dir, ".git/index"))
	if !before.ModTime().Equal(after.ModTime()) || before.Size() != after.Size() {
		t.Error("Diff modified the index")
	}
}

// TestDiffUnifiedApplies applies the unified diff to a clean checkout of
// HEAD with `git apply` and expects the work tree back.
func TestDiffUnifiedApplies(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "a.txt", lines("a", 10))
	write(t, dir, "old.txt", lines("old", 20))
	write(t, dir, "del.txt", "delete me\n")
	write(t, dir, "with space.txt", "space\n")
	write(t, dir, "ünï.txt", "unicode\n")
	commitAll(t, dir, "base")

	write(t, dir, "a.txt", strings.Replace(lines("a", 10), "a line 5\n", "changed\n", 1))
	mustGit(t, dir, "mv", "old.txt", "new.txt")
	write(t, dir, "new.txt", lines("old", 20)+"one more\n")
	if err := removeFile(dir, "del.txt"); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "with space.txt", "space 2\n")
	write(t, dir, "ünï.txt", "unicode 2\n")
	write(t, dir, "sub dir/untracked.txt", "brand new\n")
	write(t, dir, "noeol.txt", "no newline at end")
	write(t, dir, "empty.txt", "")
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	d, err := New(Config{}).Diff(context.Background(), DiffOptions{Repo: dir})
	if err != nil {
		t.Fatal(err)
	}
	copyDir := filepath.Join(t.TempDir(), "copy")
	mustGit(t, filepath.Dir(copyDir), "clone", "-q", dir, copyDir)
	patch := filepath.Join(t.TempDir(), "p.diff")
	if err := os.WriteFile(patch, []byte(d.Unified), 0o644); err != nil {
		t.Fatal(err)
	}
	mustGit(t, copyDir, "apply", patch)
	if got, want := tree(t, copyDir), tree(t, dir); !reflect.DeepEqual(got, want) {
		t.Errorf("applying the diff gives\n%v\nwant\n%v\npatch:\n%s", got, want, d.Unified)
	}
	if target, err := os.Readlink(filepath.Join(copyDir, "link")); err != nil || target != "a.txt" {
		t.Errorf("symlink after apply: %q, %v", target, err)
	}
	if st, err := os.Stat(filepath.Join(copyDir, "run.sh")); err != nil || st.Mode()&0o100 == 0 {
		t.Errorf("run.sh after apply: %v, %v", st, err)
	}
}

// tree maps each file under dir (outside .git) to its content.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && e.Name() == ".git" {
			return filepath.SkipDir
		}
		if !e.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			m[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDiffFile(t *testing.T) {
	t.Parallel()
	dir, first, _ := mixedRepo(t)
	g := New(Config{WorkDir: dir})
	ctx := context.Background()
	old := lines("old", 20)
	cases := []struct {
		file, ref string
		want      Diff
	}{
		{file: "a.txt", want: Diff{Path: "a.txt", Kind: KindModified, Original: "a1\n", Modified: "a2\n"}},
		{file: "a.txt", ref: first, want: Diff{Path: "a.txt", Kind: KindModified, Original: "a\n", Modified: "a2\n"}},
		{file: "a.txt", ref: "HEAD~1", want: Diff{Path: "a.txt", Kind: KindModified, Original: "a\n", Modified: "a2\n"}},
		{file: "both.txt", want: Diff{Path: "both.txt", Kind: KindModified, Original: "both\n", Modified: "both staged and more\n"}},
		{file: "new.txt", want: Diff{Path: "new.txt", OldPath: "old.txt", Kind: KindRenamed, Original: old, Modified: old}},
		{file: "old.txt", want: Diff{Path: "new.txt", OldPath: "old.txt", Kind: KindRenamed, Original: old, Modified: old}},
		{file: "del.txt", want: Diff{Path: "del.txt", Kind: KindDeleted, Original: "delete me\n"}},
		{file: "gone.txt", want: Diff{Path: "gone.txt", Kind: KindDeleted, Original: "gone\n"}},
		{file: "staged.txt", want: Diff{Path: "staged.txt", Kind: KindAdded, Modified: "staged\n"}},
		{file: "with space.txt", want: Diff{Path: "with space.txt", Kind: KindModified, Original: "space\n", Modified: "space 2\n"}},
		{file: "héllo.txt", want: Diff{Path: "héllo.txt", Kind: KindModified, Original: "héllo\n", Modified: "héllo 2\n"}},
		{file: "dir/untracked file.txt", want: Diff{Path: "dir/untracked file.txt", Kind: KindUntracked, Modified: "untracked\n"}},
		{file: "new\nline.txt", want: Diff{Path: "new\nline.txt", Kind: KindUntracked, Modified: "newline\n"}},
		{file: "bin.dat", want: Diff{Path: "bin.dat", Kind: KindModified, Binary: true}},
		{file: "data.gen", want: Diff{Path: "data.gen", Kind: KindModified, Binary: true}},
		{file: "latin1.txt", want: Diff{Path: "latin1.txt", Kind: KindModified, Binary: true}},
		{file: "same.txt", want: Diff{Path: "same.txt", Kind: KindUnspecified, Original: "same\n", Modified: "same\n"}},
		{file: filepath.Join(dir, "a.txt"), want: Diff{Path: "a.txt", Kind: KindModified, Original: "a1\n", Modified: "a2\n"}},
		{file: "./dir/../a.txt", want: Diff{Path: "a.txt", Kind: KindModified, Original: "a1\n", Modified: "a2\n"}},
		// same.txt did not exist in the first commit.
		{file: "same.txt", ref: first, want: Diff{Path: "same.txt", Kind: KindAdded, Modified: "same\n"}},
	}
	for _, c := range cases {
		d, err := g.Diff(ctx, DiffOptions{File: c.file, Ref: c.ref})
		if err != nil {
			t.Errorf("Diff(%q, ref %q): %v", c.file, c.ref, err)
			continue
		}
		if d != c.want {
			t.Errorf("Diff(%q, ref %q) =\n %+v\nwant\n %+v", c.file, c.ref, d, c.want)
		}
	}

	_, err := g.Diff(ctx, DiffOptions{File: "missing.txt"})
	wantErr(t, "missing file", err, errdefs.IsNotFound, "missing.txt")
	_, err = g.Diff(ctx, DiffOptions{File: "ignored.log"})
	wantErr(t, "ignored file", err, errdefs.IsNotFound, "ignored.log")
	_, err = g.Diff(ctx, DiffOptions{File: "../outside.txt"})
	wantErr(t, "file outside", err, errdefs.IsInvalidArgument, "file")
	_, err = g.Diff(ctx, DiffOptions{File: "/etc/passwd"})
	wantErr(t, "absolute file outside", err, errdefs.IsInvalidArgument, "file")
	_, err = g.Diff(ctx, DiffOptions{File: "."})
	wantErr(t, "file = .", err, errdefs.IsInvalidArgument, "file")
}

func TestDiffNoCommits(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "staged.txt", "s\n")
	mustGit(t, dir, "add", "staged.txt")
	write(t, dir, "untracked.txt", "u\n")
	g := New(Config{})
	ctx := context.Background()
	d, err := g.Diff(ctx, DiffOptions{Repo: dir})
	if err != nil {
		t.Fatal(err)
	}
	emptyTree := strings.TrimSpace(mustGit(t, dir, "hash-object", "-t", "tree", "/dev/null"))
	if want := expectedUnified(t, dir, emptyTree); d.Unified != want {
		t.Errorf("unified = %q, want %q", d.Unified, want)
	}
	if !strings.Contains(d.Unified, "+s\n") || !strings.Contains(d.Unified, "+u\n") {
		t.Errorf("unified lacks the new files: %q", d.Unified)
	}
	d, err = g.Diff(ctx, DiffOptions{Repo: dir, File: "staged.txt"})
	if err != nil || d != (Diff{Path: "staged.txt", Kind: KindAdded, Modified: "s\n"}) {
		t.Errorf("file diff = %+v, %v", d, err)
	}
	d, err = g.Diff(ctx, DiffOptions{Repo: dir, File: "untracked.txt"})
	if err != nil || d != (Diff{Path: "untracked.txt", Kind: KindUntracked, Modified: "u\n"}) {
		t.Errorf("file diff = %+v, %v", d, err)
	}
	_, err = g.Diff(ctx, DiffOptions{Repo: dir, Ref: "main"})
	wantErr(t, "unknown ref in empty repo", err, errdefs.IsNotFound, "ref")
}

func TestConflict(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "c.txt", "a\nb\n")
	commitAll(t, dir, "base")
	mustGit(t, dir, "checkout", "-q", "-b", "side")
	write(t, dir, "c.txt", "a\nSIDE\n")
	commitAll(t, dir, "side")
	mustGit(t, dir, "checkout", "-q", "main")
	write(t, dir, "c.txt", "a\nMAIN\n")
	commitAll(t, dir, "main")
	if _, code := runGit(t, dir, "merge", "-q", "side"); code == 0 {
		t.Fatal("merge did not conflict")
	}
	g := New(Config{WorkDir: dir})
	ctx := context.Background()

	st, err := g.Status(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Files) != 1 || st.Files[0].Path != "c.txt" || st.Files[0].Kind != KindConflicted {
		t.Errorf("files = %+v", st.Files)
	}
	compareWithPorcelainV1(t, dir, st)

	d, err := g.Diff(ctx, DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := expectedUnified(t, dir, "HEAD"); d.Unified != want {
		t.Errorf("unified = %q, want %q", d.Unified, want)
	}
	d, err = g.Diff(ctx, DiffOptions{File: "c.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind != KindConflicted || d.Original != "a\nMAIN\n" || !strings.Contains(d.Modified, "<<<<<<< HEAD\nMAIN\n=======\nSIDE\n>>>>>>> side\n") {
		t.Errorf("conflicted file diff = %+v", d)
	}
	_, err = g.Commit(ctx, CommitOptions{Message: "try"})
	wantErr(t, "commit with conflicts", err, errdefs.IsFailedPrecondition, "conflict")
}

func TestParseRaw(t *testing.T) {
	out := ":100644 100644 aaaa 0000 M\x00a b.txt\x00:100644 100644 bbbb 0000 R090\x00old\x00new\x00:000000 100644 0000 0000 A\x00n\x00"
	got, err := parseRaw([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []rawEntry{
		{srcMode: "100644", dstMode: "100644", srcOID: "aaaa", dstOID: "0000", status: 'M', dst: "a b.txt"},
		{srcMode: "100644", dstMode: "100644", srcOID: "bbbb", dstOID: "0000", status: 'R', src: "old", dst: "new"},
		{srcMode: "000000", dstMode: "100644", srcOID: "0000", dstOID: "0000", status: 'A', dst: "n"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseRaw = %+v", got)
	}
	if _, err := parseRaw([]byte(":100644 100644 aaaa 0000 R090\x00old\x00")); err == nil {
		t.Error("truncated rename parsed")
	}
}

func TestDiffFileSymlinkAndTypeChange(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "a.txt", "a\n")
	write(t, dir, "f.txt", "regular\n")
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	commitAll(t, dir, "base")
	if err := os.Remove(filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "f.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "f.txt")); err != nil {
		t.Fatal(err)
	}
	g := New(Config{WorkDir: dir})
	ctx := context.Background()
	st, err := g.Status(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	compareWithPorcelainV1(t, dir, st)
	kinds := map[string]ChangeKind{}
	for _, f := range st.Files {
		kinds[f.Path] = f.Kind
	}
	if !reflect.DeepEqual(kinds, map[string]ChangeKind{"link": KindModified, "f.txt": KindTypeChanged}) {
		t.Errorf("kinds = %v", kinds)
	}
	d, err := g.Diff(ctx, DiffOptions{File: "link"})
	if err != nil || d != (Diff{Path: "link", Kind: KindModified, Original: "a.txt", Modified: "b.txt"}) {
		t.Errorf("symlink diff = %+v, %v", d, err)
	}
	d, err = g.Diff(ctx, DiffOptions{File: "f.txt"})
	if err != nil || d != (Diff{Path: "f.txt", Kind: KindTypeChanged, Original: "regular\n", Modified: "a.txt"}) {
		t.Errorf("type change diff = %+v, %v", d, err)
	}
}
