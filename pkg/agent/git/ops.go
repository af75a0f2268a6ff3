package git

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Log limits.
const (
	// DefaultLogLimit is the number of commits Log returns when asked for 0.
	DefaultLogLimit = 20
	// MaxLogLimit is the most commits Log returns.
	MaxLogLimit = 1000
)

// CloneOptions describes a clone.
type CloneOptions struct {
	// URL is what `git clone` accepts: a URL (https://, ssh://, file://,
	// git://), scp-like user@host:path, or a local path (a relative one is
	// relative to Config.WorkDir). Required.
	URL string
	// Dir is the absolute destination; default Config.WorkDir joined with the
	// name git would pick ("repo" for ".../repo.git"). It must not exist or
	// be empty.
	Dir string
	// Branch is the branch (or tag) to check out; default the remote's HEAD.
	Branch string
	// Depth, when positive, makes a shallow clone of that many commits. Git
	// ignores it for plain local paths; use a file:// URL.
	Depth int
}

// CloneResult reports a clone.
type CloneResult struct {
	// Dir is the clone's directory.
	Dir string
	// Head is the checked-out commit; empty for an empty repository.
	Head string
	// Branch is the checked-out branch; empty when detached (a tag).
	Branch string
}

// CheckoutResult reports the state after Checkout.
type CheckoutResult struct {
	// Branch is the checked-out branch.
	Branch string
	// Head is its commit; empty when it has none yet.
	Head string
}

// CommitOptions describes a commit.
type CommitOptions struct {
	// Repo is the repository (absolute); default Config.WorkDir.
	Repo string
	// Message is the commit message. Required.
	Message string
	// Paths are staged (additions, modifications and deletions) before the
	// commit; relative to the top level, or absolute inside the work tree.
	// Other staged changes are committed too.
	Paths []string
	// All stages every change first, untracked files included (Paths are
	// then ignored).
	All bool
	// AuthorName and AuthorEmail set the author; default the committer's
	// identity (configured user.name/user.email, else DefaultName and
	// DefaultEmail).
	AuthorName, AuthorEmail string
	// AllowEmpty permits a commit without changes.
	AllowEmpty bool
}

// Commit is one commit in a Log.
type Commit struct {
	// Hash is the full commit id.
	Hash string
	// AuthorName and AuthorEmail identify the author.
	AuthorName, AuthorEmail string
	// Time is the author time, in the author's time zone.
	Time time.Time
	// Subject is the first line of the message.
	Subject string
	// Parents are the parent ids; none for a root commit.
	Parents []string
}

// Clone clones opts.URL into opts.Dir. If the clone fails or is cancelled,
// a destination directory that Clone created is removed.
func (g *Git) Clone(ctx context.Context, opts CloneOptions) (CloneResult, error) {
	if err := checkRef("url", opts.URL); err != nil {
		return CloneResult{}, err
	}
	if opts.Depth < 0 {
		return CloneResult{}, errdefs.InvalidArgument("depth", "must not be negative, got %d", opts.Depth)
	}
	if opts.Branch != "" {
		if err := checkRef("branch", opts.Branch); err != nil {
			return CloneResult{}, err
		}
	}
	dir, err := validate.OptionalAbsPath("dir", opts.Dir, "")
	if err != nil {
		return CloneResult{}, err
	}
	if dir == "" {
		if g.cfg.WorkDir == "" {
			return CloneResult{}, errdefs.InvalidArgument("dir", "required: no default workspace is configured")
		}
		name := humanish(opts.URL)
		if name == "" {
			return CloneResult{}, errdefs.InvalidArgument("dir", "required: cannot derive a directory name from %q", opts.URL)
		}
		dir = filepath.Join(g.cfg.WorkDir, name)
	}
	existed := true
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		existed = false
	}
	// Relative local URLs are relative to the workspace (or the parent of
	// the destination), which must exist for git to start there.
	cwd := g.cfg.WorkDir
	if st, err := os.Stat(cwd); cwd == "" || err != nil || !st.IsDir() {
		cwd = filepath.Dir(dir)
		if err := os.MkdirAll(cwd, 0o755); err != nil {
			return CloneResult{}, fmt.Errorf("clone: create %s: %w", cwd, err)
		}
	}

	args := []string{"clone", "--quiet"}
	if opts.Branch != "" {
		args = append(args, "--branch="+opts.Branch)
	}
	if opts.Depth > 0 {
		args = append(args, "--depth="+strconv.Itoa(opts.Depth))
	}
	args = append(args, "--", opts.URL, dir)
	_, err = g.run(ctx, call{dir: cwd, args: args, timeout: g.cfg.CloneTimeout})
	if err != nil {
		if !existed {
			// Git removes what it created unless it was killed.
			if rerr := os.RemoveAll(dir); rerr != nil {
				g.log.Warn("clone: remove partial clone", "dir", dir, "error", rerr)
			}
		}
		return CloneResult{}, cloneError(opts, dir, err)
	}
	branch, head, err := g.head(ctx, dir)
	if err != nil {
		return CloneResult{}, err
	}
	return CloneResult{Dir: dir, Head: head, Branch: branch}, nil
}

func cloneError(opts CloneOptions, dir string, err error) error {
	ee := asExit(err)
	if ee == nil {
		return err
	}
	switch {
	case ee.contains("already exists and is not an empty directory"):
		return errdefs.AlreadyExists("clone: %s already exists and is not an empty directory", dir)
	case ee.contains("Remote branch") && ee.contains("not found"),
		ee.contains("Could not find remote branch"):
		return errdefs.NotFound("clone: branch %q not found in %s", opts.Branch, opts.URL)
	case ee.contains("does not exist"), ee.contains("not found"),
		ee.contains("does not appear to be a git repository"):
		return errdefs.NotFound("clone: repository %s not found: %s", redact(opts.URL), ee.stderr)
	case ee.contains("could not read Username"), ee.contains("could not read Password"),
		ee.contains("Authentication failed"), ee.contains("Permission denied"):
		return errdefs.FailedPrecondition("clone: %s needs credentials the sandbox does not have: %s", redact(opts.URL), ee.stderr)
	case ee.contains("Could not resolve host"), ee.contains("Connection refused"),
		ee.contains("Connection timed out"), ee.contains("unable to access"),
		ee.contains("Network is unreachable"):
		return errdefs.Unavailable("clone: %s: %s", redact(opts.URL), ee.stderr)
	case ee.contains("transport") && ee.contains("not allowed"):
		return errdefs.InvalidArgument("url", "%s", ee.stderr)
	}
	return fmt.Errorf("clone %s: %w", redact(opts.URL), err)
}

// redact removes a password from a URL for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// humanish returns the directory name git derives from a clone URL.
func humanish(raw string) string {
	s := strings.TrimRight(raw, "/")
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Host != "" {
		s = strings.TrimRight(u.Path, "/")
	}
	s = strings.TrimSuffix(s, "/.git")
	if i := strings.LastIndexAny(s, "/:"); i >= 0 {
		s = s[i+1:]
	}
	s = strings.TrimSuffix(s, ".git")
	s = strings.TrimSuffix(s, ".bundle")
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "\x00") {
		return ""
	}
	return path.Base(s)
}

// head returns the checked-out branch (empty when detached) and the HEAD
// commit (empty without commits).
func (g *Git) head(ctx context.Context, dir string) (branch, head string, err error) {
	out, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{"symbolic-ref", "--quiet", "HEAD"}})
	switch {
	case err == nil:
		branch = strings.TrimPrefix(strings.TrimSpace(string(out)), "refs/heads/")
	case exitCode(err) != 1:
		return "", "", classify(dir, err)
	}
	head, _, err = g.resolveCommit(ctx, dir, "HEAD")
	return branch, head, err
}

// Checkout switches repo to branch. With create it makes the branch first,
// at startPoint (default HEAD); the branch must not exist. Without create, a
// branch that exists only on a remote is created to track it (git's guess).
func (g *Git) Checkout(ctx context.Context, repo, branch string, create bool, startPoint string) (CheckoutResult, error) {
	dir, err := g.repoDir(repo)
	if err != nil {
		return CheckoutResult{}, err
	}
	if err := checkRef("branch", branch); err != nil {
		return CheckoutResult{}, err
	}
	if startPoint != "" {
		if !create {
			return CheckoutResult{}, errdefs.InvalidArgument("start_point", "only allowed with create")
		}
		if err := checkRef("start_point", startPoint); err != nil {
			return CheckoutResult{}, err
		}
	}
	if _, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{"check-ref-format", "--branch", branch}}); err != nil {
		if ee := asExit(err); ee != nil && !ee.contains("not a git repository") {
			return CheckoutResult{}, errdefs.InvalidArgument("branch", "%q is not a valid branch name", branch)
		}
		return CheckoutResult{}, classify(dir, err)
	}

	args := []string{"switch", "--quiet"}
	if create {
		_, exists, err := g.resolveCommit(ctx, dir, "refs/heads/"+branch)
		if err != nil {
			return CheckoutResult{}, err
		}
		if exists {
			return CheckoutResult{}, errdefs.AlreadyExists("branch %q already exists in %s", branch, dir)
		}
		if startPoint != "" {
			if _, ok, err := g.resolveCommit(ctx, dir, startPoint); err != nil {
				return CheckoutResult{}, err
			} else if !ok {
				return CheckoutResult{}, errdefs.NotFound("start_point %q does not name a commit in %s", startPoint, dir)
			}
		}
		args = append(args, "--create", branch, "--end-of-options")
		if startPoint != "" {
			args = append(args, startPoint)
		}
	} else {
		args = append(args, "--end-of-options", branch)
	}
	if _, err := g.run(ctx, call{dir: dir, args: args}); err != nil {
		return CheckoutResult{}, checkoutError(dir, branch, err)
	}
	b, h, err := g.head(ctx, dir)
	if err != nil {
		return CheckoutResult{}, err
	}
	return CheckoutResult{Branch: b, Head: h}, nil
}

func checkoutError(dir, branch string, err error) error {
	ee := asExit(err)
	if ee == nil {
		return classify(dir, err)
	}
	switch {
	case ee.contains("invalid reference"):
		return errdefs.NotFound("branch %q not found in %s", branch, dir)
	case ee.contains("already exists"):
		return errdefs.AlreadyExists("branch %q already exists in %s", branch, dir)
	case ee.contains("a branch is expected"):
		return errdefs.InvalidArgument("branch", "%s", ee.stderr)
	case ee.contains("would be overwritten"), ee.contains("is already checked out"),
		ee.contains("is already used by worktree"), ee.contains("you need to resolve your current index"),
		ee.contains("matched multiple"):
		return errdefs.FailedPrecondition("checkout %q in %s: %s", branch, dir, ee.stderr)
	}
	return classify(dir, err)
}

// Commit stages opts.Paths (or everything, with All), commits what is staged
// and returns the new commit's id. Nothing to commit is
// errdefs.ErrFailedPrecondition unless AllowEmpty.
func (g *Git) Commit(ctx context.Context, opts CommitOptions) (string, error) {
	dir, err := g.repoDir(opts.Repo)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(opts.Message) == "" {
		return "", errdefs.InvalidArgument("message", "must not be empty")
	}
	if err := validate.NoNUL("message", opts.Message); err != nil {
		return "", err
	}
	for field, v := range map[string]string{"author_name": opts.AuthorName, "author_email": opts.AuthorEmail} {
		if strings.ContainsAny(v, "\x00\n\r<>") {
			return "", errdefs.InvalidArgument(field, "must not contain NUL, newline, '<' or '>'")
		}
	}
	if len(opts.Paths) > validate.MaxArgs {
		return "", errdefs.InvalidArgument("paths", "more than %d entries", validate.MaxArgs)
	}

	switch {
	case opts.All:
		if _, err := g.run(ctx, call{dir: dir, args: []string{"add", "--all"}}); err != nil {
			return "", addError(dir, err)
		}
	case len(opts.Paths) > 0:
		top, err := g.topLevel(ctx, dir)
		if err != nil {
			return "", err
		}
		args := []string{"add", "--all", "--"}
		for i, p := range opts.Paths {
			rel, err := relPath("paths["+strconv.Itoa(i)+"]", top, p)
			if err != nil {
				return "", err
			}
			args = append(args, rel)
		}
		if _, err := g.run(ctx, call{dir: top, args: args}); err != nil {
			return "", addError(dir, err)
		}
	}

	ident, err := g.identityArgs(ctx, dir)
	if err != nil {
		return "", err
	}
	var env []string
	if opts.AuthorName != "" {
		env = append(env, "GIT_AUTHOR_NAME="+opts.AuthorName)
	}
	if opts.AuthorEmail != "" {
		env = append(env, "GIT_AUTHOR_EMAIL="+opts.AuthorEmail)
	}
	args := append(ident, "commit", "--quiet", "--file=-")
	if opts.AllowEmpty {
		args = append(args, "--allow-empty")
	}
	if _, err := g.run(ctx, call{dir: dir, args: args, env: env, stdin: strings.NewReader(opts.Message)}); err != nil {
		return "", commitError(dir, err)
	}
	hash, ok, err := g.resolveCommit(ctx, dir, "HEAD")
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("%w: commit in %s: HEAD does not resolve after commit", errdefs.ErrInternal, dir)
	}
	return hash, nil
}

func addError(dir string, err error) error {
	ee := asExit(err)
	switch {
	case ee == nil:
		return classify(dir, err)
	case ee.contains("did not match any files"):
		return errdefs.NotFound("paths: %s", ee.stderr)
	case ee.contains("are ignored by one of your .gitignore files"):
		return errdefs.FailedPrecondition("paths: %s", ee.stderr)
	}
	return classify(dir, err)
}

func commitError(dir string, err error) error {
	ee := asExit(err)
	switch {
	case ee == nil:
		return classify(dir, err)
	case ee.contains("nothing to commit"), ee.contains("nothing added to commit"),
		ee.contains("no changes added to commit"):
		return errdefs.FailedPrecondition("nothing to commit in %s", dir)
	case ee.contains("unmerged files"), ee.contains("unresolved conflict"):
		return errdefs.FailedPrecondition("cannot commit in %s: unresolved merge conflicts", dir)
	case ee.contains("empty commit message"):
		return errdefs.InvalidArgument("message", "empty after git's cleanup")
	}
	return classify(dir, err)
}

// identityArgs returns -c options supplying the default identity for
// whatever of user.name and user.email git has no value for. Configuration
// is never written.
func (g *Git) identityArgs(ctx context.Context, dir string) ([]string, error) {
	out, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{"config", "-z", "--get-regexp", `^user\.(name|email)$`}})
	if err != nil && exitCode(err) != 1 {
		return nil, classify(dir, err)
	}
	have := map[string]bool{}
	for _, r := range strings.Split(string(out), "\x00") {
		k, v, _ := strings.Cut(r, "\n")
		if v != "" {
			have[k] = true
		}
	}
	var args []string
	if !have["user.name"] {
		args = append(args, "-c", "user.name="+DefaultName)
	}
	if !have["user.email"] {
		args = append(args, "-c", "user.email="+DefaultEmail)
	}
	return args, nil
}

// Log returns up to limit commits reachable from ref (default HEAD), newest
// first. limit 0 means DefaultLogLimit; more than MaxLogLimit is capped. A
// repository without commits has an empty log.
func (g *Git) Log(ctx context.Context, repo, ref string, limit int) ([]Commit, error) {
	dir, err := g.repoDir(repo)
	if err != nil {
		return nil, err
	}
	switch {
	case limit < 0:
		return nil, errdefs.InvalidArgument("limit", "must not be negative, got %d", limit)
	case limit == 0:
		limit = DefaultLogLimit
	case limit > MaxLogLimit:
		limit = MaxLogLimit
	}
	if ref == "" {
		ref = "HEAD"
	}
	if err := checkRef("ref", ref); err != nil {
		return nil, err
	}
	oid, ok, err := g.resolveCommit(ctx, dir, ref)
	if err != nil {
		return nil, err
	}
	if !ok {
		if ref == "HEAD" {
			return []Commit{}, nil
		}
		return nil, errdefs.NotFound("ref %q does not name a commit in %s", ref, dir)
	}
	out, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{
		"log", "-z", "--no-show-signature", "--no-color",
		"--format=%H%x00%P%x00%an%x00%ae%x00%aI%x00%s",
		"--max-count=" + strconv.Itoa(limit), oid, "--",
	}})
	if err != nil {
		return nil, classify(dir, err)
	}
	commits, err := parseLog(out)
	if err != nil {
		return nil, fmt.Errorf("%w: git log in %s: %v", errdefs.ErrInternal, dir, err)
	}
	return commits, nil
}

// parseLog parses log records of six NUL-separated fields, each record
// NUL-terminated.
func parseLog(out []byte) ([]Commit, error) {
	s := strings.TrimSuffix(string(out), "\x00")
	commits := []Commit{}
	if s == "" {
		return commits, nil
	}
	f := strings.Split(s, "\x00")
	if len(f)%6 != 0 {
		return nil, fmt.Errorf("unexpected field count %d", len(f))
	}
	for i := 0; i < len(f); i += 6 {
		t, err := time.Parse(time.RFC3339, f[i+4])
		if err != nil {
			return nil, fmt.Errorf("commit %s: time %q: %v", f[i], f[i+4], err)
		}
		c := Commit{Hash: f[i], AuthorName: f[i+2], AuthorEmail: f[i+3], Time: t, Subject: f[i+5], Parents: strings.Fields(f[i+1])}
		commits = append(commits, c)
	}
	return commits, nil
}
