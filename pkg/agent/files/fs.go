package files

import (
	"container/heap"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/pkg/agent/files/watch"
	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// DefaultMaxListEntries is the default of Config.MaxListEntries.
const DefaultMaxListEntries = 10000

// Config configures an FS.
type Config struct {
	// Logger receives the file service's logs. Default slog.Default().
	Logger *slog.Logger
	// MaxListEntries caps the entries List returns; a listing that reaches
	// it is marked truncated. Default 10000.
	MaxListEntries int
	// Sync fsyncs every uploaded file (and its directory after the rename)
	// before the upload reports success. Default false: sandboxes are
	// disposable and the temp-file-and-rename scheme already keeps readers
	// from seeing partial files.
	Sync bool
	// Chown, when set, is called on every file and directory the service
	// creates (an upload, the parent directories it creates, MakeDir's
	// directories, a move's target) to give it to the sandbox's default
	// user. Default nil: they belong to the agent's user.
	Chown func(path string) error
	// AsUser, when set, runs every operation with that file-system
	// identity (fsuid/fsgid), so the service can read and write only what
	// that user can; what it creates is the user's. The agent sets it to
	// the default user when root is forbidden. Default nil: operations run
	// as the agent's user (root in a sandbox).
	AsUser *Identity
	// MaxWatches bounds the watches (Watch) running at once. Default 16.
	MaxWatches int
	// MaxWatchDirs bounds the directories all watches watch together.
	// Default 16384.
	MaxWatchDirs int
}

// FS implements the file operations of the agent on the local file system.
// All paths are absolute; relative paths are rejected. An FS is safe for
// concurrent use.
type FS struct {
	log      *slog.Logger
	maxList  int
	syncData bool
	chownFn  func(path string) error
	asUser   *Identity
	watches  *watch.Limits
}

// New returns an FS configured by cfg.
func New(cfg Config) *FS {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxListEntries <= 0 {
		cfg.MaxListEntries = DefaultMaxListEntries
	}
	if cfg.MaxWatches <= 0 {
		cfg.MaxWatches = DefaultMaxWatches
	}
	if cfg.MaxWatchDirs <= 0 {
		cfg.MaxWatchDirs = DefaultMaxWatchDirs
	}
	return &FS{
		log: cfg.Logger, maxList: cfg.MaxListEntries, syncData: cfg.Sync, chownFn: cfg.Chown, asUser: cfg.AsUser,
		watches: watch.NewLimits(cfg.MaxWatches, cfg.MaxWatchDirs),
	}
}

// FileType is the kind of a file.
type FileType int

// File types, in the order of the API's FileType enum.
const (
	// TypeUnknown is the zero FileType.
	TypeUnknown FileType = iota
	// TypeFile is a regular file.
	TypeFile
	// TypeDir is a directory.
	TypeDir
	// TypeSymlink is a symbolic link.
	TypeSymlink
	// TypeOther is anything else: device, FIFO, socket.
	TypeOther
)

// String returns "file", "dir", "symlink", "other" or "unknown".
func (t FileType) String() string {
	switch t {
	case TypeFile:
		return "file"
	case TypeDir:
		return "dir"
	case TypeSymlink:
		return "symlink"
	case TypeOther:
		return "other"
	}
	return "unknown"
}

// FileInfo describes one file.
type FileInfo struct {
	// Path is the file's absolute, clean path.
	Path string
	// Name is the last element of Path ("/" for the root).
	Name string
	// Type is the kind of file (a symlink is TypeSymlink, not its target's type).
	Type FileType
	// Size is the size in bytes (for a symlink, the length of its target).
	Size int64
	// Mode holds the permission bits plus fs.ModeSetuid, fs.ModeSetgid and
	// fs.ModeSticky; the type bits are in Type.
	Mode fs.FileMode
	// ModTime is the modification time.
	ModTime time.Time
	// SymlinkTarget is where a symlink points, unresolved; empty otherwise.
	SymlinkTarget string
}

// modeBits are the fs.FileMode bits a FileInfo.Mode carries and an upload or
// mkdir may set.
const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

func newFileInfo(path string, fi fs.FileInfo) FileInfo {
	info := FileInfo{
		Path:    path,
		Name:    filepath.Base(path),
		Size:    fi.Size(),
		Mode:    fi.Mode() & modeBits,
		ModTime: fi.ModTime(),
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		info.Type = TypeFile
	case m.IsDir():
		info.Type = TypeDir
	case m&fs.ModeSymlink != 0:
		info.Type = TypeSymlink
		if target, err := os.Readlink(path); err == nil {
			info.SymlinkTarget = target
		}
	default:
		info.Type = TypeOther
	}
	return info
}

// checkMode validates a mode given in a request; zero means def.
func checkMode(field string, m, def fs.FileMode) (fs.FileMode, error) {
	if m == 0 {
		return def, nil
	}
	if m&^modeBits != 0 {
		return 0, errdefs.InvalidArgument(field, "%v has bits other than permission, setuid, setgid and sticky", m)
	}
	return m, nil
}

// checkPath validates an absolute path field; root says whether "/" is allowed.
func checkPath(field, p string, root bool) (string, error) {
	clean, err := validate.AbsPath(field, p)
	if err != nil {
		return "", err
	}
	if !root && clean == "/" {
		return "", errdefs.InvalidArgument(field, "must not be the root directory")
	}
	return clean, nil
}

// stat describes path without following a final symlink.
func (f *FS) stat(ctx context.Context, path string) (FileInfo, error) {
	p, err := checkPath("path", path, true)
	if err != nil {
		return FileInfo{}, err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return FileInfo{}, osError("stat", p, err)
	}
	return newFileInfo(p, fi), nil
}

// ListResult is the result of List.
type ListResult struct {
	// Entries are in lexical (byte-wise) order of Path.
	Entries []FileInfo
	// Truncated is true when more entries existed than Config.MaxListEntries.
	Truncated bool
}

// list lists the directory at path down to depth levels (0 means 1: only
// the directory's own entries). The directory itself is not included. A
// symlink to a directory named by path is followed; symlinks met while
// descending are listed but never descended into. Entries come in lexical
// order of their full path, and when the listing is capped at
// Config.MaxListEntries the entries returned are exactly the first ones in
// that order. A subdirectory that cannot be read is skipped (and logged); an
// unreadable path itself is an error.
func (f *FS) list(ctx context.Context, path string, depth int) (ListResult, error) {
	p, err := checkPath("path", path, true)
	if err != nil {
		return ListResult{}, err
	}
	if depth < 0 {
		return ListResult{}, errdefs.InvalidArgument("depth", "must not be negative, got %d", depth)
	}
	if depth == 0 {
		depth = 1
	}
	fi, err := os.Stat(p)
	if err != nil {
		return ListResult{}, osError("list", p, err)
	}
	if !fi.IsDir() {
		return ListResult{}, errdefs.FailedPrecondition("list %s: not a directory", p)
	}

	var q listQueue
	if err := f.readDir(&q, p, 1, depth, true); err != nil {
		return ListResult{}, err
	}
	var res ListResult
	for q.Len() > 0 {
		if err := ctx.Err(); err != nil {
			return ListResult{}, err
		}
		it := heap.Pop(&q).(listItem)
		if it.expand {
			// The children of it.dir are all greater than it.key (dir + "/"),
			// and the queue holds nothing smaller, so pushing them keeps the
			// output in lexical order.
			_ = f.readDir(&q, it.dir, it.depth, depth, false)
			continue
		}
		if len(res.Entries) == f.maxList {
			res.Truncated = true
			break
		}
		res.Entries = append(res.Entries, it.info)
	}
	return res, nil
}

// readDir pushes the entries of dir (at level d) onto q, plus a placeholder
// for each subdirectory to expand when d < maxDepth.
func (f *FS) readDir(q *listQueue, dir string, d, maxDepth int, top bool) error {
	fd, err := os.Open(dir)
	if err != nil {
		if top {
			return osError("list", dir, err)
		}
		f.log.Warn("list: skipping unreadable directory", "path", dir, "error", err)
		return nil
	}
	ents, err := fd.ReadDir(-1)
	fd.Close()
	if err != nil {
		if top {
			return osError("list", dir, err)
		}
		f.log.Warn("list: skipping unreadable directory", "path", dir, "error", err)
		// Keep what was read.
	}
	for _, e := range ents {
		child := filepath.Join(dir, e.Name())
		fi, err := e.Info()
		if err != nil {
			continue // vanished since ReadDir
		}
		heap.Push(q, listItem{key: child, info: newFileInfo(child, fi)})
		if fi.IsDir() && d < maxDepth {
			heap.Push(q, listItem{key: child + "/", expand: true, dir: child, depth: d + 1})
		}
	}
	return nil
}

// listItem is an entry to emit, or a directory to expand when its key
// (the directory's path plus "/") comes up.
type listItem struct {
	key    string
	info   FileInfo
	expand bool
	dir    string
	depth  int
}

type listQueue []listItem

func (q listQueue) Len() int           { return len(q) }
func (q listQueue) Less(i, j int) bool { return q[i].key < q[j].key }
func (q listQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *listQueue) Push(x any)        { *q = append(*q, x.(listItem)) }
func (q *listQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	old[len(old)-1] = listItem{}
	*q = old[:len(old)-1]
	return it
}

// makeDir creates the directory path with mode (0 means 0755), set exactly
// (the umask does not apply). Without parents, the parent must exist and
// path must not: a missing parent is NotFound, an existing path
// AlreadyExists. With parents, missing parents are created (0755) and an
// existing directory is success; an existing non-directory is AlreadyExists.
func (f *FS) makeDir(ctx context.Context, path string, parents bool, mode fs.FileMode) error {
	p, err := checkPath("path", path, true)
	if err != nil {
		return err
	}
	mode, err = checkMode("mode", mode, 0o755)
	if err != nil {
		return err
	}
	if parents {
		if fi, err := os.Stat(p); err == nil {
			if fi.IsDir() {
				return nil
			}
			return errdefs.AlreadyExists("mkdir %s: exists and is not a directory", p)
		}
		if err := f.mkdirAll(filepath.Dir(p)); err != nil {
			return osError("mkdir", filepath.Dir(p), err)
		}
	}
	if err := os.Mkdir(p, mode.Perm()); err != nil {
		switch {
		case parents && errors.Is(err, fs.ErrExist):
			if fi, serr := os.Stat(p); serr == nil && fi.IsDir() {
				return nil // created concurrently
			}
			return errdefs.AlreadyExists("mkdir %s: exists and is not a directory", p)
		case errors.Is(err, fs.ErrExist):
			return errdefs.AlreadyExists("mkdir %s: already exists", p)
		case errors.Is(err, fs.ErrNotExist):
			return errdefs.NotFound("mkdir %s: parent directory %s does not exist", p, filepath.Dir(p))
		}
		return osError("mkdir", p, err)
	}
	if err := f.chown(p); err != nil {
		return osError("chown", p, err)
	}
	if err := os.Chmod(p, mode); err != nil {
		return osError("chmod", p, err)
	}
	return nil
}

// move renames src to dst. The parent of dst must exist. Without overwrite,
// an existing dst is AlreadyExists (checked just before the rename: a dst
// created in between by another process is replaced). With overwrite, rename
// semantics apply: a file replaces a file, a directory replaces an empty
// directory, and any other combination is FailedPrecondition. Moving a
// directory into itself is InvalidArgument. Across file systems, files and
// symlinks are copied and then removed; directories are FailedPrecondition.
func (f *FS) move(ctx context.Context, src, dst string, overwrite bool) error {
	s, err := checkPath("source", src, false)
	if err != nil {
		return err
	}
	d, err := checkPath("destination", dst, false)
	if err != nil {
		return err
	}
	sfi, err := os.Lstat(s)
	if err != nil {
		return osError("move: source", s, err)
	}
	if s == d {
		return nil
	}
	if strings.HasPrefix(d, s+"/") {
		return errdefs.InvalidArgument("destination", "%s is inside the source %s", d, s)
	}
	if err := checkParent(d); err != nil {
		return err
	}
	dfi, err := os.Lstat(d)
	switch {
	case err == nil && !overwrite:
		return errdefs.AlreadyExists("move %s: destination %s already exists (set overwrite to replace it)", s, d)
	case err == nil:
		if sfi.IsDir() && !dfi.IsDir() {
			return errdefs.FailedPrecondition("move %s: cannot replace non-directory %s with a directory", s, d)
		}
		if !sfi.IsDir() && dfi.IsDir() {
			return errdefs.FailedPrecondition("move %s: cannot replace directory %s with a non-directory", s, d)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return osError("move: destination", d, err)
	}

	// syscall.Rename, not os.Rename: os.Rename refuses to replace any
	// directory, even an empty one, which rename(2) allows.
	err = syscall.Rename(s, d)
	switch {
	case err == nil:
		if err := f.chown(d); err != nil {
			return osError("move: chown", d, err)
		}
		return nil
	case errors.Is(err, syscall.EXDEV):
		if err := f.moveAcross(s, d, sfi, overwrite); err != nil {
			return err
		}
		if err := f.chown(d); err != nil {
			return osError("move: chown", d, err)
		}
		return nil
	case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST) && overwrite:
		return errdefs.FailedPrecondition("move %s: destination %s is a non-empty directory", s, d)
	case errors.Is(err, syscall.EINVAL):
		return errdefs.InvalidArgument("destination", "cannot move %s to %s", s, d)
	}
	return osError("move "+s+" to", d, err)
}

// moveAcross moves a file or symlink to another file system by copying it
// next to dst, renaming the copy into place and removing src.
func (f *FS) moveAcross(s, d string, sfi fs.FileInfo, overwrite bool) error {
	var tmp string
	switch m := sfi.Mode(); {
	case m.IsRegular():
		src, err := os.Open(s)
		if err != nil {
			return osError("move: open", s, err)
		}
		defer src.Close()
		t, err := f.writeTemp(context.Background(), d, filepath.Dir(d), m&modeBits, src, false)
		if err != nil {
			return err
		}
		tmp = t.name
		_ = os.Chtimes(tmp, sfi.ModTime(), sfi.ModTime())
	case m&fs.ModeSymlink != 0:
		target, err := os.Readlink(s)
		if err != nil {
			return osError("move: readlink", s, err)
		}
		tmp = filepath.Join(filepath.Dir(d), ".berth-move-"+filepath.Base(d)+"-"+randSuffix())
		if err := os.Symlink(target, tmp); err != nil {
			return osError("move: symlink", d, err)
		}
	default:
		return errdefs.FailedPrecondition("move %s to %s: moving a %s across file systems is not supported; copy it and remove the source instead",
			s, d, newFileInfo(s, sfi).Type)
	}
	if err := commitTemp(tmp, d, !overwrite); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Remove(s); err != nil {
		return osError("move: remove source", s, err)
	}
	return nil
}

// remove deletes path: a file, a symlink (not its target), an empty
// directory, or with recursive any directory and everything below it.
// A missing path is NotFound, a non-empty directory without recursive is
// FailedPrecondition, and "/" is refused as InvalidArgument.
func (f *FS) remove(ctx context.Context, path string, recursive bool) error {
	p, err := checkPath("path", path, false)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return osError("remove", p, err)
	}
	if fi.IsDir() && recursive {
		if err := os.RemoveAll(p); err != nil {
			return osError("remove", p, err)
		}
		return nil
	}
	if err := os.Remove(p); err != nil {
		if fi.IsDir() && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) {
			return errdefs.FailedPrecondition("remove %s: directory is not empty (set recursive to remove it and its contents)", p)
		}
		return osError("remove", p, err)
	}
	return nil
}

// checkParent checks that the directory that will hold p exists.
func checkParent(p string) error {
	dir := filepath.Dir(p)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("parent directory %s of %s does not exist", dir, p)
	case err != nil:
		return osError("stat", dir, err)
	case !fi.IsDir():
		return errdefs.FailedPrecondition("parent %s of %s is not a directory", dir, p)
	}
	return nil
}
