package git

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// mixedRepo builds a repository with one change of every common kind:
//
//	a.txt               modified, unstaged
//	both.txt            modified, staged and again unstaged
//	old.txt → new.txt   renamed with git mv (staged)
//	del.txt             deleted, unstaged
//	gone.txt            deleted, staged (git rm)
//	staged.txt          added, staged
//	with space.txt      modified
//	héllo.txt           modified (unicode path)
//	bin.dat             binary, modified
//	data.gen            text marked binary in .gitattributes, modified
//	latin1.txt          not UTF-8, modified
//	dir/untracked file.txt, new\nline.txt   untracked
//	ignored.log         ignored (must not appear)
//	same.txt            unchanged
func mixedRepo(t *testing.T) (dir, first, second string) {
	t.Helper()
	dir = newRepo(t)
	write(t, dir, "a.txt", "a\n")
	first = commitAll(t, dir, "first")
	write(t, dir, "a.txt", "a1\n")
	write(t, dir, "both.txt", "both\n")
	write(t, dir, "old.txt", lines("old", 20))
	write(t, dir, "del.txt", "delete me\n")
	write(t, dir, "gone.txt", "gone\n")
	write(t, dir, "with space.txt", "space\n")
	write(t, dir, "héllo.txt", "héllo\n")
	write(t, dir, "bin.dat", "\x00\x01\x02binary")
	write(t, dir, "data.gen", "generated\n")
	write(t, dir, "latin1.txt", "caf\xe9\n")
	write(t, dir, "same.txt", "same\n")
	write(t, dir, ".gitattributes", "*.gen binary\n")
	write(t, dir, ".gitignore", "*.log\n")
	second = commitAll(t, dir, "second")

	write(t, dir, "a.txt", "a2\n")
	write(t, dir, "both.txt", "both staged\n")
	mustGit(t, dir, "add", "both.txt")
	write(t, dir, "both.txt", "both staged and more\n")
	mustGit(t, dir, "mv", "old.txt", "new.txt")
	mustGit(t, dir, "rm", "-q", "gone.txt")
	if err := removeFile(dir, "del.txt"); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "staged.txt", "staged\n")
	mustGit(t, dir, "add", "staged.txt")
	write(t, dir, "with space.txt", "space 2\n")
	write(t, dir, "héllo.txt", "héllo 2\n")
	write(t, dir, "bin.dat", "\x00\x01\x02binary2")
	write(t, dir, "data.gen", "generated 2\n")
	write(t, dir, "latin1.txt", "caf\xe9 2\n")
	write(t, dir, "dir/untracked file.txt", "untracked\n")
	write(t, dir, "new\nline.txt", "newline\n")
	write(t, dir, "ignored.log", "ignored\n")
	return dir, first, second
}

func TestStatusMixed(t *testing.T) {
	t.Parallel()
	dir, _, second := mixedRepo(t)
	g := New(Config{})
	st, err := g.Status(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Branch != "main" || st.Detached || st.Head != second || st.Upstream != "" || st.Ahead != 0 || st.Behind != 0 {
		t.Errorf("status header = %+v", st)
	}
	got := map[string]FileChange{}
	for _, f := range st.Files {
		got[f.Path] = f
	}
	want := map[string]FileChange{
		"a.txt":                  {Kind: KindModified, Unstaged: true},
		"both.txt":               {Kind: KindModified, Staged: true, Unstaged: true},
		"new.txt":                {OldPath: "old.txt", Kind: KindRenamed, Staged: true},
		"del.txt":                {Kind: KindDeleted, Unstaged: true},
		"gone.txt":               {Kind: KindDeleted, Staged: true},
		"staged.txt":             {Kind: KindAdded, Staged: true},
		"with space.txt":         {Kind: KindModified, Unstaged: true},
		"héllo.txt":              {Kind: KindModified, Unstaged: true},
		"bin.dat":                {Kind: KindModified, Unstaged: true},
		"data.gen":               {Kind: KindModified, Unstaged: true},
		"latin1.txt":             {Kind: KindModified, Unstaged: true},
		"dir/untracked file.txt": {Kind: KindUntracked, Unstaged: true},
		"new\nline.txt":          {Kind: KindUntracked, Unstaged: true},
	}
	for p, w := range want {
		w.Path = p
		if got[p] != w {
			t.Errorf("%q: got %+v, want %+v", p, got[p], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d files, want %d: %+v", len(got), len(want), st.Files)
	}
	compareWithPorcelainV1(t, dir, st)
}

// compareWithPorcelainV1 checks st against git's other porcelain format,
// parsed independently: the same paths, old paths and staged/unstaged flags.
func compareWithPorcelainV1(t *testing.T, dir string, st Status) {
	t.Helper()
	out := mustGit(t, dir, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--find-renames")
	type entry struct {
		old              string
		staged, unstaged bool
	}
	want := map[string]entry{}
	recs := strings.Split(out, "\x00")
	for i := 0; i < len(recs); i++ {
		r := recs[i]
		if r == "" {
			continue
		}
		x, y, p := r[0], r[1], r[3:]
		e := entry{staged: x != ' ' && x != '?', unstaged: y != ' '}
		if x == 'R' || x == 'C' {
			i++
			e.old = recs[i]
		}
		want[p] = e
	}
	got := map[string]entry{}
	for _, f := range st.Files {
		got[f.Path] = entry{old: f.OldPath, staged: f.Staged, unstaged: f.Unstaged}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("status differs from porcelain v1:\n got %+v\nwant %+v", got, want)
	}
}

func TestStatusNoCommits(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "staged.txt", "s\n")
	mustGit(t, dir, "add", "staged.txt")
	write(t, dir, "untracked.txt", "u\n")
	st, err := New(Config{}).Status(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	want := Status{Branch: "main", Files: []FileChange{
		{Path: "staged.txt", Kind: KindAdded, Staged: true},
		{Path: "untracked.txt", Kind: KindUntracked, Unstaged: true},
	}}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("status = %+v\nwant %+v", st, want)
	}
	compareWithPorcelainV1(t, dir, st)
}

func TestStatusDetachedAndSubdir(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "sub/f.txt", "1\n")
	first := commitAll(t, dir, "one")
	write(t, dir, "sub/f.txt", "2\n")
	commitAll(t, dir, "two")
	mustGit(t, dir, "checkout", "-q", "--detach", first)
	write(t, dir, "top.txt", "new\n")
	// Asked from a subdirectory, paths stay relative to the top level.
	st, err := New(Config{}).Status(context.Background(), dir+"/sub")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Detached || st.Branch != "" || st.Head != first {
		t.Errorf("detached status = %+v", st)
	}
	if len(st.Files) != 1 || st.Files[0].Path != "top.txt" || st.Files[0].Kind != KindUntracked {
		t.Errorf("files = %+v", st.Files)
	}
}

func TestStatusAheadBehind(t *testing.T) {
	t.Parallel()
	src := newRepo(t)
	write(t, src, "f.txt", "base\n")
	commitAll(t, src, "base")
	tmp := t.TempDir()
	bare := tmp + "/up.git"
	mustGit(t, tmp, "clone", "-q", "--bare", src, bare)
	a, b := tmp+"/a", tmp+"/b"
	mustGit(t, tmp, "clone", "-q", bare, a)
	mustGit(t, tmp, "clone", "-q", bare, b)

	write(t, a, "a.txt", "from a\n")
	commitAll(t, a, "a1")
	mustGit(t, a, "push", "-q", "origin", "main")

	write(t, b, "b.txt", "from b\n")
	commitAll(t, b, "b1")
	write(t, b, "b2.txt", "from b\n")
	commitAll(t, b, "b2")
	mustGit(t, b, "fetch", "-q")

	st, err := New(Config{}).Status(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if st.Branch != "main" || st.Upstream != "origin/main" || st.Ahead != 2 || st.Behind != 1 || len(st.Files) != 0 {
		t.Errorf("status = %+v, want main...origin/main ahead 2 behind 1", st)
	}
}

func TestParseStatusFixture(t *testing.T) {
	out := strings.Join([]string{
		"# branch.oid 1111111111111111111111111111111111111111",
		"# branch.head feature",
		"# branch.upstream origin/feature",
		"# branch.ab +3 -7",
		"1 .M N... 100644 100644 100644 aaaa aaaa a b.txt",
		"1 AM N... 000000 100644 100644 0000 bbbb added.txt",
		"1 .T N... 100644 100644 120000 cccc cccc link",
		"1 .A N... 000000 000000 100644 0000 0000 ita.txt",
		"2 R. N... 100644 100644 100644 dddd dddd R100 new name.txt", "old name.txt",
		"2 C. N... 100644 100644 100644 eeee eeee C75 copy.txt", "orig.txt",
		"u UU N... 100644 100644 100644 100644 f1 f2 f3 conflict x.txt",
		"? un tracked",
		"! ignored",
		"",
	}, "\x00")
	st, err := parseStatus([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := Status{
		Branch: "feature", Head: "1111111111111111111111111111111111111111",
		Upstream: "origin/feature", Ahead: 3, Behind: 7,
		Files: []FileChange{
			{Path: "a b.txt", Kind: KindModified, Unstaged: true},
			{Path: "added.txt", Kind: KindAdded, Staged: true, Unstaged: true},
			{Path: "link", Kind: KindTypeChanged, Unstaged: true},
			{Path: "ita.txt", Kind: KindAdded, Unstaged: true},
			{Path: "new name.txt", OldPath: "old name.txt", Kind: KindRenamed, Staged: true},
			{Path: "copy.txt", OldPath: "orig.txt", Kind: KindCopied, Staged: true},
			{Path: "conflict x.txt", Kind: KindConflicted, Staged: true, Unstaged: true},
			{Path: "un tracked", Kind: KindUntracked, Unstaged: true},
		},
	}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("parsed = %+v\nwant     %+v", st, want)
	}
	for _, bad := range []string{"1 .M short", "2 R. N... 100644 100644 100644 d d R100 p", "x what"} {
		if _, err := parseStatus([]byte(bad + "\x00")); err == nil {
			t.Errorf("parseStatus(%q) succeeded", bad)
		}
	}
}

func TestChangeKindString(t *testing.T) {
	var names []string
	for k := KindUnspecified; k <= KindTypeChanged; k++ {
		names = append(names, k.String())
	}
	sort.Strings(names)
	if len(names) != 9 || ChangeKind(42).String() != "ChangeKind(42)" || KindTypeChanged.String() != "type_changed" {
		t.Errorf("names = %v", names)
	}
}
