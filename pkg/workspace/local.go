package workspace

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/files/watch"
	"github.com/berth-dev/berth/pkg/agent/git"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Local is a Workspace on the host. It runs commands with the sandbox
// agent's process.Runner (each command in its own process group, killed
// whole on timeout or cancellation; bounded output), moves files with its
// files.FS (atomic uploads) and reads git state with its git.Git, so it
// behaves exactly like a sandbox, minus the isolation. Create it with
// NewLocal.
type Local struct {
	root   string
	paths  resolver
	runner *process.Runner
	fs     *files.FS
	git    *git.Git

	closed    atomic.Bool
	closeOnce sync.Once

	watchMu sync.Mutex
	watches map[*watch.Watcher]struct{} // running, ended by Close
}

var _ Workspace = (*Local)(nil)

// LocalOption configures NewLocal.
type LocalOption func(*localOptions)

type localOptions struct {
	logger         *slog.Logger
	defaultTimeout time.Duration
	environ        func() []string
	shell          string
	maxProcesses   int
}

// WithLogger sets the logger of a Local workspace; default slog.Default().
func WithLogger(l *slog.Logger) LocalOption { return func(o *localOptions) { o.logger = l } }

// WithDefaultTimeout bounds the commands that set no Command.Timeout;
// default 0: no limit.
func WithDefaultTimeout(d time.Duration) LocalOption {
	return func(o *localOptions) { o.defaultTimeout = d }
}

// WithEnviron sets the function that returns the base environment of
// commands, to which Command.Env is applied; default os.Environ.
func WithEnviron(f func() []string) LocalOption { return func(o *localOptions) { o.environ = f } }

// WithShell sets the shell that runs Command.Shell as SHELL -c LINE;
// default "/bin/sh".
func WithShell(sh string) LocalOption { return func(o *localOptions) { o.shell = sh } }

// WithMaxProcesses bounds the commands running at once; beyond it Exec
// fails with errdefs.ErrResourceExhausted. Default 256.
func WithMaxProcesses(n int) LocalOption { return func(o *localOptions) { o.maxProcesses = n } }

// NewLocal returns a workspace on the host rooted at root, an existing
// directory (made absolute). A missing root is errdefs.ErrNotFound, a file
// errdefs.ErrFailedPrecondition.
func NewLocal(root string, opts ...LocalOption) (*Local, error) {
	var o localOptions
	for _, f := range opts {
		f(&o)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if root == "" {
		return nil, errdefs.InvalidArgument("root", "must not be empty")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, errdefs.InvalidArgument("root", "%v", err)
	}
	fi, err := os.Stat(abs)
	switch {
	case os.IsNotExist(err):
		return nil, errdefs.NotFound("workspace root %s does not exist", abs)
	case err != nil:
		return nil, fmt.Errorf("workspace root %s: %w", abs, err)
	case !fi.IsDir():
		return nil, errdefs.FailedPrecondition("workspace root %s is not a directory", abs)
	}
	log := o.logger.With("component", "workspace", "workspace_root", abs)
	var environ func() ([]string, error)
	if o.environ != nil {
		environ = func() ([]string, error) { return o.environ(), nil }
	}
	return &Local{
		root:  abs,
		paths: resolver{root: abs},
		runner: process.NewRunner(process.Config{
			WorkDir: abs, Shell: o.shell, DefaultTimeout: o.defaultTimeout,
			MaxProcesses: o.maxProcesses, Environ: environ, Logger: log,
		}),
		fs:  files.New(files.Config{Logger: log}),
		git: git.New(git.Config{WorkDir: abs, Logger: log}),
	}, nil
}

// Root returns the workspace directory.
func (l *Local) Root() string { return l.root }

// Close kills the commands still running (SIGTERM to each process group,
// SIGKILL after the grace); their Exec calls return the output so far.
// Running watches end. Later calls fail with ErrClosed.
func (l *Local) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.runner.Close()
		l.closeWatches()
	})
	return nil
}

func (l *Local) check(ctx context.Context) error {
	if l.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// spec converts a Command for the Runner.
func (l *Local) spec(cmd Command) (process.Spec, error) {
	cwd, err := l.paths.dir("cwd", cmd.Cwd)
	if err != nil {
		return process.Spec{}, err
	}
	return process.Spec{
		Argv: cmd.Argv, Command: cmd.Shell, Cwd: cwd, Env: cmd.Env, Stdin: cmd.Stdin,
		Timeout: cmd.Timeout, OutputLimit: cmd.OutputLimit,
	}, nil
}

// Exec runs a command and waits for it; see Workspace.
func (l *Local) Exec(ctx context.Context, cmd Command) (Result, error) {
	if err := l.check(ctx); err != nil {
		return Result{}, err
	}
	spec, err := l.spec(cmd)
	if err != nil {
		return Result{}, err
	}
	res, err := l.runner.Exec(ctx, spec)
	out := Result{
		ExitStatus:      exitFromProcess(res.ExitStatus),
		Pid:             res.Pid,
		Stdout:          strings.ToValidUTF8(string(res.Stdout), "\uFFFD"),
		Stderr:          strings.ToValidUTF8(string(res.Stderr), "\uFFFD"),
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		StdoutDropped:   res.StdoutDropped,
		StderrDropped:   res.StderrDropped,
	}
	return out, err
}

// ExecStream runs a command and streams its events to fn; see Workspace.
func (l *Local) ExecStream(ctx context.Context, cmd Command, fn func(Event) error) (Result, error) {
	if err := l.check(ctx); err != nil {
		return Result{}, err
	}
	spec, err := l.spec(cmd)
	if err != nil {
		return Result{}, err
	}
	res, err := l.runner.Stream(ctx, spec, func(ev process.Event) error {
		out := Event{Pid: ev.Pid, Data: ev.Data}
		switch ev.Kind {
		case process.EventStarted:
			out.Kind = EventStarted
		case process.EventStdout:
			out.Kind = EventStdout
		case process.EventStderr:
			out.Kind = EventStderr
		case process.EventExited:
			out.Kind = EventExited
			st := exitFromProcess(*ev.Exit)
			out.Exit = &st
		default:
			return nil // gaps happen only in background replays
		}
		return fn(out)
	})
	return Result{ExitStatus: exitFromProcess(res.ExitStatus), Pid: res.Pid}, err
}

func exitFromProcess(st process.ExitStatus) ExitStatus {
	return ExitStatus{ExitCode: st.ExitCode, Signal: st.Signal, TimedOut: st.TimedOut, OOMKilled: st.OOMKilled, Duration: st.Duration}
}

// Upload writes src to dst atomically; see Workspace.
func (l *Local) Upload(ctx context.Context, src io.Reader, dst string) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	p, err := l.paths.file("path", dst)
	if err != nil {
		return err
	}
	_, err = l.fs.Upload(ctx, files.UploadOptions{Path: p}, src)
	return err
}

// Download writes the file src to dst; see Workspace.
func (l *Local) Download(ctx context.Context, src string, dst io.Writer) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	p, err := l.paths.file("path", src)
	if err != nil {
		return err
	}
	rd, err := l.fs.Open(ctx, p, 0, 0)
	if err != nil {
		return err
	}
	defer rd.Close()
	if _, err := io.Copy(dst, rd); err != nil {
		return fmt.Errorf("download %s: %w", p, err)
	}
	return nil
}

// Stat describes a path; see Workspace.
func (l *Local) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := l.check(ctx); err != nil {
		return FileInfo{}, err
	}
	p, err := l.paths.dir("path", path)
	if err != nil {
		return FileInfo{}, err
	}
	fi, err := l.fs.Stat(ctx, p)
	if err != nil {
		return FileInfo{}, err
	}
	return fileInfoFromFS(fi), nil
}

// List lists a directory; see Workspace.
func (l *Local) List(ctx context.Context, path string, depth int) ([]FileInfo, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	p, err := l.paths.dir("path", path)
	if err != nil {
		return nil, err
	}
	res, err := l.fs.List(ctx, p, depth)
	if err != nil {
		return nil, err
	}
	out := make([]FileInfo, len(res.Entries))
	for i, e := range res.Entries {
		out[i] = fileInfoFromFS(e)
	}
	return out, nil
}

func fileInfoFromFS(fi files.FileInfo) FileInfo {
	return FileInfo{
		Path: fi.Path, Name: fi.Name, Type: fileTypeOf(int(fi.Type)), Size: fi.Size,
		Mode: fi.Mode, ModTime: fi.ModTime, SymlinkTarget: fi.SymlinkTarget,
	}
}

// fileTypeOf maps the agent's file type values (files.FileType and
// berth.agent.v1.FileType share one order).
func fileTypeOf(t int) FileType {
	switch t {
	case int(files.TypeFile):
		return TypeFile
	case int(files.TypeDir):
		return TypeDir
	case int(files.TypeSymlink):
		return TypeSymlink
	}
	return TypeOther
}

// GitChanges returns the changed paths of a work tree; see Workspace.
func (l *Local) GitChanges(ctx context.Context, repo string) ([]GitChange, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	dir, err := l.paths.dir("repo", repo)
	if err != nil {
		return nil, err
	}
	st, err := l.git.Status(ctx, dir)
	if err != nil {
		return nil, err
	}
	out := make([]GitChange, 0, len(st.Files))
	for _, f := range st.Files {
		out = append(out, GitChange{
			Path: utf8(f.Path), OldPath: utf8(f.OldPath), Kind: changeKindOf(int(f.Kind)),
			Staged: f.Staged, Unstaged: f.Unstaged,
		})
	}
	return out, nil
}

// GitDiff returns a diff of a work tree, or one file's versions; see
// Workspace.
func (l *Local) GitDiff(ctx context.Context, repo, file string) (GitDiff, error) {
	if err := l.check(ctx); err != nil {
		return GitDiff{}, err
	}
	dir, err := l.paths.dir("repo", repo)
	if err != nil {
		return GitDiff{}, err
	}
	d, err := l.git.Diff(ctx, git.DiffOptions{Repo: dir, File: file})
	if err != nil {
		return GitDiff{}, err
	}
	out := GitDiff{
		Unified: utf8(d.Unified), Original: utf8(d.Original), Modified: utf8(d.Modified), Binary: d.Binary,
	}
	if file != "" {
		out.Path, out.OldPath, out.Kind = utf8(d.Path), utf8(d.OldPath), changeKindOf(int(d.Kind))
	}
	return out, nil
}

// utf8 makes s valid UTF-8 as the agent's wire format does, so Local
// returns the same text as Remote.
func utf8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
