// Package archive reads and writes the tar streams of berth's directory
// copies (`orchestrator cp` of a directory, the agent's archive endpoints,
// Workspace.UploadArchive and DownloadArchive). The same code extracts on
// the host and in a sandbox, so both sides are equally strict.
//
// # Extraction
//
// Extract unpacks a tar stream into a directory atomically: the entries are
// written into a staging directory (".berth-archive-*") on the same file
// system, and only when the whole stream was read and every entry checked
// is the result put in place — renamed to the target when the target did
// not exist, merged into it when it did (see Extract). A refused entry, a
// broken or truncated stream or a cancelled context removes the staging
// directory: nothing is left behind.
//
// Entries are refused (errdefs.ErrInvalidArgument naming the entry) when
// their name is absolute or escapes the target ("../x", "a/../../x"), when
// a parent of theirs is a symlink of the archive ("link/file" after "link
// -> /etc"), when a symlink points outside the target (an absolute target,
// or more ".." than the link is deep, or a ".." after a name, which could
// climb out through another link), when a hard link names something that
// is not an earlier regular file of the archive, and for devices and FIFOs.
// Nothing is ever written through a symlink: files are created with
// O_EXCL|O_NOFOLLOW in a staging directory only the extracting user can
// enter.
//
// Modes (permission, setuid, setgid and sticky bits) and modification times
// are kept, for symlinks too; owners are not taken from the archive: what is
// created belongs to the extracting user, or to whom ExtractOptions.Chown
// gives it.
//
// # Writing
//
// Write produces the archive of a file or directory tree as `docker cp` and
// `tar` do: entries in lexical order, directories before their contents,
// symlinks as symlinks (never followed, but the top one with
// WriteOptions.FollowLink), hard links of regular files as hard-link
// entries, modes, times (whole seconds) and numeric owners kept; sockets, devices and FIFOs
// are skipped.
package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// StagingPrefix starts the name of the staging directory of an extraction.
const StagingPrefix = ".berth-archive-"

// maxTrailer bounds what is read (and discarded) after the end-of-archive
// marker: tar pads archives to a 10 KiB record, some writers to more.
const maxTrailer = 1 << 20

// ExtractOptions configure Extract.
type ExtractOptions struct {
	// CreateParents creates the missing parents of a missing target with
	// MkdirAll. Default false: a missing parent is errdefs.ErrNotFound.
	CreateParents bool
	// MkdirAll creates the missing parents (and gives them away); default
	// os.MkdirAll(dir, 0o755).
	MkdirAll func(dir string) error
	// Chown, when set, is called on every file, directory, symlink and
	// hard link created (before its mode is set; symlinks must not be
	// followed, use os.Lchown), and on the target when it is created.
	// Default nil: they belong to the extracting user.
	Chown func(path string) error
	// StripComponents drops that many leading components of every entry
	// name (and hard-link target), as tar's --strip-components does, except
	// that the entry of the stripped directory itself becomes the target's
	// own entry ("."): `src/`, `src/a` with 1 give ".", "a". Entries with
	// fewer components are skipped.
	StripComponents int
	// Parallel is how many small files (up to 1 MiB) are written at once;
	// default 1. Where each file creation is a round trip (FUSE, as
	// Docker's fuse-overlayfs; network file systems) 4 to 8 save a
	// quarter of the time. The writers run on other goroutines, so leave
	// it at 1 when the calling thread carries an identity of its own (a
	// file-system uid set with setfsuid) that the files must be written
	// with.
	Parallel int
}

// Result describes a completed extraction.
type Result struct {
	// Path is the target directory.
	Path string
	// Entries counts the entries extracted (the target's own "." entry
	// included when the archive has one).
	Entries int64
	// Bytes counts the bytes of the regular files written.
	Bytes int64
	// Created is true when the target did not exist before.
	Created bool
}

// Extract reads the tar stream r and puts its entries below the directory
// dir (absolute and clean), atomically:
//
//   - dir does not exist: the entries are written into a staging directory
//     beside it (its parent must exist, or CreateParents) that is renamed
//     to dir at the end. An entry "." (as `tar c .` writes) gives dir its
//     mode and time; without one dir gets 0755.
//   - dir is a directory: the entries are written into a staging directory
//     inside it and then merged into it, as `tar x` and `docker cp` do: a
//     new path is renamed into place (a new directory whole, at once), a
//     file replaces a file or symlink, a directory merges into a directory
//     (what the archive does not name is kept). A directory over a
//     non-directory, or the reverse, is errdefs.ErrFailedPrecondition,
//     found before anything is moved; existing symlinks are never
//     followed.
//   - dir is something else: errdefs.ErrFailedPrecondition.
//
// When anything fails before the merge the staging directory is removed and
// dir is as it was. Errors: errdefs.ErrInvalidArgument for a refused entry
// (see the package documentation) or a stream that is not tar (a truncated
// one included), ErrNotFound for a missing parent, the context's error,
// else the file system's error wrapped (errors.As finds its syscall.Errno).
func Extract(ctx context.Context, dir string, r io.Reader, opts ExtractOptions) (Result, error) {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return Result{}, errdefs.InvalidArgument("path", "must be an absolute, clean path, got %q", dir)
	}
	res := Result{Path: dir}
	fi, err := os.Stat(dir)
	var staging string
	switch {
	case err == nil && !fi.IsDir():
		return res, errdefs.FailedPrecondition("extract into %s: not a directory", dir)
	case err == nil:
		staging, err = os.MkdirTemp(dir, StagingPrefix+"*")
	case errors.Is(err, fs.ErrNotExist):
		res.Created = true
		parent := filepath.Dir(dir)
		if err := checkParent(parent, dir, opts); err != nil {
			return res, err
		}
		staging, err = os.MkdirTemp(parent, StagingPrefix+"*")
	default:
		return res, fmt.Errorf("extract into %s: %w", dir, err)
	}
	if err != nil {
		return res, fmt.Errorf("extract into %s: create staging directory: %w", dir, err)
	}
	committed := false
	defer func() {
		if !committed {
			os.RemoveAll(staging)
		}
	}()

	x := &extractor{ctx: ctx, root: staging, opts: opts, files: map[string]bool{}, links: map[string]bool{}, known: map[string]bool{}}
	if opts.Parallel > 1 {
		x.pool = newPool(x, opts.Parallel)
		defer x.pool.stop() // before the staging directory may be removed (deferred earlier, runs later)
	}
	if err := x.readAll(r, &res); err != nil {
		return res, err
	}
	if res.Created {
		if err := x.commitNew(dir); err != nil {
			return res, err
		}
		committed = true
		return res, nil
	}
	return res, x.merge(dir)
}

// checkParent checks (or creates) the parent of a missing target.
func checkParent(parent, dir string, opts ExtractOptions) error {
	pfi, err := os.Stat(parent)
	switch {
	case err == nil && !pfi.IsDir():
		return errdefs.FailedPrecondition("extract into %s: parent %s is not a directory", dir, parent)
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("extract into %s: %w", dir, err)
	case !opts.CreateParents:
		return errdefs.NotFound("parent directory %s of %s does not exist", parent, dir)
	}
	mkdirAll := opts.MkdirAll
	if mkdirAll == nil {
		mkdirAll = func(d string) error { return os.MkdirAll(d, 0o755) }
	}
	if err := mkdirAll(parent); err != nil {
		return fmt.Errorf("extract into %s: create parent: %w", dir, err)
	}
	return nil
}

// extractor holds the state of one extraction into its staging directory.
type extractor struct {
	ctx   context.Context
	root  string // the staging directory
	opts  ExtractOptions
	files map[string]bool // regular files written (hard-link targets)
	links map[string]bool // symlinks written (never parents)
	known map[string]bool // directories made or checked (saves a stat per entry)
	pool  *pool           // writes small files in parallel; nil: inline
	dirs  []dirMeta       // directories to give their mode and time last
	self  *dirMeta        // the "." entry
}

type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

func refuse(name, format string, args ...any) error {
	return errdefs.InvalidArgument("archive", "entry %q: %s", name, fmt.Sprintf(format, args...))
}

// readAll extracts every entry of r into the staging directory and then
// drains the padding after the end-of-archive marker.
func (x *extractor) readAll(r io.Reader, res *Result) error {
	zr := &zeroTail{r: r}
	tr := tar.NewReader(zr)
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// The end-of-archive marker (two zero blocks) must be there:
			// an archive cut at an entry boundary is still cut.
			if zr.zeros < 2*512 {
				return errdefs.InvalidArgument("archive", "not a complete tar stream: no end-of-archive marker")
			}
			break
		}
		if err != nil {
			return x.readErr(err)
		}
		n, err := x.entry(tr, hdr)
		if err != nil {
			return err
		}
		if n >= 0 {
			res.Entries++
			res.Bytes += n
		}
	}
	// The padding after the marker; a stream that breaks here still fails.
	if _, err := io.CopyN(io.Discard, r, maxTrailer); err != nil && !errors.Is(err, io.EOF) {
		return x.readErr(err)
	}
	if err := x.flush(); err != nil {
		return err
	}
	// Directories last, deepest first, so their times survive their
	// children and a read-only directory still took them.
	sort.SliceStable(x.dirs, func(i, j int) bool { return len(x.dirs[i].name) > len(x.dirs[j].name) })
	for _, d := range x.dirs {
		if err := x.setMeta(filepath.Join(x.root, d.name), d.mode, d.mtime, false); err != nil {
			return fmt.Errorf("extract %s: %w", d.name, err)
		}
	}
	return nil
}

// zeroTail counts the zero bytes at the end of what was read.
type zeroTail struct {
	r     io.Reader
	zeros int64
}

func (z *zeroTail) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	for i := n - 1; i >= 0; i-- {
		if p[i] != 0 {
			z.zeros = int64(n - 1 - i)
			return n, err
		}
	}
	z.zeros += int64(n)
	return n, err
}

// readErr classifies an error of the tar reader: the context's, a
// malformed or truncated archive (InvalidArgument), or the source's.
func (x *extractor) readErr(err error) error {
	if cerr := x.ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrFieldTooLong) {
		return errdefs.InvalidArgument("archive", "not a complete tar stream: %v", err)
	}
	return fmt.Errorf("extract: reading the archive: %w", err)
}

// entryName checks and cleans an entry name (or hard-link target) and
// applies StripComponents; ok is false for an entry to skip.
func (x *extractor) entryName(raw string) (name string, ok bool, err error) {
	if raw == "" {
		return "", false, refuse(raw, "empty name")
	}
	if strings.HasPrefix(raw, "/") {
		return "", false, refuse(raw, "absolute path")
	}
	if strings.IndexByte(raw, 0) >= 0 {
		return "", false, refuse(raw, "NUL byte in name")
	}
	name = path.Clean(raw)
	if name == ".." || strings.HasPrefix(name, "../") {
		return "", false, refuse(raw, "escapes the target directory")
	}
	if n := x.opts.StripComponents; n > 0 {
		if name == "." {
			return "", false, nil
		}
		parts := strings.SplitN(name, "/", n+1)
		switch {
		case len(parts) < n:
			return "", false, nil
		case len(parts) == n:
			name = "."
		default:
			name = parts[n]
		}
	}
	return name, true, nil
}

// entry extracts one entry and returns the bytes of file data written, or
// -1 for an entry skipped.
func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) (int64, error) {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return -1, nil
	}
	name, ok, err := x.entryName(hdr.Name)
	if err != nil || !ok {
		return -1, err
	}
	if err := x.checkParents(name, hdr.Name); err != nil {
		return -1, err
	}
	mode := fs.FileMode(hdr.Mode) & fs.ModePerm
	if hdr.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if hdr.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	p := filepath.Join(x.root, name)
	switch hdr.Typeflag {
	case tar.TypeDir:
		return 0, x.dir(name, p, mode, hdr.ModTime)
	case tar.TypeReg, tar.TypeGNUSparse: // the reader reports TypeRegA entries as TypeReg
		if name == "." {
			return -1, refuse(hdr.Name, "a file cannot be the target directory itself")
		}
		return x.file(tr, name, p, mode, hdr)
	case tar.TypeSymlink:
		return 0, x.symlink(name, p, hdr)
	case tar.TypeLink:
		return 0, x.hardlink(name, p, hdr)
	}
	return -1, refuse(hdr.Name, "type %q is not supported (only files, directories, symlinks and hard links)", hdr.Typeflag)
}

// checkParents refuses an entry below a symlink of the archive and makes
// its missing parent directories.
func (x *extractor) checkParents(name, raw string) error {
	if name == "." {
		return nil
	}
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if x.links[d] {
			return refuse(raw, "its parent %q is a symlink", d)
		}
	}
	parent := path.Dir(name)
	if parent == "." {
		return nil
	}
	return x.mkdirs(parent)
}

// mkdirs creates the missing directories of name (relative, not through
// symlinks: checkParents vetted them) with 0755, given away with Chown.
func (x *extractor) mkdirs(name string) error {
	if x.known[name] {
		return nil
	}
	p := filepath.Join(x.root, name)
	fi, err := os.Lstat(p)
	switch {
	case err == nil && fi.IsDir():
		x.known[name] = true
		return nil
	case err == nil:
		return refuse(name, "a parent is not a directory")
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("extract %s: %w", name, err)
	}
	if d := path.Dir(name); d != "." {
		if err := x.mkdirs(d); err != nil {
			return err
		}
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		return fmt.Errorf("extract %s: %w", name, err)
	}
	x.known[name] = true
	return x.chown(name, p)
}

func (x *extractor) chown(name, p string) error {
	if x.opts.Chown == nil {
		return nil
	}
	if err := x.opts.Chown(p); err != nil {
		return fmt.Errorf("extract %s: chown: %w", name, err)
	}
	return nil
}

// clear removes what an earlier entry of the same name left, as tar does;
// a directory is kept for a directory entry (reported by the bool) and
// refuses any other entry.
func (x *extractor) clear(name, p string, dirEntry bool) (bool, error) {
	if x.files[name] {
		if err := x.flush(); err != nil {
			return false, err
		}
	}
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("extract %s: %w", name, err)
	case fi.IsDir() && dirEntry:
		return true, nil
	case fi.IsDir():
		return false, refuse(name, "replaces a directory of the archive")
	}
	delete(x.files, name)
	delete(x.links, name)
	if err := os.Remove(p); err != nil {
		return false, fmt.Errorf("extract %s: %w", name, err)
	}
	return false, nil
}

func (x *extractor) dir(name, p string, mode fs.FileMode, mtime time.Time) error {
	if name == "." {
		x.self = &dirMeta{name: name, mode: mode, mtime: mtime}
		x.dirs = append(x.dirs, *x.self)
		return nil
	}
	exists, err := x.clear(name, p, true)
	if err != nil {
		return err
	}
	if !exists {
		if err := os.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
		if err := x.chown(name, p); err != nil {
			return err
		}
	}
	x.known[name] = true
	x.dirs = append(x.dirs, dirMeta{name: name, mode: mode, mtime: mtime})
	return nil
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (x *extractor) file(tr *tar.Reader, name, p string, mode fs.FileMode, hdr *tar.Header) (int64, error) {
	r := io.Reader(ctxReader{x.ctx, tr})
	if x.pool != nil && hdr.Size <= smallFile && !x.files[name] && !x.links[name] && !x.known[name] {
		// Read here, written by the pool.
		data := make([]byte, hdr.Size)
		if _, err := io.ReadFull(r, data); err != nil {
			return 0, x.readErr(err)
		}
		if err := x.pool.submit(fileJob{name: name, p: p, mode: mode, mtime: hdr.ModTime, data: data}); err != nil {
			return 0, err
		}
		x.files[name] = true
		return hdr.Size, nil
	}
	if x.files[name] {
		if err := x.flush(); err != nil { // the earlier file of that name may be in flight
			return 0, err
		}
	}
	n, err := x.writeFile(name, p, mode, hdr.ModTime, r, true)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || x.ctx.Err() != nil {
			return 0, x.readErr(err)
		}
		return 0, err
	}
	x.files[name] = true
	return n, nil
}

// writeFile creates the file p (entry name) with the content of r, its
// owner (Chown), mode and modification time. An earlier entry of that name
// is replaced when mayClear (never on the pool's goroutines, which must
// not touch the extractor's maps: the pool only gets names nothing holds).
func (x *extractor) writeFile(name, p string, mode fs.FileMode, mtime time.Time, r io.Reader, mayClear bool) (int64, error) {
	// The staging directory is new: clear an earlier entry of the same
	// name only when there is one (a stat per file is dear on FUSE).
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL | syscall.O_NOFOLLOW
	f, err := os.OpenFile(p, flags, 0o600)
	if mayClear && errors.Is(err, fs.ErrExist) {
		if _, err := x.clear(name, p, false); err != nil {
			return 0, err
		}
		f, err = os.OpenFile(p, flags, 0o600)
	}
	if err != nil {
		return 0, fmt.Errorf("extract %s: %w", name, err)
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = x.chown(name, p) // before the chmod: chown clears set-id bits
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && !mtime.IsZero() {
		ts := unix.NsecToTimeval(mtime.UnixNano())
		err = unix.Futimes(int(f.Fd()), []unix.Timeval{ts, ts})
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || x.ctx.Err() != nil {
			return n, err
		}
		return n, fmt.Errorf("extract %s: %w", name, err)
	}
	return n, nil
}

// linkInside reports whether a symlink at name pointing to target stays
// inside the extraction root however the links of the archive resolve:
// the target is relative, its leading ".." do not climb above the root,
// and no ".." follows a name (which might be a symlink climbing elsewhere).
func linkInside(name, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") {
		return false
	}
	depth := strings.Count(name, "/") // directories above the link
	seenName := false
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if seenName {
				return false
			}
			depth--
			if depth < 0 {
				return false
			}
		default:
			seenName = true
		}
	}
	return true
}

func (x *extractor) symlink(name, p string, hdr *tar.Header) error {
	if name == "." {
		return refuse(hdr.Name, "a symlink cannot be the target directory itself")
	}
	if !linkInside(name, hdr.Linkname) {
		return refuse(hdr.Name, "symlink to %q points outside the target directory", hdr.Linkname)
	}
	if _, err := x.clear(name, p, false); err != nil {
		return err
	}
	if err := os.Symlink(hdr.Linkname, p); err != nil {
		return fmt.Errorf("extract %s: %w", name, err)
	}
	if err := x.chown(name, p); err != nil {
		return err
	}
	if err := x.setMeta(p, 0, hdr.ModTime, true); err != nil {
		return fmt.Errorf("extract %s: %w", name, err)
	}
	x.links[name] = true
	return nil
}

func (x *extractor) hardlink(name, p string, hdr *tar.Header) error {
	target, ok, err := x.entryName(hdr.Linkname)
	if err != nil {
		return refuse(hdr.Name, "hard link to %q points outside the target directory", hdr.Linkname)
	}
	if !ok || !x.files[target] {
		return refuse(hdr.Name, "hard link to %q, which is not an earlier file of the archive", hdr.Linkname)
	}
	if target == name {
		return nil
	}
	if err := x.flush(); err != nil { // the target may be in flight
		return err
	}
	if _, err := x.clear(name, p, false); err != nil {
		return err
	}
	if err := os.Link(filepath.Join(x.root, target), p); err != nil {
		return fmt.Errorf("extract %s: %w", name, err)
	}
	x.files[name] = true
	return nil
}

// setMeta sets the mode (not for symlinks) and the modification time.
func (x *extractor) setMeta(p string, mode fs.FileMode, mtime time.Time, symlink bool) error {
	if !symlink {
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	if mtime.IsZero() {
		return nil
	}
	ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	flags := 0
	if symlink {
		flags = unix.AT_SYMLINK_NOFOLLOW
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, flags)
}

// commitNew renames the staging directory to the missing target dir and
// gives it its mode (the "." entry's, else 0755) and owner.
func (x *extractor) commitNew(dir string) error {
	if x.self == nil {
		if err := os.Chmod(x.root, 0o755); err != nil {
			return fmt.Errorf("extract into %s: %w", dir, err)
		}
	}
	if err := x.chown(".", x.root); err != nil {
		return err
	}
	if err := os.Rename(x.root, dir); err != nil {
		if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
			return errdefs.FailedPrecondition("extract into %s: it appeared meanwhile", dir)
		}
		return fmt.Errorf("extract into %s: rename into place: %w", dir, err)
	}
	return nil
}

// merge moves the staged entries into the existing directory dir (see
// Extract), after checking that no entry changes a path's kind, and then
// removes the staging directory.
func (x *extractor) merge(dir string) error {
	if err := mergeCheck(x.root, dir); err != nil {
		return err
	}
	meta := make(map[string]dirMeta, len(x.dirs))
	for _, d := range x.dirs {
		meta[d.name] = d
	}
	if err := x.mergeDir(".", dir, meta); err != nil {
		return err
	}
	if err := os.RemoveAll(x.root); err != nil {
		return fmt.Errorf("extract into %s: remove staging directory: %w", dir, err)
	}
	return nil
}

// mergeCheck walks the staged tree src against dst: a staged directory
// over an existing non-directory, or a staged non-directory over an
// existing directory, is FailedPrecondition.
func mergeCheck(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	for _, e := range ents {
		d := filepath.Join(dst, e.Name())
		fi, err := os.Lstat(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("extract into %s: %w", d, err)
		}
		switch {
		case e.IsDir() && fi.IsDir():
			if err := mergeCheck(filepath.Join(src, e.Name()), d); err != nil {
				return err
			}
		case e.IsDir():
			return errdefs.FailedPrecondition("extract: cannot overwrite non-directory %s with a directory", d)
		case fi.IsDir():
			return errdefs.FailedPrecondition("extract: cannot overwrite directory %s with a non-directory", d)
		}
	}
	return nil
}

// mergeDir moves the entries of the staged directory name into the
// existing directory dst: what dst lacks is renamed into place, directories
// in both are merged, anything else replaces dst's entry. A merged
// directory that the archive named gets its mode and time (meta) after its
// entries moved; one the archive only implied keeps its own.
func (x *extractor) mergeDir(name, dst string, meta map[string]dirMeta) error {
	src := filepath.Join(x.root, name)
	// Entries leave src, which may have got a read-only mode.
	if err := os.Chmod(src, 0o700); err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	for _, e := range ents {
		child, d := path.Join(name, e.Name()), filepath.Join(dst, e.Name())
		if e.IsDir() {
			if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
				if err := x.mergeDir(child, d, meta); err != nil {
					return err
				}
				continue
			}
		}
		if err := os.Rename(filepath.Join(x.root, child), d); err != nil {
			return fmt.Errorf("extract into %s: %w", d, err)
		}
	}
	if m, ok := meta[name]; ok {
		if err := x.setMeta(dst, m.mode, m.mtime, false); err != nil {
			return fmt.Errorf("extract into %s: %w", dst, err)
		}
	}
	return nil
}
