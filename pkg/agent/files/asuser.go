package files

import (
	"context"
	"io"
	"io/fs"
)

// Identity is a file-system identity the file service can act as.
type Identity struct {
	// UID and GID become the file-system uid and gid of each operation.
	UID, GID uint32
}

// Open opens the regular file at path for reading from offset, at most
// length bytes (0: to the end), as the service's identity (Config.AsUser);
// see open for the details and errors.
func (f *FS) Open(ctx context.Context, path string, offset, length int64) (r *Reader, err error) {
	err = f.as(func() error { r, err = f.open(ctx, path, offset, length); return err })
	return r, err
}

// Stat describes path without following a final symlink; see stat.
func (f *FS) Stat(ctx context.Context, path string) (fi FileInfo, err error) {
	err = f.as(func() error { fi, err = f.stat(ctx, path); return err })
	return fi, err
}

// List lists the directory at path down to depth levels; see list.
func (f *FS) List(ctx context.Context, path string, depth int) (res ListResult, err error) {
	err = f.as(func() error { res, err = f.list(ctx, path, depth); return err })
	return res, err
}

// MakeDir creates the directory path with mode; see makeDir.
func (f *FS) MakeDir(ctx context.Context, path string, parents bool, mode fs.FileMode) error {
	return f.as(func() error { return f.makeDir(ctx, path, parents, mode) })
}

// Move renames src to dst; see move.
func (f *FS) Move(ctx context.Context, src, dst string, overwrite bool) error {
	return f.as(func() error { return f.move(ctx, src, dst, overwrite) })
}

// Remove deletes path (recursively if asked); see remove.
func (f *FS) Remove(ctx context.Context, path string, recursive bool) error {
	return f.as(func() error { return f.remove(ctx, path, recursive) })
}

// Upload writes the content of r to opts.Path; see upload.
func (f *FS) Upload(ctx context.Context, opts UploadOptions, r io.Reader) (res UploadResult, err error) {
	err = f.as(func() error { res, err = f.upload(ctx, opts, r); return err })
	return res, err
}
