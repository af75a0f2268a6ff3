package files

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// ChunkSize is the size of the buffers uploads and downloads copy through,
// and of the chunks a gRPC download sends.
const ChunkSize = 256 << 10

// TempPrefix starts the name of every temporary upload file.
const TempPrefix = ".berth-upload-"

var bufPool = sync.Pool{New: func() any { b := make([]byte, ChunkSize); return &b }}

// OverwritePolicy says what an upload does when its target exists.
type OverwritePolicy int

const (
	// OverwriteReplace replaces an existing file (the zero value).
	OverwriteReplace OverwritePolicy = iota
	// OverwriteFail fails with AlreadyExists when the target exists.
	OverwriteFail
)

// UploadOptions describe an upload.
type UploadOptions struct {
	// Path is the absolute path of the file to write. It must not end with
	// a slash or name an existing directory.
	Path string
	// Mode is the file's mode: permission bits, optionally with
	// fs.ModeSetuid, fs.ModeSetgid and fs.ModeSticky. It is set exactly (no
	// umask). Default (zero) 0644.
	Mode fs.FileMode
	// CreateParents creates missing parent directories (mode 0755).
	// Default false: a missing parent is NotFound.
	CreateParents bool
	// Overwrite says what to do when Path exists. Default OverwriteReplace.
	Overwrite OverwritePolicy
	// ExpectedSHA256, when set, is the hex SHA-256 the content must have;
	// on a mismatch nothing is written and the upload is InvalidArgument.
	ExpectedSHA256 string
}

// UploadResult describes a completed upload.
type UploadResult struct {
	// Path is the clean absolute path written.
	Path string
	// Size is the number of bytes written.
	Size int64
	// SHA256 is the hex SHA-256 of the content.
	SHA256 string
	// Created is true when no file existed at Path before the upload.
	Created bool
}

// upload writes the content of r to opts.Path. The data streams into a
// temporary file in the target's directory (named TempPrefix + random),
// hashed on the way, which is then given its mode and renamed into place
// (with OverwriteFail, hard-linked into place, which fails atomically if the
// target appeared meanwhile; on file systems without hard links it falls
// back to a check and a rename, which a concurrent writer could race).
// Whatever fails — r, ctx, the disk, the expected hash — the temporary file
// is removed and the target left as it was.
//
// ctx is checked between writes; r itself must return when ctx is done if it
// can block (gRPC streams and HTTP bodies do). If r implements io.WriterTo
// its chunks are written without an extra copy.
//
// Errors: InvalidArgument for a bad path, mode, policy or hash;
// NotFound when the parent is missing and CreateParents is false;
// FailedPrecondition when the target (or its parent) is a directory (or
// not one); AlreadyExists under OverwriteFail; ResourceExhausted when the
// disk is full; the context's error when cancelled; r's error otherwise.
func (f *FS) upload(ctx context.Context, opts UploadOptions, r io.Reader) (UploadResult, error) {
	start := time.Now()
	if strings.HasSuffix(opts.Path, "/") && opts.Path != "/" {
		return UploadResult{}, errdefs.InvalidArgument("path", "must name a file, not end with a slash: %q", opts.Path)
	}
	p, err := checkPath("path", opts.Path, false)
	if err != nil {
		return UploadResult{}, err
	}
	mode, err := checkMode("mode", opts.Mode, 0o644)
	if err != nil {
		return UploadResult{}, err
	}
	if opts.Overwrite != OverwriteReplace && opts.Overwrite != OverwriteFail {
		return UploadResult{}, errdefs.InvalidArgument("overwrite", "unknown policy %d", opts.Overwrite)
	}
	want := strings.ToLower(opts.ExpectedSHA256)
	if want != "" {
		if b, err := hex.DecodeString(want); err != nil || len(b) != sha256.Size {
			return UploadResult{}, errdefs.InvalidArgument("sha256", "must be 64 hex digits, got %q", opts.ExpectedSHA256)
		}
	}

	dir := filepath.Dir(p)
	if err := f.prepareParent(dir, p, opts.CreateParents); err != nil {
		return UploadResult{}, err
	}
	existed := false
	switch fi, err := os.Lstat(p); {
	case err == nil && fi.IsDir():
		return UploadResult{}, errdefs.FailedPrecondition("upload %s: is a directory", p)
	case err == nil && opts.Overwrite == OverwriteFail:
		return UploadResult{}, errdefs.AlreadyExists("upload %s: file exists (overwrite policy is fail)", p)
	case err == nil:
		existed = true
	case !errors.Is(err, fs.ErrNotExist):
		return UploadResult{}, osError("upload: stat", p, err)
	}

	t, err := f.writeTemp(ctx, p, dir, mode, r)
	if err != nil {
		f.logFailure(p, err)
		return UploadResult{}, err
	}
	if want != "" && t.sum != want {
		os.Remove(t.name)
		err := errdefs.InvalidArgument("sha256", "content has SHA-256 %s, expected %s; nothing was written", t.sum, want)
		f.logFailure(p, err)
		return UploadResult{}, err
	}
	if err := commitTemp(t.name, p, opts.Overwrite == OverwriteFail); err != nil {
		os.Remove(t.name)
		f.logFailure(p, err)
		return UploadResult{}, err
	}
	if f.syncData {
		if err := syncDir(dir); err != nil {
			return UploadResult{}, osError("upload: sync directory", dir, err)
		}
	}
	f.log.Debug("upload complete", "path", p, "size", t.size, "sha256", t.sum, "duration", time.Since(start))
	return UploadResult{Path: p, Size: t.size, SHA256: t.sum, Created: !existed}, nil
}

func (f *FS) logFailure(p string, err error) {
	if errdefs.IsCanceled(err) {
		f.log.Info("upload cancelled", "path", p, "error", err)
		return
	}
	f.log.Warn("upload failed", "path", p, "error", err)
}

// prepareParent checks (or, with create, makes) the directory dir that will
// hold p.
func (f *FS) prepareParent(dir, p string, create bool) error {
	err := checkParent(p)
	if err == nil || !create || !errdefs.IsNotFound(err) {
		return err
	}
	if err := f.mkdirAll(dir); err != nil {
		return osError("upload: create parent", dir, err)
	}
	return nil
}

type tempFile struct {
	name string
	size int64
	sum  string
}

// writeTemp streams r into a new temporary file in dir with mode and
// returns it closed. On error the temporary file is gone. target names the
// final path in error messages.
func (f *FS) writeTemp(ctx context.Context, target, dir string, mode fs.FileMode, r io.Reader) (t tempFile, err error) {
	tf, err := os.CreateTemp(dir, TempPrefix+"*")
	if err != nil {
		return t, osError("upload: create temporary file in", dir, err)
	}
	defer func() {
		if err != nil {
			tf.Close()
			os.Remove(tf.Name())
		}
	}()

	w := &hashWriter{ctx: ctx, f: tf, h: sha256.New(), target: target}
	bufp := bufPool.Get().(*[]byte)
	n, cerr := io.CopyBuffer(w, r, *bufp)
	bufPool.Put(bufp)
	if cerr != nil {
		switch {
		case w.err != nil:
			return t, w.err
		case ctx.Err() != nil:
			return t, fmt.Errorf("upload %s: %w", target, ctx.Err())
		}
		return t, fmt.Errorf("upload %s: reading data: %w", target, cerr)
	}
	if err := f.chown(tf.Name()); err != nil { // before the chmod: chown clears set-id bits
		return t, osError("upload: chown", target, err)
	}
	if err := tf.Chmod(mode); err != nil {
		return t, osError("upload: chmod", target, err)
	}
	if f.syncData {
		if err := tf.Sync(); err != nil {
			return t, osError("upload: sync", target, err)
		}
	}
	if err := tf.Close(); err != nil {
		return t, osError("upload: close", target, err)
	}
	// A cancellation that raced the last write still fails the upload.
	if err := ctx.Err(); err != nil {
		return t, fmt.Errorf("upload %s: %w", target, err)
	}
	return tempFile{name: tf.Name(), size: n, sum: hex.EncodeToString(w.h.Sum(nil))}, nil
}

// hashWriter writes to a file and a hash, checking ctx before every write.
type hashWriter struct {
	ctx    context.Context
	f      *os.File
	h      hash.Hash
	target string
	err    error // the writer's own failure, as opposed to the reader's
}

func (w *hashWriter) Write(p []byte) (int, error) {
	if err := w.ctx.Err(); err != nil {
		w.err = fmt.Errorf("upload %s: %w", w.target, err)
		return 0, w.err
	}
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	if err != nil {
		w.err = osError("upload: write", w.target, err)
		return n, w.err
	}
	return n, nil
}

// commitTemp moves the complete temporary file tmp to dst. With noReplace it
// fails with AlreadyExists instead of replacing dst. On success tmp is gone;
// on failure the caller removes it.
func commitTemp(tmp, dst string, noReplace bool) error {
	if !noReplace {
		if err := os.Rename(tmp, dst); err != nil {
			if errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
				return errdefs.FailedPrecondition("upload %s: is a directory", dst)
			}
			return osError("upload: rename into", dst, err)
		}
		return nil
	}
	err := os.Link(tmp, dst)
	switch {
	case err == nil:
		os.Remove(tmp)
		return nil
	case errors.Is(err, fs.ErrExist):
		return errdefs.AlreadyExists("upload %s: file exists (overwrite policy is fail)", dst)
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.ENOTSUP), errors.Is(err, syscall.EOPNOTSUPP),
		errors.Is(err, syscall.EMLINK), errors.Is(err, syscall.ENOSYS):
		// No hard links here: check, then rename. A file created between
		// the two is replaced.
		if _, err := os.Lstat(dst); err == nil {
			return errdefs.AlreadyExists("upload %s: file exists (overwrite policy is fail)", dst)
		}
		return commitTemp(tmp, dst, false)
	}
	return osError("upload: link into", dst, err)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
