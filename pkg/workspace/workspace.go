package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Workspace is a place where an agent loop runs commands, moves files and
// reads git state: the host (Local) or a sandbox (Remote, Leased). All
// implementations have the same semantics; see the package documentation
// for paths and errors. A Workspace is safe for concurrent use.
type Workspace interface {
	// Exec runs a command and waits for it. Stdout and stderr are kept
	// separately, each bounded by Command.OutputLimit (its head and tail
	// with a marker where the middle was cut; the Truncated flags say so).
	// A command that ran is not an error whatever its exit: see
	// Result.ExitCode, Signal and TimedOut. A Timeout, or ctx ending, kills
	// the command's whole process group. A Timeout still gives the Result
	// with the output so far; when ctx ends the error wraps ctx.Err() (and
	// only Local can still return the partial output with it).
	Exec(ctx context.Context, cmd Command) (Result, error)

	// ExecStream runs a command and passes its events to fn as they
	// happen: EventStarted, output chunks (never truncated), EventExited.
	// fn is called from one goroutine at a time. If fn returns an error
	// the command's process group is killed and ExecStream returns that
	// error. The Result carries the exit status but no output.
	ExecStream(ctx context.Context, cmd Command, fn func(Event) error) (Result, error)

	// Upload writes everything src yields to the file dst, atomically: the
	// data goes to a temporary file beside dst that is renamed into place
	// only when src is exhausted, so a failed or cancelled upload (src's
	// error, ctx, the connection) leaves neither dst nor a temporary file,
	// and a concurrent reader sees the old file or the complete new one. An
	// existing file is replaced; the new file gets mode 0644. dst's parent
	// directory must exist (else errdefs.ErrNotFound); an error of src is
	// returned wrapped, so errors.Is finds it.
	Upload(ctx context.Context, src io.Reader, dst string) error

	// Download writes the content of the regular file src to dst (symlinks
	// are followed). A missing file is errdefs.ErrNotFound and a directory
	// errdefs.ErrFailedPrecondition, reported before anything is written;
	// a failure in the middle leaves what was written so far in dst.
	Download(ctx context.Context, src string, dst io.Writer) error

	// UploadArchive extracts the tar stream src into the directory dir,
	// atomically, as `docker cp` and `tar x` put a tree in place: when dir
	// does not exist the entries go to a staging directory beside it that
	// is renamed to dir at the end (its parent must exist, else
	// errdefs.ErrNotFound); when it is a directory they are merged into it
	// (new paths renamed into place, files replaced, directories merged,
	// what the archive does not name kept; a directory over a file or the
	// reverse is errdefs.ErrFailedPrecondition, found before anything
	// moves). Modes, symlinks, hard links and modification times are kept;
	// owners are the workspace's user. An entry that is absolute, escapes
	// dir ("../x"), goes through a symlink or is a link pointing outside
	// dir is errdefs.ErrInvalidArgument naming the entry, as is a stream
	// that is not a complete tar; a refused, broken or cancelled archive
	// leaves nothing behind.
	UploadArchive(ctx context.Context, src io.Reader, dir string) error

	// DownloadArchive writes the file or directory tree src as a tar
	// stream to dst (gzip-compressed with opts.Gzip), entries named after
	// src's base name ("src/", "src/a", ...) in lexical order, symlinks as
	// symlinks, modes and times (whole seconds) kept; sockets, devices and
	// FIFOs are skipped. A missing src is errdefs.ErrNotFound, reported
	// before anything is written; a failure in the middle is an error
	// (never a short archive without one).
	DownloadArchive(ctx context.Context, src string, dst io.Writer, opts ArchiveOptions) error

	// Stat describes path without following a final symlink.
	Stat(ctx context.Context, path string) (FileInfo, error)

	// List lists the directory path down to depth levels (0 and 1 both
	// mean its own entries only), in lexical order of Path, without the
	// directory itself. Symlinks are listed, never descended into. A
	// listing stops at 10000 entries.
	List(ctx context.Context, path string, depth int) ([]FileInfo, error)

	// GitChanges returns the changed paths of the git work tree at repo
	// (empty: Root) relative to HEAD, staged and unstaged together,
	// untracked files included (each file), ignored files excluded, with
	// renames detected. Paths are relative to the repository's top level.
	GitChanges(ctx context.Context, repo string) ([]GitChange, error)

	// GitDiff compares the work tree of repo (empty: Root) with HEAD. With
	// file empty it returns the unified diff of every change (untracked
	// files as additions) in Unified; with a file (relative to the
	// repository's top level, as GitChanges reports it, or absolute) it
	// returns that file's Original and Modified text instead. A file
	// that is neither tracked nor untracked is errdefs.ErrNotFound.
	GitDiff(ctx context.Context, repo, file string) (GitDiff, error)

	// Watch watches the directory path (empty: Root) and returns once it
	// is watched, so every change made after Watch returns is reported.
	// The events come from the returned sequence, one per changed path
	// per burst (see WatchEvent): range over it once (a sequence never
	// ranged over holds its watch until ctx ends). It ends when ctx
	// ends or the loop stops (either releases the watch), after the
	// WatchRemoved event of the directory itself, or with an error (a
	// broken connection, a limit outgrown: errdefs categories). A missing
	// directory is errdefs.ErrNotFound, a file
	// errdefs.ErrFailedPrecondition, too many watches or watched
	// directories errdefs.ErrResourceExhausted.
	Watch(ctx context.Context, path string, opts WatchOptions) (iter.Seq2[WatchEvent, error], error)

	// Root returns the workspace directory: an absolute path, the default
	// cwd of commands and the base of relative paths.
	Root() string

	// Close releases the workspace: running commands are killed (Local),
	// connections closed (Remote), the lease released (Leased). Later
	// calls fail with ErrClosed. Close is idempotent.
	Close() error
}

// ErrClosed is returned by the calls made on a closed workspace. It is in
// the errdefs.ErrUnavailable category.
var ErrClosed error = &categoryError{msg: "workspace is closed", category: errdefs.ErrUnavailable}

// ErrLeaseLost is matched (with errors.Is) by the errors of a Leased
// workspace whose lease can no longer be renewed because it ended (expired,
// released, failed) or vanished. Such errors are in the
// errdefs.ErrFailedPrecondition category.
var ErrLeaseLost error = &categoryError{msg: "lease lost", category: errdefs.ErrFailedPrecondition}

// categoryError is a sentinel that also belongs to an errdefs category.
type categoryError struct {
	msg      string
	category error
}

func (e *categoryError) Error() string { return "workspace: " + e.msg }
func (e *categoryError) Unwrap() error { return e.category }

// Command describes a command to run. Exactly one of Argv and Shell is set.
type Command struct {
	// Argv is the program and its arguments, run without a shell. A
	// program without a slash is looked up in PATH.
	Argv []string
	// Shell is a shell line, run as /bin/sh -c Shell.
	Shell string
	// Cwd is the working directory, absolute or relative to Root; default
	// Root.
	Cwd string
	// Env is added to, and overrides, the environment of the workspace
	// (the host process's for Local, the agent's for Remote).
	Env map[string]string
	// Stdin is written to the command's standard input, which is then
	// closed; empty means /dev/null. At most 16 MiB.
	Stdin []byte
	// Timeout kills the command's process group (SIGTERM, then SIGKILL
	// after 2s) after this long and sets Result.TimedOut; default no limit
	// (beyond the workspace's own default, if it has one). Negative is
	// errdefs.ErrInvalidArgument.
	Timeout time.Duration
	// OutputLimit is the number of bytes of each stream Exec keeps, half
	// from the head and half from the tail; default 1 MiB. ExecStream is
	// not affected.
	OutputLimit int64
}

// ExitStatus says how a command ended.
type ExitStatus struct {
	// ExitCode is the exit status, or -1 when a signal ended the command.
	ExitCode int
	// Signal names the signal that ended the command, like "SIGKILL".
	Signal string
	// TimedOut is true when Command.Timeout stopped the command.
	TimedOut bool
	// OOMKilled is true when the kernel's OOM killer ended the command
	// (ExitCode -1 and Signal "SIGKILL", or 137 from a shell whose last
	// command was killed); the workspace itself lives on.
	OOMKilled bool
	// Duration is the wall time from start until the command exited.
	Duration time.Duration
}

// Result is the outcome of Exec (and, without output, of ExecStream).
type Result struct {
	ExitStatus
	// Pid was the process id of the command in its workspace.
	Pid int
	// Stdout and Stderr are the command's output as text (invalid UTF-8
	// replaced by U+FFFD; ExecStream gives the raw bytes), each bounded by
	// Command.OutputLimit: when a stream was longer, its head and tail are
	// kept with a marker like "…[berth: 123 bytes truncated]…" between
	// them. ExecStream leaves them empty.
	Stdout, Stderr string
	// StdoutTruncated and StderrTruncated report that bytes were cut.
	StdoutTruncated, StderrTruncated bool
	// StdoutDropped and StderrDropped count the bytes cut.
	StdoutDropped, StderrDropped int64
}

// EventKind is the kind of an Event.
type EventKind int

// Event kinds, in the order a stream delivers them: Started, then output
// (Stdout and Stderr, interleaved as produced), then Exited.
const (
	// EventStarted is the first event; it carries Pid.
	EventStarted EventKind = iota + 1
	// EventStdout carries a chunk of standard output in Data.
	EventStdout
	// EventStderr carries a chunk of standard error in Data.
	EventStderr
	// EventExited is the last event; it carries Exit.
	EventExited
)

// String returns the kind's name: "started", "stdout", "stderr", "exited".
func (k EventKind) String() string {
	switch k {
	case EventStarted:
		return "started"
	case EventStdout:
		return "stdout"
	case EventStderr:
		return "stderr"
	case EventExited:
		return "exited"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one event of ExecStream.
type Event struct {
	// Kind says which of the other fields is set.
	Kind EventKind
	// Pid is the command's process id (EventStarted).
	Pid int
	// Data is a chunk of output, raw bytes, at most 32 KiB (EventStdout,
	// EventStderr). It may be kept; it must not be modified.
	Data []byte
	// Exit is how the command ended (EventExited).
	Exit *ExitStatus
}

// FileType is the kind of a file.
type FileType string

// File types.
const (
	// TypeFile is a regular file.
	TypeFile FileType = "file"
	// TypeDir is a directory.
	TypeDir FileType = "dir"
	// TypeSymlink is a symbolic link.
	TypeSymlink FileType = "symlink"
	// TypeOther is anything else: device, FIFO, socket.
	TypeOther FileType = "other"
)

// FileInfo describes a file.
type FileInfo struct {
	// Path is the file's absolute, clean path.
	Path string
	// Name is the last element of Path.
	Name string
	// Type is the kind of file; a symlink is TypeSymlink, whatever it
	// points to.
	Type FileType
	// Size is the size in bytes (for a symlink, the length of its target).
	Size int64
	// Mode holds the permission bits plus fs.ModeSetuid, fs.ModeSetgid and
	// fs.ModeSticky; the type is in Type.
	Mode fs.FileMode
	// ModTime is the modification time.
	ModTime time.Time
	// SymlinkTarget is where a symlink points, unresolved.
	SymlinkTarget string
}

// IsDir reports whether the file is a directory.
func (f FileInfo) IsDir() bool { return f.Type == TypeDir }

// ChangeKind is how a path changed in a git work tree.
type ChangeKind string

// Change kinds.
const (
	// ChangeUnchanged is a tracked file without changes (GitDiff only).
	ChangeUnchanged ChangeKind = "unchanged"
	// ChangeAdded is a path added to the index that HEAD does not have.
	ChangeAdded ChangeKind = "added"
	// ChangeModified is a path whose content or mode changed.
	ChangeModified ChangeKind = "modified"
	// ChangeDeleted is a path that was removed.
	ChangeDeleted ChangeKind = "deleted"
	// ChangeRenamed is a path moved from OldPath.
	ChangeRenamed ChangeKind = "renamed"
	// ChangeCopied is a path copied from OldPath.
	ChangeCopied ChangeKind = "copied"
	// ChangeUntracked is a file git neither tracks nor ignores.
	ChangeUntracked ChangeKind = "untracked"
	// ChangeConflicted is a path with an unresolved merge conflict.
	ChangeConflicted ChangeKind = "conflicted"
	// ChangeTypeChanged is a path whose type changed (file, symlink,
	// submodule).
	ChangeTypeChanged ChangeKind = "type_changed"
)

// changeKinds is indexed by the agent's ChangeKind values (git.ChangeKind
// and berth.agent.v1.ChangeKind share one order).
var changeKinds = [...]ChangeKind{
	ChangeUnchanged, ChangeAdded, ChangeModified, ChangeDeleted, ChangeRenamed,
	ChangeCopied, ChangeUntracked, ChangeConflicted, ChangeTypeChanged,
}

func changeKindOf(k int) ChangeKind { return kindOf(changeKinds[:], k) }

// kindOf returns table[k], or "kind(K)" for a value the table does not
// know (an agent newer than this client).
func kindOf[K ~string](table []K, k int) K {
	if k >= 0 && k < len(table) {
		return table[k]
	}
	return K(fmt.Sprintf("kind(%d)", k))
}

// GitChange is one changed path of a git work tree.
type GitChange struct {
	// Path is relative to the repository's top level, slash-separated.
	Path string
	// OldPath is the source of a rename or copy.
	OldPath string
	// Kind is the change relative to HEAD, staged and unstaged together.
	Kind ChangeKind
	// Staged is true when the index differs from HEAD for this path.
	Staged bool
	// Unstaged is true when the work tree differs from the index (always
	// for untracked files).
	Unstaged bool
}

// GitDiff is a unified diff of a work tree, or one file's two versions.
type GitDiff struct {
	// Path is the file (with a file), relative to the repository's top
	// level.
	Path string
	// OldPath is the source of a rename or copy (with a file).
	OldPath string
	// Kind is the file's change (with a file); ChangeUnchanged when it is
	// tracked and unchanged.
	Kind ChangeKind
	// Original is the file's text at HEAD; empty when it is new.
	Original string
	// Modified is the file's text in the work tree; empty when deleted.
	Modified string
	// Unified is git's unified diff of the whole work tree (without a
	// file).
	Unified string
	// Binary is true when git considers the file binary or either version
	// is not valid UTF-8; Original and Modified are then empty.
	Binary bool
}

// isCategory reports whether err is in one of the categories.
func isCategory(err error, cats ...error) bool {
	for _, c := range cats {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}
