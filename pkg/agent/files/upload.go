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
	// NoDigest skips the SHA-256 of the content, for callers that do not
	// report UploadResult.SHA256 (which is then empty). It is ignored when
	// ExpectedSHA256 is set. Default false: the digest is computed.
	NoDigest bool
}

// UploadResult describes a completed upload.
type UploadResult struct {
	// Path is the clean absolute path written.
	Path string
	// Size is the number of bytes written.
	Size int64
	// SHA256 is the hex SHA-256 of the content; empty with
	// UploadOptions.NoDigest.
	SHA256 string
	// Created is true when no file existed at Path before the upload.
	Created bool
}

// upload writes the content of r to opts.Path. The data streams into a
// temporary file in the target's directory (named TempPrefix + random),
// hashed on the way (on a goroutine of its own, see digester, unless
// opts.NoDigest), which is then given its mode and renamed into place
// (with OverwriteFail, hard-linked into place, which fails atomically if the
// target appeared meanwhile; on file systems without hard links it falls
// back to a check and a rename, which a concurrent writer could race).
// Whatever fails — r, ctx, the disk, the expected hash — the temporary file
// is removed and the target left as it was.
//
// ctx is checked between writes; r itself must return when ctx is done if it
// can block (gRPC streams and HTTP bodies do). The data is written in full
// blocks of 256 KiB (uploadBlock), except that the chunks of a gRPC stream
// are written as they come, without a copy.
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

	t, err := f.writeTemp(ctx, p, dir, mode, r, want != "" || !opts.NoDigest)
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
// final path in error messages; digest says whether to hash the content.
func (f *FS) writeTemp(ctx context.Context, target, dir string, mode fs.FileMode, r io.Reader, digest bool) (t tempFile, err error) {
	tf, err := os.CreateTemp(dir, TempPrefix+"*")
	if err != nil {
		return t, osError("upload: create temporary file in", dir, err)
	}
	var d *digester
	if digest {
		d = newDigester()
	}
	defer func() {
		if err != nil {
			d.abort()
			tf.Close()
			os.Remove(tf.Name())
		}
	}()
	c := &uploadCopy{ctx: ctx, f: tf, target: target, d: d}
	n, cerr := c.copy(r)
	if cerr != nil {
		switch {
		case c.err != nil:
			return t, c.err
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
	return tempFile{name: tf.Name(), size: n, sum: d.sum()}, nil
}

// chunkSource is a source whose chunks belong to the caller once returned
// (the source never uses them again), so they can be written and hashed
// without a copy, and those of a block's capacity go to the block pool
// after (see chunkBlock). uploadStream is one.
type chunkSource interface {
	// nextChunk returns the next non-empty chunk, or io.EOF at the end.
	nextChunk() ([]byte, error)
}

// uploadCopy copies an upload's data into its temporary file, handing
// every block to the digester on the way, and checks ctx before every
// write.
type uploadCopy struct {
	ctx    context.Context
	f      *os.File
	target string
	d      *digester // nil: no digest
	err    error     // the writer's own failure, as opposed to the reader's
}

// copy copies r to the file until r ends and returns the bytes written.
// A chunkSource's chunks are written as they come; any other reader is
// read in blocks of uploadBlock bytes, each filled before it is written, so
// the file gets few, large writes whatever sizes the reads return.
func (c *uploadCopy) copy(r io.Reader) (int64, error) {
	var n int64
	if cs, ok := r.(chunkSource); ok {
		for {
			b, err := cs.nextChunk()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return n, nil
				}
				return n, err
			}
			if err := c.write(b, chunkBlock(b)); err != nil {
				return n, err
			}
			n += int64(len(b))
		}
	}
	bp := getBlock()
	defer func() { putBlock(bp) }()
	for {
		m, rerr := fill(r, *bp)
		if m > 0 {
			b := (*bp)[:m]
			if c.d != nil {
				// The digester owns the block now and gives it back to the
				// pool once hashed; the next one is another.
				owned := bp
				bp = nil
				if err := c.write(b, owned); err != nil {
					return n, err
				}
				bp = getBlock()
			} else if err := c.write(b, nil); err != nil {
				return n, err
			}
			n += int64(m)
		}
		if errors.Is(rerr, io.EOF) {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// write writes b to the file, then hands it to the digester. A non-nil
// block is the pooled block b lies in, which write takes over: the
// digester gives it back to the pool once it has hashed b.
func (c *uploadCopy) write(b []byte, block *[]byte) error {
	if err := c.ctx.Err(); err != nil {
		putBlock(block)
		c.err = fmt.Errorf("upload %s: %w", c.target, err)
		return c.err
	}
	// The file first, then the digester: the digester gives the block
	// back to the pool once it has hashed it, and the block must not be
	// reused while the write still reads it. The hash of this block still
	// runs beside the read and write of the next.
	if _, err := c.f.Write(b); err != nil {
		putBlock(block)
		c.err = osError("upload: write", c.target, err)
		return c.err
	}
	if c.d != nil {
		c.d.add(b, block)
	} else {
		putBlock(block)
	}
	return nil
}

// uploadBlock is the size of the blocks an upload from a plain reader is
// read in and written (and hashed) by, and the largest gRPC chunk Codec
// decodes into a pooled block. Larger writes were dearer where it was
// measured (docs/benchmarks.md, issue 25): with 1 MiB blocks the median CPU
// of a REST upload rose from 1.7-1.9 to 2.8-3.3 s/GiB, the extra in the
// kernel's copy into the page cache (on a virtual machine with free page
// reporting, whose host must map fresh memory again; presumably larger
// writes get larger folios, from such memory).
const uploadBlock = ChunkSize

var blockPool = sync.Pool{New: func() any { b := make([]byte, uploadBlock); return &b }}

func getBlock() *[]byte { return blockPool.Get().(*[]byte) }

// putBlock gives a block from getBlock back; nil is ignored.
func putBlock(b *[]byte) {
	if b != nil {
		blockPool.Put(b)
	}
}

// hashQueue is how many blocks may wait for the hashing goroutine before
// the copy waits for it.
const hashQueue = 2

// digester computes an upload's SHA-256 off the copy's path: from the
// second block on, a goroutine of its own hashes each block while the
// copy writes it and reads the next, so that on more than one core the
// hash adds CPU time but little wall time. The first block waits for the
// second, so an upload of one block (most files) is hashed inline, at the
// end, without a goroutine. The methods of a nil digester do nothing.
type digester struct {
	h     hash.Hash
	first hashBlock // the first block, until the goroutine starts
	work  chan hashBlock
	done  chan struct{}
}

// hashBlock is a block to hash and, if pooled, the pool block to give
// back once it is hashed.
type hashBlock struct {
	b    []byte
	pool *[]byte
}

func newDigester() *digester { return &digester{h: sha256.New()} }

// add queues b for hashing; it blocks while hashQueue blocks wait. The
// caller does not write to b again; block (if not nil) goes back to the
// pool once b is hashed.
func (d *digester) add(b []byte, block *[]byte) {
	if d == nil {
		return
	}
	hb := hashBlock{b: b, pool: block}
	if d.work == nil {
		if d.first.b == nil {
			d.first = hb
			return
		}
		d.work = make(chan hashBlock, hashQueue)
		d.done = make(chan struct{})
		go d.run()
		d.work <- d.first
		d.first = hashBlock{}
	}
	d.work <- hb
}

func (d *digester) run() {
	defer close(d.done)
	for hb := range d.work {
		d.h.Write(hb.b)
		putBlock(hb.pool)
	}
}

// wait hashes what is queued and stops the goroutine.
func (d *digester) wait() {
	if d.work != nil {
		close(d.work)
		<-d.done
		d.work = nil
	}
	if d.first.b != nil {
		d.h.Write(d.first.b)
		putBlock(d.first.pool)
		d.first = hashBlock{}
	}
}

// abort ends a digest whose upload failed.
func (d *digester) abort() {
	if d != nil {
		d.wait()
	}
}

// sum returns the hex SHA-256 of every block added; "" from a nil digester.
func (d *digester) sum() string {
	if d == nil {
		return ""
	}
	d.wait()
	return hex.EncodeToString(d.h.Sum(nil))
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
