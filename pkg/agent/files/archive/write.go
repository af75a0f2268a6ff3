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
	"syscall"
	"time"
)

// WriteOptions configure Write.
type WriteOptions struct {
	// Name is the name of the top entry, and the prefix of the others:
	// "src" gives "src/", "src/a", ... Default: the base name of the path
	// written (as `docker cp` and `tar c src` do). "." gives "./" for the
	// top directory and bare names below it ("a", "b/c"), as `tar c -C src .`
	// does.
	Name string
	// FollowLink follows the path itself when it is a symlink (docker cp
	// -L); symlinks below it are never followed.
	FollowLink bool
}

// Write writes the tar archive of the file or directory tree at src
// (absolute) to w: see the package documentation. A missing src is
// errdefs.ErrNotFound (through its syscall.Errno), reported before anything
// is written. A file that shrinks while it is read fails the archive.
// Write checks ctx between entries and does not close w.
func Write(ctx context.Context, w io.Writer, src string, opts WriteOptions) error {
	stat := os.Lstat
	if opts.FollowLink {
		stat = os.Stat
	}
	fi, err := stat(src)
	if err != nil {
		return err
	}
	name := opts.Name
	if name == "" {
		name = filepath.Base(src)
	}
	if opts.FollowLink && fi.IsDir() {
		// The walk below does not follow a symlink at its root.
		if src, err = filepath.EvalSymlinks(src); err != nil {
			return err
		}
	}
	aw := &writer{ctx: ctx, tw: tar.NewWriter(w), inodes: map[[2]uint64]string{}}
	if err := aw.add(src, name, fi); err != nil {
		return err
	}
	if fi.IsDir() {
		if err := aw.tree(src, name); err != nil {
			return err
		}
	}
	return aw.tw.Close()
}

type writer struct {
	ctx    context.Context
	tw     *tar.Writer
	inodes map[[2]uint64]string // (dev, inode) of files with several links → first name
	buf    []byte
}

// tree adds the entries below the directory dir, in lexical order.
func (aw *writer) tree(dir, name string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("archive %s: %w", p, err)
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // vanished since the directory was read
		}
		if err != nil {
			return fmt.Errorf("archive %s: %w", p, err)
		}
		return aw.add(p, path.Join(name, filepath.ToSlash(rel)), fi)
	})
}

// add writes the entry of p (described by fi) named name.
func (aw *writer) add(p, name string, fi fs.FileInfo) error {
	if err := aw.ctx.Err(); err != nil {
		return err
	}
	var link string
	switch m := fi.Mode(); {
	case m.IsRegular(), m.IsDir():
	case m&fs.ModeSymlink != 0:
		t, err := os.Readlink(p)
		if err != nil {
			return fmt.Errorf("archive %s: %w", p, err)
		}
		link = t
	default:
		return nil // sockets, devices, FIFOs: not copied
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	hdr.Name = name
	if fi.IsDir() {
		if name == "." {
			hdr.Name = "./"
		} else {
			hdr.Name = name + "/"
		}
	}
	hdr.Uname, hdr.Gname = "", ""
	// Whole seconds, as docker cp keeps them: sub-second times would cost
	// a PAX record per entry.
	hdr.ModTime = hdr.ModTime.Truncate(time.Second)
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX // names of any length
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
		key := [2]uint64{uint64(st.Dev), uint64(st.Ino)} //nolint:unconvert // Dev is not uint64 everywhere
		if first, seen := aw.inodes[key]; seen {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return aw.header(p, hdr)
		}
		aw.inodes[key] = name
	}
	if !fi.Mode().IsRegular() {
		return aw.header(p, hdr)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	defer f.Close()
	if err := aw.header(p, hdr); err != nil {
		return err
	}
	if aw.buf == nil {
		aw.buf = make([]byte, 256<<10)
	}
	n, err := io.CopyBuffer(aw.tw, io.LimitReader(f, hdr.Size), aw.buf)
	if err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	if n < hdr.Size {
		return fmt.Errorf("archive %s: %w (file shrank while being read)", p, io.ErrUnexpectedEOF)
	}
	return nil
}

func (aw *writer) header(p string, hdr *tar.Header) error {
	if err := aw.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	return nil
}
