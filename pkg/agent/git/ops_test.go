package git

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// sourceRepo makes a bare repository with three commits on main and one
// more on dev, and returns its path and the tips of main and dev.
func sourceRepo(t *testing.T) (bare, mainTip, devTip string) {
	t.Helper()
	src := newRepo(t)
	for i := 1; i <= 3; i++ {
		write(t, src, "f.txt", lines("v"+strconv.Itoa(i), 3))
		mainTip = commitAll(t, src, "main "+strconv.Itoa(i))
	}
	mustGit(t, src, "checkout", "-q", "-b", "dev")
	write(t, src, "dev.txt", "dev\n")
	devTip = commitAll(t, src, "dev")
	mustGit(t, src, "checkout", "-q", "main")
	bare = filepath.Join(t.TempDir(), "src.git")
	mustGit(t, src, "clone", "-q", "--bare", src, bare)
	return bare, mainTip, devTip
}

func TestClone(t *testing.T) {
	t.Parallel()
	bare, mainTip, devTip := sourceRepo(t)
	ws := t.TempDir()
	g := New(Config{WorkDir: ws})
	ctx := context.Background()

	// Shallow, one branch, over file://.
	dst := filepath.Join(ws, "shallow")
	res, err := g.Clone(ctx, CloneOptions{URL: "file://" + bare, Dir: dst, Branch: "dev", Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res != (CloneResult{Dir: dst, Head: devTip, Branch: "dev"}) {
		t.Errorf("clone = %+v", res)
	}
	if n := strings.TrimSpace(mustGit(t, dst, "rev-list", "--count", "HEAD")); n != "1" {
		t.Errorf("shallow clone has %s commits", n)
	}
	if s := strings.TrimSpace(mustGit(t, dst, "rev-parse", "--is-shallow-repository")); s != "true" {
		t.Errorf("is-shallow = %s", s)
	}

	// Full clone of a local path into the default directory.
	res, err = g.Clone(ctx, CloneOptions{URL: bare})
	if err != nil {
		t.Fatal(err)
	}
	if res != (CloneResult{Dir: filepath.Join(ws, "src"), Head: mainTip, Branch: "main"}) {
		t.Errorf("clone = %+v", res)
	}
	if n := strings.TrimSpace(mustGit(t, res.Dir, "rev-list", "--count", "HEAD")); n != "3" {
		t.Errorf("full clone has %s commits", n)
	}
	st, err := g.Status(ctx, res.Dir)
	if err != nil || st.Upstream != "origin/main" || st.Ahead != 0 || st.Behind != 0 {
		t.Errorf("status of clone = %+v, %v", st, err)
	}

	_, err = g.Clone(ctx, CloneOptions{URL: bare, Dir: res.Dir})
	wantErr(t, "clone into non-empty dir", err, errdefs.IsAlreadyExists, res.Dir)

	missing := filepath.Join(ws, "missing")
	_, err = g.Clone(ctx, CloneOptions{URL: filepath.Join(ws, "nope.git"), Dir: missing})
	wantErr(t, "clone of missing repo", err, errdefs.IsNotFound)
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("failed clone left %s behind: %v", missing, err)
	}
	_, err = g.Clone(ctx, CloneOptions{URL: "file://" + bare, Dir: missing, Branch: "nope"})
	wantErr(t, "clone of missing branch", err, errdefs.IsNotFound, "nope")
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("failed clone left %s behind: %v", missing, err)
	}

	for name, opts := range map[string]CloneOptions{
		"url":    {URL: "--upload-pack=touch /tmp/pwned", Dir: missing},
		"url ":   {Dir: missing},
		"branch": {URL: bare, Dir: missing, Branch: "-b"},
		"depth":  {URL: bare, Dir: missing, Depth: -1},
		"dir":    {URL: bare, Dir: "relative/dir"},
	} {
		_, err := g.Clone(ctx, opts)
		wantErr(t, "clone with bad "+name, err, errdefs.IsInvalidArgument, strings.TrimSpace(name))
	}
}

func TestHumanish(t *testing.T) {
	for in, want := range map[string]string{
		"https://github.com/org/repo.git":  "repo",
		"https://github.com/org/repo/":     "repo",
		"git@github.com:org/repo.git":      "repo",
		"/srv/git/project.git":             "project",
		"/srv/git/project/.git":            "project",
		"file:///srv/x.bundle":             "x",
		"https://host/":                    "",
		"ssh://user@host:22/path/to/thing": "thing",
	} {
		if got := humanish(in); got != want {
			t.Errorf("humanish(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckout(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "f.txt", "1\n")
	first := commitAll(t, dir, "one")
	write(t, dir, "f.txt", "2\n")
	second := commitAll(t, dir, "two")
	g := New(Config{WorkDir: dir})
	ctx := context.Background()

	res, err := g.Checkout(ctx, "", "feature", true, "")
	if err != nil || res != (CheckoutResult{Branch: "feature", Head: second}) {
		t.Fatalf("create feature = %+v, %v", res, err)
	}
	_, err = g.Checkout(ctx, "", "feature", true, "")
	wantErr(t, "create existing", err, errdefs.IsAlreadyExists, "feature")
	res, err = g.Checkout(ctx, "", "main", false, "")
	if err != nil || res != (CheckoutResult{Branch: "main", Head: second}) {
		t.Fatalf("switch to main = %+v, %v", res, err)
	}
	res, err = g.Checkout(ctx, dir, "old", true, "HEAD~1")
	if err != nil || res != (CheckoutResult{Branch: "old", Head: first}) {
		t.Fatalf("create old at HEAD~1 = %+v, %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f.txt")); string(b) != "1\n" {
		t.Errorf("work tree not switched: f.txt = %q", b)
	}

	for _, bad := range []string{"a..b", "bad name", "-x", "--orphan", "x\ny", "end.lock", ""} {
		_, err := g.Checkout(ctx, "", bad, true, "")
		wantErr(t, "branch "+strconvQuote(bad), err, errdefs.IsInvalidArgument, "branch")
	}
	_, err = g.Checkout(ctx, "", "nope", false, "")
	wantErr(t, "switch to unknown", err, errdefs.IsNotFound, "nope")
	_, err = g.Checkout(ctx, "", "new", true, "nope")
	wantErr(t, "unknown start point", err, errdefs.IsNotFound, "start_point")
	_, err = g.Checkout(ctx, "", "new", true, "-p")
	wantErr(t, "option start point", err, errdefs.IsInvalidArgument, "start_point")

	// Local changes that a switch would overwrite.
	write(t, dir, "f.txt", "dirty\n")
	_, err = g.Checkout(ctx, "", "main", false, "")
	wantErr(t, "dirty switch", err, errdefs.IsFailedPrecondition, "overwritten")

	// A branch in a repository without commits.
	empty := newRepo(t)
	res, err = g.Checkout(ctx, empty, "fresh", true, "")
	if err != nil || res != (CheckoutResult{Branch: "fresh"}) {
		t.Errorf("create in empty repo = %+v, %v", res, err)
	}
}

func strconvQuote(s string) string { return strconv.Quote(s) }

func TestCommitAndLog(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "base.txt", "base\n")
	write(t, dir, "doomed.txt", "doomed\n")
	base := commitAll(t, dir, "base")
	g := New(Config{WorkDir: dir})
	ctx := context.Background()

	// Paths: only the named file is committed.
	write(t, dir, "one.txt", "1\n")
	write(t, dir, "two.txt", "2\n")
	h1, err := g.Commit(ctx, CommitOptions{Message: "add one", Paths: []string{"one.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if files := strings.Fields(mustGit(t, dir, "show", "--name-only", "--format=", h1)); len(files) != 1 || files[0] != "one.txt" {
		t.Errorf("commit with paths contains %v", files)
	}
	// Without configuration, the default identity commits.
	if who := strings.TrimSpace(mustGit(t, dir, "log", "-1", "--format=%an <%ae>|%cn <%ce>")); who != "berth <berth@localhost>|berth <berth@localhost>" {
		t.Errorf("identity = %q", who)
	}

	// All: modifications, deletions and untracked files, with an author.
	if err := removeFile(dir, "doomed.txt"); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "base.txt", "changed\n")
	h2, err := g.Commit(ctx, CommitOptions{Message: "everything\n\nwith a body\n", All: true, AuthorName: "Alice", AuthorEmail: "alice@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := g.Status(ctx, ""); len(st.Files) != 0 {
		t.Errorf("after commit --all: %+v", st.Files)
	}
	if who := strings.TrimSpace(mustGit(t, dir, "log", "-1", "--format=%an <%ae>|%cn <%ce>")); who != "Alice <alice@example.com>|berth <berth@localhost>" {
		t.Errorf("identity = %q", who)
	}

	_, err = g.Commit(ctx, CommitOptions{Message: "nothing"})
	wantErr(t, "nothing to commit", err, errdefs.IsFailedPrecondition, "nothing to commit")
	h3, err := g.Commit(ctx, CommitOptions{Message: "empty", AllowEmpty: true})
	if err != nil {
		t.Fatal(err)
	}

	// A configured identity wins over the default.
	mustGit(t, dir, "config", "user.name", "Configured")
	mustGit(t, dir, "config", "user.email", "conf@example.com")
	write(t, dir, "three.txt", "3\n")
	h4, err := g.Commit(ctx, CommitOptions{Message: "three", Paths: []string{filepath.Join(dir, "three.txt")}})
	if err != nil {
		t.Fatal(err)
	}
	if who := strings.TrimSpace(mustGit(t, dir, "log", "-1", "--format=%an <%ae>")); who != "Configured <conf@example.com>" {
		t.Errorf("identity = %q", who)
	}

	log, err := g.Log(ctx, "", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	wantHashes := []string{h4, h3, h2, h1, base}
	if len(log) != len(wantHashes) {
		t.Fatalf("log has %d commits, want %d", len(log), len(wantHashes))
	}
	for i, c := range log {
		if c.Hash != wantHashes[i] {
			t.Errorf("log[%d] = %s, want %s", i, c.Hash, wantHashes[i])
		}
		if i+1 < len(log) && (len(c.Parents) != 1 || c.Parents[0] != wantHashes[i+1]) {
			t.Errorf("log[%d] parents = %v", i, c.Parents)
		}
		if time.Since(c.Time) > time.Minute || time.Since(c.Time) < -time.Minute {
			t.Errorf("log[%d] time = %v", i, c.Time)
		}
	}
	if len(log[4].Parents) != 0 {
		t.Errorf("root commit parents = %v", log[4].Parents)
	}
	if c := log[2]; c.Subject != "everything" || c.AuthorName != "Alice" || c.AuthorEmail != "alice@example.com" {
		t.Errorf("log[2] = %+v", c)
	}

	log, err = g.Log(ctx, dir, h2, 2)
	if err != nil || len(log) != 2 || log[0].Hash != h2 || log[1].Hash != h1 {
		t.Errorf("log from h2, limit 2 = %+v, %v", log, err)
	}
	_, err = g.Log(ctx, "", "nope", 0)
	wantErr(t, "log of unknown ref", err, errdefs.IsNotFound, "ref")
	_, err = g.Log(ctx, "", "--all", 0)
	wantErr(t, "log of option ref", err, errdefs.IsInvalidArgument, "ref")
	_, err = g.Log(ctx, "", "", -1)
	wantErr(t, "negative limit", err, errdefs.IsInvalidArgument, "limit")

	_, err = g.Commit(ctx, CommitOptions{Message: " \n"})
	wantErr(t, "blank message", err, errdefs.IsInvalidArgument, "message")
	_, err = g.Commit(ctx, CommitOptions{Message: "m", Paths: []string{"missing.txt"}})
	wantErr(t, "missing path", err, errdefs.IsNotFound, "missing.txt")
	_, err = g.Commit(ctx, CommitOptions{Message: "m", Paths: []string{"../up"}})
	wantErr(t, "escaping path", err, errdefs.IsInvalidArgument, "paths[0]")
	_, err = g.Commit(ctx, CommitOptions{Message: "m", AuthorName: "Eve <x>"})
	wantErr(t, "bad author", err, errdefs.IsInvalidArgument, "author_name")
}

func TestLogAndCommitNoCommits(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	g := New(Config{})
	ctx := context.Background()
	log, err := g.Log(ctx, dir, "", 5)
	if err != nil || len(log) != 0 {
		t.Fatalf("log of empty repo = %v, %v", log, err)
	}
	_, err = g.Commit(ctx, CommitOptions{Repo: dir, Message: "nothing"})
	wantErr(t, "nothing to commit", err, errdefs.IsFailedPrecondition, "nothing to commit")
	write(t, dir, "f.txt", "f\n")
	h, err := g.Commit(ctx, CommitOptions{Repo: dir, Message: "root", All: true})
	if err != nil {
		t.Fatal(err)
	}
	log, err = g.Log(ctx, dir, "", 2000)
	if err != nil || len(log) != 1 || log[0].Hash != h || len(log[0].Parents) != 0 || log[0].Subject != "root" {
		t.Fatalf("log = %+v, %v", log, err)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	requireGit(t)
	ctx := context.Background()
	notRepo := t.TempDir()
	g := New(Config{})

	_, err := g.Status(ctx, notRepo)
	wantErr(t, "status of non-repo", err, errdefs.IsFailedPrecondition, notRepo+" is not a git repository")
	_, err = g.Diff(ctx, DiffOptions{Repo: notRepo})
	wantErr(t, "diff of non-repo", err, errdefs.IsFailedPrecondition, "is not a git repository")
	_, err = g.Diff(ctx, DiffOptions{Repo: notRepo, File: "x"})
	wantErr(t, "file diff of non-repo", err, errdefs.IsFailedPrecondition, "is not a git repository")
	_, err = g.Log(ctx, notRepo, "", 0)
	wantErr(t, "log of non-repo", err, errdefs.IsFailedPrecondition, "is not a git repository")
	_, err = g.Commit(ctx, CommitOptions{Repo: notRepo, Message: "m", All: true})
	wantErr(t, "commit in non-repo", err, errdefs.IsFailedPrecondition, "is not a git repository")
	_, err = g.Checkout(ctx, notRepo, "b", true, "")
	wantErr(t, "checkout in non-repo", err, errdefs.IsFailedPrecondition, "is not a git repository")

	_, err = g.Status(ctx, "relative/repo")
	wantErr(t, "relative repo", err, errdefs.IsInvalidArgument, "repo")
	_, err = g.Status(ctx, "")
	wantErr(t, "no repo, no default", err, errdefs.IsInvalidArgument, "repo")
	_, err = g.Status(ctx, filepath.Join(notRepo, "missing"))
	wantErr(t, "missing repo", err, errdefs.IsNotFound, "missing")
	write(t, notRepo, "file", "x")
	_, err = g.Status(ctx, filepath.Join(notRepo, "file"))
	wantErr(t, "file as repo", err, errdefs.IsFailedPrecondition, "not a git repository")

	bare := filepath.Join(t.TempDir(), "b.git")
	mustGit(t, notRepo, "init", "-q", "--bare", bare)
	_, err = g.Status(ctx, bare)
	wantErr(t, "status of bare repo", err, errdefs.IsFailedPrecondition, "work tree")

	repo := newRepo(t)
	write(t, repo, "f", "f\n")
	commitAll(t, repo, "one")
	for _, ref := range []string{"nope", "HEAD~5", "main:f"} {
		_, err = g.Diff(ctx, DiffOptions{Repo: repo, Ref: ref})
		wantErr(t, "diff ref "+ref, err, errdefs.IsNotFound, "ref")
	}
	for _, ref := range []string{"-p", "--output=/tmp/x", "a\nb"} {
		_, err = g.Diff(ctx, DiffOptions{Repo: repo, Ref: ref})
		wantErr(t, "diff ref "+strconv.Quote(ref), err, errdefs.IsInvalidArgument, "ref")
	}

	missing := New(Config{Binary: filepath.Join(t.TempDir(), "no-git")})
	if missing.Available() {
		t.Error("Available with a missing binary")
	}
	if !g.Available() {
		t.Error("not Available with git installed")
	}
	_, err = missing.Status(ctx, repo)
	wantErr(t, "git missing", err, errdefs.IsFailedPrecondition, "git is not installed in this sandbox image")
	_, err = missing.Clone(ctx, CloneOptions{URL: repo, Dir: filepath.Join(t.TempDir(), "c")})
	wantErr(t, "git missing (clone)", err, errdefs.IsFailedPrecondition, "git is not installed")
	_, err = New(Config{Binary: "no-such-git-binary"}).Log(ctx, repo, "", 0)
	wantErr(t, "git not in PATH", err, errdefs.IsFailedPrecondition, "git is not installed")
}

// fakeGit writes a script that starts a long sleep in the background, records
// its pid, and waits: a git that hangs, with a grandchild.
func fakeGit(t *testing.T) (bin, pidFile string) {
	t.Helper()
	d := t.TempDir()
	bin, pidFile = filepath.Join(d, "git"), filepath.Join(d, "pid")
	script := "#!/bin/sh\nsleep 30 &\necho $! > " + pidFile + "\nwait\n"
	testenv.WriteExecutable(t, bin, []byte(script))
	return bin, pidFile
}

// gone reports whether pid has exited (or is a zombie awaiting its reaper).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(s[i+1:], " Z")
}

func waitGone(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("fake git did not start its child: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if gone(pid) {
			return
		}
	}
	t.Errorf("git's child %d survived the cancellation", pid)
}

func TestCancelKillsProcessGroup(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		testenv.SkipOrFail(t, "needs /proc")
	}
	repo := t.TempDir()

	// The context ends once the fake git has started its child (not after
	// a fixed time a loaded machine can outlast before the child exists).
	bin, pidFile := fakeGit(t)
	g := New(Config{Binary: bin})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			if _, err := os.Stat(pidFile); err == nil {
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	_, err := g.Status(ctx, repo)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 30*time.Second {
		t.Errorf("status with cancelled ctx: %v after %v", err, time.Since(start))
	}
	waitGone(t, pidFile)

	bin, pidFile = fakeGit(t)
	// Timeout is wide enough for the script to start its child on a
	// loaded machine, and well under the child's 30 s.
	g = New(Config{Binary: bin, Timeout: 3 * time.Second})
	_, err = g.Log(context.Background(), repo, "", 0)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("log past Timeout: %v", err)
	}
	waitGone(t, pidFile)
}

func TestOutputLimit(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "big.txt", strings.Repeat("x\n", 1000))
	commitAll(t, dir, "big")
	write(t, dir, "big.txt", strings.Repeat("y\n", 1000))
	g := New(Config{MaxOutputBytes: 1000})
	_, err := g.Diff(context.Background(), DiffOptions{Repo: dir})
	wantErr(t, "big diff", err, errdefs.IsResourceExhausted, "1000 bytes")
	_, err = g.Diff(context.Background(), DiffOptions{Repo: dir, File: "big.txt"})
	wantErr(t, "big file", err, errdefs.IsResourceExhausted, "1000 bytes")
}
