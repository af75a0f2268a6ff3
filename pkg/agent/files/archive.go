package files

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"time"

	"github.com/berth-dev/berth/pkg/agent/files/archive"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// ArchiveWriters is how many small files an archive upload writes at once
// (archive.ExtractOptions.Parallel): in a Docker sandbox on fuse-overlayfs
// 8 writers create 10,000 files in three quarters of the time one takes.
// Under Config.AsUser one writes, on the thread that carries the identity.
const ArchiveWriters = 8

// ArchiveUploadOptions describe an archive upload (ExtractArchive).
type ArchiveUploadOptions struct {
	// Path is the absolute target directory.
	Path string
	// CreateParents creates the missing parents of a missing target (mode
	// 0755, given to the default user). Default false: NotFound.
	CreateParents bool
	// Gzip says the stream is gzip-compressed.
	Gzip bool
}

// ArchiveDownloadOptions describe an archive download (WriteArchive).
type ArchiveDownloadOptions struct {
	// Gzip compresses the stream.
	Gzip bool
	// FollowLink archives what the path points to when it is a symlink.
	FollowLink bool
}

// ExtractArchive extracts the tar stream r into the directory opts.Path,
// atomically, as the service's identity; what it creates goes to the
// default user (Config.Chown). See package archive for the semantics
// (rename of a new directory, merge into an existing one) and the entries
// refused (InvalidArgument naming the entry). A failure leaves nothing
// behind. Errors are errdefs categories with the target's path.
func (f *FS) ExtractArchive(ctx context.Context, opts ArchiveUploadOptions, r io.Reader) (res archive.Result, err error) {
	p, err := checkPath("path", opts.Path, true)
	if err != nil {
		return res, err
	}
	if opts.Gzip {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return res, errdefs.InvalidArgument("archive", "not a gzip stream: %v", err)
		}
		defer zr.Close()
		r = zr
	}
	start := time.Now()
	parallel := ArchiveWriters
	if f.asUser != nil {
		parallel = 1 // the writers would not carry the thread's fsuid
	}
	err = f.as(func() error {
		res, err = archive.Extract(ctx, p, r, archive.ExtractOptions{
			CreateParents: opts.CreateParents, MkdirAll: f.mkdirAll, Chown: f.chownFn, Parallel: parallel,
		})
		return err
	})
	if err != nil {
		err = archiveError("extract archive into", p, err)
		if errdefs.IsCanceled(err) {
			f.log.Info("archive upload cancelled", "path", p, "error", err)
		} else {
			f.log.Warn("archive upload failed", "path", p, "error", err)
		}
		return res, err
	}
	f.log.Debug("archive upload complete", "path", p, "entries", res.Entries, "size", res.Bytes, "duration", time.Since(start))
	return res, nil
}

// StatArchive checks that path can be archived (it exists; with
// followLink a symlink is followed) before a response starts, so that the
// error can still be an answer of its own.
func (f *FS) StatArchive(ctx context.Context, path string, followLink bool) (fi FileInfo, err error) {
	p, err := checkPath("path", path, true)
	if err != nil {
		return fi, err
	}
	err = f.as(func() error {
		stat := os.Lstat
		if followLink {
			stat = os.Stat
		}
		st, err := stat(p)
		if err != nil {
			return osError("archive", p, err)
		}
		fi = newFileInfo(p, st)
		return nil
	})
	return fi, err
}

// WriteArchive writes the tar archive of the file or directory at path to
// w (entries named after its base name: "src/", "src/a", ...), as the
// service's identity. Errors after the first byte cut the archive short;
// callers must make the break visible (a gRPC error, an aborted HTTP body).
func (f *FS) WriteArchive(ctx context.Context, path string, w io.Writer, opts ArchiveDownloadOptions) error {
	p, err := checkPath("path", path, true)
	if err != nil {
		return err
	}
	var zw *gzip.Writer
	if opts.Gzip {
		zw, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		w = zw
	}
	err = f.as(func() error {
		return archive.Write(ctx, w, p, archive.WriteOptions{FollowLink: opts.FollowLink})
	})
	if err == nil && zw != nil {
		err = zw.Close()
	}
	return archiveError("archive", p, err)
}

// archiveError gives an archive error its category: the ones package
// archive set are kept, the file system's are classified (osError).
func archiveError(op, p string, err error) error {
	if err == nil {
		return nil
	}
	for _, cat := range []error{
		errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrFailedPrecondition,
		errdefs.ErrAlreadyExists, errdefs.ErrPermissionDenied, errdefs.ErrResourceExhausted,
	} {
		if errors.Is(err, cat) {
			return err
		}
	}
	return osError(op, p, err)
}
