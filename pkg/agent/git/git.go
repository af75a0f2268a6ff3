package git

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Defaults for Config fields left zero.
const (
	// DefaultTimeout bounds one git invocation.
	DefaultTimeout = 60 * time.Second
	// DefaultCloneTimeout bounds a clone.
	DefaultCloneTimeout = 10 * time.Minute
	// DefaultMaxOutputBytes bounds what one git invocation may print, and the
	// size of a work-tree file read by Diff.
	DefaultMaxOutputBytes = 64 << 20
	// DefaultName is the committer (and author) name used when git has no
	// user.name configured.
	DefaultName = "berth"
	// DefaultEmail is the committer (and author) email used when git has no
	// user.email configured.
	DefaultEmail = "berth@localhost"
)

// maxStderr bounds the standard error kept from one invocation.
const maxStderr = 64 << 10

// Config configures a Git.
type Config struct {
	// Binary is the git executable: a name looked up in PATH at every call,
	// or a path. Default "git".
	Binary string
	// WorkDir is the repository used when a request names none. Default
	// none: requests must name their repository.
	WorkDir string
	// Logger receives one debug record per git invocation. Default: discard.
	Logger *slog.Logger
	// Timeout bounds one git invocation. Default 60s.
	Timeout time.Duration
	// CloneTimeout bounds a clone. Default 10 minutes.
	CloneTimeout time.Duration
	// MaxOutputBytes bounds the standard output of one git invocation and the
	// size of a work-tree file that Diff reads. Default 64 MiB.
	MaxOutputBytes int64
}

// Git runs git operations on repositories. It is safe for concurrent use;
// git's own locking protects a repository from concurrent writers.
type Git struct {
	cfg Config
	log *slog.Logger
}

// New returns a Git with cfg's zero fields set to their defaults.
func New(cfg Config) *Git {
	if cfg.Binary == "" {
		cfg.Binary = "git"
	}
	if cfg.WorkDir != "" {
		if abs, err := filepath.Abs(cfg.WorkDir); err == nil {
			cfg.WorkDir = abs
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.CloneTimeout <= 0 {
		cfg.CloneTimeout = DefaultCloneTimeout
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Git{cfg: cfg, log: log}
}

// Available reports whether the git binary can be found.
func (g *Git) Available() bool {
	_, err := g.binary()
	return err == nil
}

// binary resolves Config.Binary.
func (g *Git) binary() (string, error) {
	p, err := exec.LookPath(g.cfg.Binary)
	if err != nil {
		return "", errdefs.FailedPrecondition("git is not installed in this sandbox image (%q not found)", g.cfg.Binary)
	}
	return p, nil
}

// repoDir validates a request's repository and returns it as a clean
// absolute path to an existing directory.
func (g *Git) repoDir(repo string) (string, error) {
	dir, err := validate.OptionalAbsPath("repo", repo, g.cfg.WorkDir)
	if err != nil {
		return "", err
	}
	if dir == "" {
		return "", errdefs.InvalidArgument("repo", "required: no default repository is configured")
	}
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", errdefs.NotFound("repo %s does not exist", dir)
	case errors.Is(err, fs.ErrPermission):
		return "", fmt.Errorf("%w: repo %s: %v", errdefs.ErrPermissionDenied, dir, err)
	case err != nil:
		return "", fmt.Errorf("repo %s: %w", dir, err)
	case !st.IsDir():
		return "", errdefs.FailedPrecondition("%s is not a git repository (not a directory)", dir)
	}
	return dir, nil
}

// call is one git invocation.
type call struct {
	dir      string
	args     []string
	stdin    io.Reader
	readOnly bool
	env      []string // extra KEY=VALUE entries
	timeout  time.Duration
	// okExit is a non-zero exit status that still counts as success (1 for
	// `git diff --no-index`, which exits 1 when the files differ).
	okExit int
}

// exitError is a git invocation that exited with a failure status.
type exitError struct {
	cmd    string // the subcommand, for messages
	code   int
	stderr string // trimmed, hints removed
	stdout string // head of stdout, for the few commands that report there
}

func (e *exitError) Error() string {
	msg := e.stderr
	if msg == "" {
		msg = e.stdout
	}
	if msg == "" {
		return fmt.Sprintf("git %s exited with status %d", e.cmd, e.code)
	}
	return fmt.Sprintf("git %s: %s", e.cmd, msg)
}

// contains reports whether the error's output contains s.
func (e *exitError) contains(s string) bool {
	return strings.Contains(e.stderr, s) || strings.Contains(e.stdout, s)
}

// asExit returns err as an *exitError, or nil.
func asExit(err error) *exitError {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee
	}
	return nil
}

// exitCode returns the exit status of a failed invocation, or -1.
func exitCode(err error) int {
	if ee := asExit(err); ee != nil {
		return ee.code
	}
	return -1
}

// stripped variables would point git at another repository, or change how
// it reads paths or prints messages; run sets its own values where needed.
var stripped = map[string]bool{
	"GIT_DIR": true, "GIT_WORK_TREE": true, "GIT_INDEX_FILE": true,
	"GIT_OBJECT_DIRECTORY": true, "GIT_ALTERNATE_OBJECT_DIRECTORIES": true,
	"GIT_COMMON_DIR": true, "GIT_NAMESPACE": true, "GIT_PREFIX": true,
	"GIT_IMPLICIT_WORK_TREE": true, "GIT_QUARANTINE_PATH": true,
	"GIT_LITERAL_PATHSPECS": true, "GIT_GLOB_PATHSPECS": true,
	"GIT_NOGLOB_PATHSPECS": true, "GIT_ICASE_PATHSPECS": true,
	"GIT_OPTIONAL_LOCKS": true, "GIT_TERMINAL_PROMPT": true,
	"GIT_PAGER": true, "PAGER": true, "GIT_EDITOR": true, "EDITOR": true, "VISUAL": true,
	"LC_ALL": true, "LANGUAGE": true, "LC_MESSAGES": true,
}

func (g *Git) env(c call) []string {
	base := os.Environ()
	env := make([]string, 0, len(base)+len(c.env)+8)
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !stripped[k] {
			env = append(env, kv)
		}
	}
	env = append(env,
		"GIT_TERMINAL_PROMPT=0",
		"LC_ALL=C",
		"GIT_PAGER=cat",
		"PAGER=cat",
		"GIT_EDITOR=true",
		"GIT_LITERAL_PATHSPECS=1",
	)
	if c.readOnly {
		env = append(env, "GIT_OPTIONAL_LOCKS=0")
	}
	return append(env, c.env...)
}

// run runs one git invocation and returns its standard output. A failure
// status (other than c.okExit) is an *exitError, returned with the output;
// callers classify it.
func (g *Git) run(ctx context.Context, c call) ([]byte, error) {
	bin, err := g.binary()
	if err != nil {
		return nil, err
	}
	sub := subcommand(c.args)
	timeout := c.timeout
	if timeout <= 0 {
		timeout = g.cfg.Timeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := exec.CommandContext(cctx, bin, append([]string{"--no-pager"}, c.args...)...)
	cmd.Dir = c.dir
	cmd.Env = g.env(c)
	cmd.Stdin = c.stdin
	stdout := &capWriter{max: g.cfg.MaxOutputBytes, overflow: cancel}
	stderr := &capWriter{max: maxStderr}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	setProcessGroup(cmd)
	cmd.WaitDelay = 2 * time.Second

	start := time.Now()
	err = cmd.Run()
	code := cmd.ProcessState.ExitCode() // -1 when it did not start or was killed
	g.log.LogAttrs(ctx, slog.LevelDebug, "git",
		slog.String("git_command", sub),
		slog.String("dir", c.dir),
		slog.Int("exit_code", code),
		slog.Duration("duration", time.Since(start)))

	switch {
	case stdout.overflowed():
		return nil, errdefs.ResourceExhausted("git %s: output larger than %d bytes", sub, g.cfg.MaxOutputBytes)
	case ctx.Err() != nil:
		return nil, fmt.Errorf("git %s: %w", sub, ctx.Err())
	case cctx.Err() != nil:
		return nil, fmt.Errorf("git %s: timed out after %s: %w", sub, timeout, context.DeadlineExceeded)
	}
	if err != nil {
		var xe *exec.ExitError
		if !errors.As(err, &xe) {
			var pe *fs.PathError
			if errors.As(err, &pe) && pe.Op == "chdir" {
				return nil, errdefs.NotFound("directory %s does not exist", c.dir)
			}
			return nil, fmt.Errorf("run git %s: %w", sub, err)
		}
		if c.okExit == 0 || xe.ExitCode() != c.okExit {
			return stdout.Bytes(), &exitError{
				cmd:    sub,
				code:   xe.ExitCode(),
				stderr: cleanStderr(stderr.String()),
				stdout: strings.TrimSpace(head(stdout.String(), 4096)),
			}
		}
	}
	return stdout.Bytes(), nil
}

// subcommand returns the first argument that is not a global option.
func subcommand(args []string) string {
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-c" || a == "-C":
			i++
		case strings.HasPrefix(a, "-"):
		default:
			return a
		}
	}
	return "git"
}

// cleanStderr drops git's hint lines and surrounding space.
func cleanStderr(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	out := lines[:0]
	for _, l := range lines {
		if strings.HasPrefix(l, "hint:") {
			continue
		}
		out = append(out, strings.TrimRight(l, " \r"))
	}
	return strings.TrimSpace(strings.Join(out, "\n"))
}

func head(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// classify maps the failures every git command can have to error
// categories; other errors pass through.
func classify(dir string, err error) error {
	ee := asExit(err)
	if ee == nil {
		return err
	}
	switch {
	case ee.contains("not a git repository"):
		return errdefs.FailedPrecondition("%s is not a git repository", dir)
	case ee.contains("must be run in a work tree"):
		return errdefs.FailedPrecondition("%s is not a git work tree (bare repository?)", dir)
	case ee.contains("detected dubious ownership"):
		return errdefs.FailedPrecondition("%s: %s", dir, ee.stderr)
	case ee.contains("index.lock") && ee.contains("File exists"):
		return fmt.Errorf("%w: %s: another git process is modifying the repository: %s", errdefs.ErrConflict, dir, ee.stderr)
	}
	return err
}

// capWriter keeps up to max bytes. Beyond that it records the overflow,
// calls overflow (if set: stdout's kills the command) and discards the rest.
type capWriter struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	max      int64
	over     bool
	overflow func()
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	room := w.max - int64(w.buf.Len())
	if int64(len(p)) > room {
		if room > 0 {
			w.buf.Write(p[:room])
		}
		if !w.over {
			w.over = true
			if w.overflow != nil {
				w.overflow()
			}
		}
		return len(p), nil
	}
	w.buf.Write(p)
	return len(p), nil
}

func (w *capWriter) overflowed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.over && w.overflow != nil
}

func (w *capWriter) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Bytes()
}

func (w *capWriter) String() string { return string(w.Bytes()) }

// checkRef validates a ref-like request value (ref, start_point, branch).
func checkRef(field, v string) error {
	switch {
	case v == "":
		return errdefs.InvalidArgument(field, "must not be empty")
	case strings.HasPrefix(v, "-"):
		return errdefs.InvalidArgument(field, "must not start with '-', got %q", v)
	case strings.ContainsAny(v, "\x00\n\r"):
		return errdefs.InvalidArgument(field, "must not contain NUL or newline characters")
	case len(v) > 1024:
		return errdefs.InvalidArgument(field, "longer than 1024 bytes")
	}
	return nil
}

// resolveCommit resolves rev to a commit id. ok is false when it does not
// name a commit (unknown, or HEAD of a repository without commits).
func (g *Git) resolveCommit(ctx context.Context, dir, rev string) (oid string, ok bool, err error) {
	out, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{"rev-parse", "--verify", "--quiet", rev + "^{commit}"}})
	if exitCode(err) == 1 {
		return "", false, nil
	}
	if err != nil {
		return "", false, classify(dir, err)
	}
	return strings.TrimSpace(string(out)), true, nil
}

// emptyTree returns the id of the empty tree in the repository's hash.
func (g *Git) emptyTree(ctx context.Context, dir string) (string, error) {
	out, err := g.run(ctx, call{dir: dir, readOnly: true, stdin: strings.NewReader(""), args: []string{"hash-object", "-t", "tree", "--stdin"}})
	if err != nil {
		return "", classify(dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// topLevel returns the top-level directory of the work tree containing dir.
func (g *Git) topLevel(ctx context.Context, dir string) (string, error) {
	out, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{"rev-parse", "--show-toplevel"}})
	if err != nil {
		return "", classify(dir, err)
	}
	return strings.TrimSuffix(string(out), "\n"), nil
}

// relPath turns a request path (relative to the top level, or absolute
// inside the work tree) into a clean slash-separated path relative to top.
func relPath(field, top, p string) (string, error) {
	if p == "" {
		return "", errdefs.InvalidArgument(field, "must not be empty")
	}
	if err := validate.NoNUL(field, p); err != nil {
		return "", err
	}
	if len(p) > validate.MaxPathLen {
		return "", errdefs.InvalidArgument(field, "longer than %d bytes", validate.MaxPathLen)
	}
	var rel string
	if filepath.IsAbs(p) {
		r, err := filepath.Rel(top, filepath.Clean(p))
		if err != nil || escapes(r) {
			// top is a resolved path; p may reach it through a symlink.
			if d, err2 := filepath.EvalSymlinks(filepath.Dir(p)); err2 == nil {
				r, err = filepath.Rel(top, filepath.Join(d, filepath.Base(p)))
			}
		}
		if err != nil || escapes(r) {
			return "", errdefs.InvalidArgument(field, "%q is outside the work tree %s", p, top)
		}
		rel = r
	} else {
		rel = filepath.Clean(p)
		if escapes(rel) {
			return "", errdefs.InvalidArgument(field, "%q is outside the work tree", p)
		}
	}
	if rel == "." {
		return "", errdefs.InvalidArgument(field, "%q names the work tree itself, not a file", p)
	}
	return filepath.ToSlash(rel), nil
}

func escapes(rel string) bool {
	return rel == ".." || strings.HasPrefix(rel, "../")
}
