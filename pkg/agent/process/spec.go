package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/pkg/agent/users"
	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Spec describes a command. Exactly one of Argv and Command is set.
type Spec struct {
	// Argv is the program and its arguments, run without a shell. A program
	// without a slash is looked up in PATH (Env's PATH if it sets one, else
	// the base environment's); one with a slash is relative to Cwd.
	Argv []string
	// Command is a shell line, run as Config.Shell -c Command.
	Command string
	// Cwd is the absolute working directory; default Config.WorkDir.
	Cwd string
	// Env is added to, and overrides, the base environment (Config.Environ).
	Env map[string]string
	// User runs the command as this user of the image ("name", "uid",
	// "name:group", "uid:gid"); default: Config.Users' default user.
	User string
	// Stdin is written to the command's standard input, at most
	// validate.MaxStdin bytes. For Exec and Stream stdin is then closed
	// (and is /dev/null when Stdin is empty); a background process's stdin
	// stays open until WriteStdin closes it.
	Stdin []byte
	// Timeout stops the command (TimedOut in its result) after this long;
	// default Config.DefaultTimeout for Exec and Stream, none for background
	// processes.
	Timeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL when the command is
	// stopped; default 2s.
	KillGrace time.Duration
	// OutputLimit is the number of bytes of each stream that Exec keeps,
	// half from the head and half from the tail; default 1 MiB. Stream and
	// background output are not affected.
	OutputLimit int64
	// KeepGroup leaves the other members of the command's process group
	// running when the leader exits (a shell's `nohup server &`), instead
	// of killing them; a timeout, a cancellation or Close still stops the
	// whole group while the leader runs. Output they still write after the
	// leader exited is read for at most drainDelay. Default false: a
	// command leaves no strays. Exec and Stream only.
	KeepGroup bool
}

// plan is a validated Spec, resolved for starting.
type plan struct {
	path    string   // program to execute
	args    []string // argv, including argv[0]
	env     []string
	cred    *syscall.Credential // nil: the agent's own user
	dir     string
	stdin   []byte
	timeout time.Duration
	grace   time.Duration
	limit   int64
	keep    bool // Spec.KeepGroup
}

// prepare validates s and resolves it into a plan. defTimeout is used when
// s.Timeout is zero.
func (r *Runner) prepare(s Spec, defTimeout time.Duration) (plan, error) {
	if err := validate.Command(s.Argv, s.Command); err != nil {
		return plan{}, err
	}
	if err := validate.Env(s.Env); err != nil {
		return plan{}, err
	}
	dir, err := validate.OptionalAbsPath("cwd", s.Cwd, r.cfg.WorkDir)
	if err != nil {
		return plan{}, err
	}
	switch {
	case len(s.Stdin) > validate.MaxStdin:
		return plan{}, errdefs.InvalidArgument("stdin", "longer than %d bytes", validate.MaxStdin)
	case s.Timeout < 0:
		return plan{}, errdefs.InvalidArgument("timeout", "must not be negative, got %s", s.Timeout)
	case s.KillGrace < 0:
		return plan{}, errdefs.InvalidArgument("kill_grace", "must not be negative, got %s", s.KillGrace)
	case s.OutputLimit < 0:
		return plan{}, errdefs.InvalidArgument("output_limit", "must not be negative, got %d", s.OutputLimit)
	}

	pl := plan{
		dir:     dir,
		stdin:   s.Stdin,
		timeout: s.Timeout,
		grace:   s.KillGrace,
		limit:   s.OutputLimit,
		keep:    s.KeepGroup,
	}
	if pl.timeout == 0 {
		pl.timeout = defTimeout
	}
	if pl.grace == 0 {
		pl.grace = DefaultKillGrace
	}
	if pl.limit == 0 {
		pl.limit = DefaultOutputLimit
	}
	if dir != "" {
		fi, err := os.Stat(dir)
		switch {
		case err != nil && errors.Is(err, fs.ErrNotExist):
			return plan{}, errdefs.FailedPrecondition("cwd: directory %s does not exist", dir)
		case err != nil:
			return plan{}, errdefs.FailedPrecondition("cwd: %v", err)
		case !fi.IsDir():
			return plan{}, errdefs.FailedPrecondition("cwd: %s is not a directory", dir)
		}
	}
	base, err := r.cfg.Environ()
	if err != nil {
		return plan{}, err
	}
	switch {
	case r.cfg.Users != nil:
		id, err := r.cfg.Users.Resolve(s.User)
		if err != nil {
			return plan{}, err
		}
		pl.cred = credentialFor(id)
		base = mergeEnv(base, id.Env())
	case s.User != "":
		return plan{}, errdefs.FailedPrecondition("user: this agent runs commands as its own user (start it with --user to choose users)")
	}
	pl.env = mergeEnv(base, s.Env)

	if s.Command != "" {
		pl.args = []string{r.cfg.Shell, "-c", s.Command}
		if pl.path, err = lookPath(r.cfg.Shell, dir, pl.env); err != nil {
			return plan{}, cannotRun(err, "command: shell %v; pass argv instead", err)
		}
		return pl, nil
	}
	pl.args = s.Argv
	if pl.path, err = lookPath(s.Argv[0], dir, pl.env); err != nil {
		return plan{}, cannotRun(err, "argv[0]: %v", err)
	}
	return pl, nil
}

// Command validates s as Exec does (argv or command, env, cwd, user and the
// root policy) and returns an unstarted command for it: the program looked
// up, the environment merged, the user's credential in SysProcAttr (nil:
// the agent's own user). Stdin, Timeout, KillGrace and OutputLimit are not
// used. The caller starts and waits for the command; it holds no slot of
// Config.MaxProcesses and Close does not stop it. Terminal sessions use it
// to run programs on a pseudo-terminal under the same policy.
func (r *Runner) Command(s Spec) (*exec.Cmd, error) {
	pl, err := r.prepare(Spec{Argv: s.Argv, Command: s.Command, Cwd: s.Cwd, Env: s.Env, User: s.User}, 0)
	if err != nil {
		return nil, err
	}
	if pl.env == nil {
		pl.env = []string{} // nil would mean this process's environment
	}
	return &exec.Cmd{Path: pl.path, Args: pl.args, Env: pl.env, Dir: pl.dir,
		SysProcAttr: &syscall.SysProcAttr{Credential: pl.cred}}, nil
}

// credentialFor returns the credential a command of id starts with, or nil
// when that is the agent's own (so an agent that is not root can still run
// commands as itself).
func credentialFor(id users.Identity) *syscall.Credential {
	if id.UID == uint32(os.Geteuid()) && id.GID == uint32(os.Getegid()) && len(id.Groups) == 0 {
		return nil
	}
	return id.Credential()
}

// mergeEnv returns base with overrides applied: existing variables are
// replaced in place, new ones appended in name order.
func mergeEnv(base []string, overrides map[string]string) []string {
	if len(overrides) == 0 {
		return base
	}
	env := make([]string, 0, len(base)+len(overrides))
	seen := make(map[string]bool, len(overrides))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if v, ok := overrides[k]; ok {
			if seen[k] {
				continue // a duplicate in base
			}
			seen[k] = true
			kv = k + "=" + v
		}
		env = append(env, kv)
	}
	rest := make([]string, 0, len(overrides))
	for k := range overrides {
		if !seen[k] {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		env = append(env, k+"="+overrides[k])
	}
	return env
}

// lookPath resolves the program name like a shell would: a name with a
// slash is taken as is (relative to dir), anything else is searched in the
// PATH of env, skipping relative PATH entries. The error says why name
// cannot be run.
func lookPath(name, dir string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return name, nil
	}
	pathVar := ""
	for _, kv := range slices.Backward(env) {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
			break
		}
	}
	var firstErr error
	for _, d := range filepath.SplitList(pathVar) {
		if !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		err := checkExecutable(p)
		if err == nil {
			return p, nil
		}
		if firstErr == nil && !errors.Is(err, errNoFile) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", fmt.Errorf("%s: %w", name, firstErr)
	}
	return "", fmt.Errorf("executable %q %w", name, errNotInPath)
}

var (
	errNoFile        = errors.New("no such file")
	errNotInPath     = errors.New("not found in PATH")
	errNotExecutable = errors.New("not executable")
)

// Reasons (errdefs.Reason) of the errors of a command that could not
// start, which a client turns into a shell's exit code.
const (
	// ReasonCommandNotFound: the program (or its interpreter) does not
	// exist; a shell exits 127.
	ReasonCommandNotFound = "COMMAND_NOT_FOUND"
	// ReasonCommandNotExecutable: the program exists but cannot be run
	// (no execute permission, a directory, an unknown format); a shell
	// exits 126.
	ReasonCommandNotExecutable = "COMMAND_NOT_EXECUTABLE"
)

// cannotRun returns an ErrFailedPrecondition with the formatted message,
// whose reason says whether cause (from lookPath or exec) means the
// program is missing or cannot be executed.
func cannotRun(cause error, format string, args ...any) error {
	reason := ReasonCommandNotExecutable
	if errors.Is(cause, errNoFile) || errors.Is(cause, errNotInPath) || errors.Is(cause, fs.ErrNotExist) {
		reason = ReasonCommandNotFound
	}
	return errdefs.WithReason(errdefs.FailedPrecondition(format, args...), reason)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errNoFile
		}
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return pe.Err
		}
		return err
	}
	if fi.IsDir() {
		return errors.New("is a directory")
	}
	if fi.Mode()&0o111 == 0 {
		return errNotExecutable
	}
	return nil
}

// StartError classifies an error from starting the command args, as exec
// reports it: ResourceExhausted when the host is out of processes or
// memory, FailedPrecondition with reason ReasonCommandNotFound or
// ReasonCommandNotExecutable when the program cannot run (a missing file or
// interpreter, no permission, not an executable), Internal otherwise.
// Terminal sessions use it too, so both answer a failed start alike.
func StartError(args []string, err error) error {
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno) && (errno == syscall.EAGAIN || errno == syscall.ENOMEM):
		return errdefs.ResourceExhausted("cannot start %s: %v", args[0], err)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission),
		errors.As(err, &errno) && (errno == syscall.ENOEXEC || errno == syscall.ENOTDIR || errno == syscall.EISDIR):
		return cannotRun(err, "argv[0]: cannot start %s: %v", args[0], err)
	default:
		return fmt.Errorf("%w: cannot start %s: %w", errdefs.ErrInternal, args[0], err)
	}
}
