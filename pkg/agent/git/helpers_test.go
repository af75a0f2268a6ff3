package git

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// TestMain isolates the tests from the host's git configuration: an empty
// HOME, no system or global config, no identity in the environment.
func TestMain(m *testing.M) {
	home, err := os.MkdirTemp("", "berth-git-home-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("HOME", home)
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	os.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	os.Setenv("GIT_CONFIG_GLOBAL", filepath.Join(home, "gitconfig"))
	for _, k := range []string{
		"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
		"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
		"GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE", "EMAIL",
	} {
		os.Unsetenv(k)
	}
	code := m.Run()
	os.RemoveAll(home)
	os.Exit(code)
}

// requireGit skips the test when no git binary is installed (fails with
// BERTH_REQUIRE_DOCKER=1: make deps installs git).
func requireGit(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		testenv.SkipOrFail(t, "git is not installed (make deps)")
	}
}

// testIdent is the identity the tests' own git commands use.
var testIdent = []string{
	"-c", "user.name=Test", "-c", "user.email=test@example.com",
	"-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main",
	"-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false",
}

// runGit runs the real git in dir and returns stdout and the exit code.
func runGit(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("git", append(append([]string{}, testIdent...), args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "GIT_PAGER=cat")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var xe *exec.ExitError
	if errors.As(err, &xe) {
		return string(out), xe.ExitCode()
	}
	if err != nil {
		t.Fatalf("git %q: %v", args, err)
	}
	return string(out), 0
}

// mustGit runs git and fails the test unless it succeeds.
func mustGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, code := runGit(t, dir, args...)
	if code != 0 {
		cmd := exec.Command("git", append(append([]string{}, testIdent...), args...)...)
		cmd.Dir = dir
		combined, _ := cmd.CombinedOutput()
		t.Fatalf("git %q in %s: exit %d: %s", args, dir, code, combined)
	}
	return out
}

// newRepo makes an empty repository on branch main.
func newRepo(t *testing.T) string {
	t.Helper()
	requireGit(t)
	dir := t.TempDir()
	mustGit(t, dir, "init", "-q", "-b", "main")
	return dir
}

// write creates or replaces a file (and its directories) under dir.
func write(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// commitAll stages everything and commits.
func commitAll(t *testing.T, dir, msg string) string {
	t.Helper()
	mustGit(t, dir, "add", "-A")
	mustGit(t, dir, "commit", "-q", "-m", msg)
	return strings.TrimSpace(mustGit(t, dir, "rev-parse", "HEAD"))
}

// lines returns n numbered lines, for files rename detection can pair.
func lines(prefix string, n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%s line %d\n", prefix, i)
	}
	return b.String()
}

// expectedUnified is what Diff's unified output must be: git diff against
// base, then one --no-index diff per untracked file.
func expectedUnified(t *testing.T, dir, base string) string {
	t.Helper()
	flags := []string{"--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/", "--dst-prefix=b/"}
	want := mustGit(t, dir, append(append([]string{"-c", "core.quotePath=false", "diff", "--find-renames"}, flags...), base, "--")...)
	for _, p := range strings.Split(mustGit(t, dir, "ls-files", "-z", "--others", "--exclude-standard"), "\x00") {
		if p == "" {
			continue
		}
		out, code := runGit(t, dir, append(append([]string{"-c", "core.quotePath=false", "diff", "--no-index"}, flags...), "--", "/dev/null", p)...)
		if code != 1 {
			t.Fatalf("git diff --no-index %q: exit %d", p, code)
		}
		want += out
	}
	return want
}

// wantErr fails unless err is in category is and its message contains all
// of subs.
func wantErr(t *testing.T, what string, err error, is func(error) bool, subs ...string) {
	t.Helper()
	if err == nil || !is(err) {
		t.Errorf("%s: err = %v, want another category", what, err)
		return
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: err = %q, want it to mention %q", what, err, s)
		}
	}
}

// removeFile deletes a file under dir.
func removeFile(dir, name string) error { return os.Remove(filepath.Join(dir, name)) }
