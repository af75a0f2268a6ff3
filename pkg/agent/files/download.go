package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Reader streams a byte range of a file opened by Open. Close it.
type Reader struct {
	// Info describes the whole file (as found when it was opened).
	Info FileInfo
	// Offset is where the range starts.
	Offset int64
	// Length is how many bytes the Reader yields: the requested length, or
	// less where the file ends.
	Length int64

	f         *os.File
	remaining int64
}

// open opens the regular file at path (following symlinks) for reading
// length bytes from offset; a length of 0 means to the end of the file.
//
// Errors: InvalidArgument("offset") for a negative offset or one beyond the
// end (an offset equal to the size gives an empty range),
// InvalidArgument("length") for a negative length, NotFound,
// PermissionDenied, and FailedPrecondition for a directory or a file that
// is not regular (device, FIFO, socket).
func (f *FS) open(ctx context.Context, path string, offset, length int64) (*Reader, error) {
	p, err := checkPath("path", path, true)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, errdefs.InvalidArgument("offset", "must not be negative, got %d", offset)
	}
	if length < 0 {
		return nil, errdefs.InvalidArgument("length", "must not be negative, got %d", length)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, osError("open", p, err)
	}
	if err := regularFile(p, fi.Mode()); err != nil {
		return nil, err
	}
	// O_NONBLOCK keeps a FIFO swapped in after the Stat from blocking the
	// open; it has no effect on regular files.
	file, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, osError("open", p, err)
	}
	fi, err = file.Stat()
	if err == nil {
		err = regularFile(p, fi.Mode())
	} else {
		err = osError("stat", p, err)
	}
	if err != nil {
		file.Close()
		return nil, err
	}
	rd := &Reader{Info: newFileInfo(p, fi), f: file}
	if err := rd.limit(offset, length); err != nil {
		file.Close()
		return nil, err
	}
	return rd, nil
}

func regularFile(p string, m os.FileMode) error {
	switch {
	case m.IsDir():
		return errdefs.FailedPrecondition("%s is a directory", p)
	case !m.IsRegular():
		return errdefs.FailedPrecondition("%s is not a regular file", p)
	}
	return nil
}

// window resolves offset and length (0 = to the end) against size.
func window(size, offset, length int64) (int64, error) {
	if offset > size {
		return 0, errdefs.InvalidArgument("offset", "%d is beyond the end of the file (%d bytes)", offset, size)
	}
	n := size - offset
	if length > 0 && length < n {
		n = length
	}
	return n, nil
}

// limit positions the reader on [offset, offset+length) of the file.
func (r *Reader) limit(offset, length int64) error {
	n, err := window(r.Info.Size, offset, length)
	if err != nil {
		return err
	}
	if _, err := r.f.Seek(offset, io.SeekStart); err != nil {
		return osError("seek", r.Info.Path, err)
	}
	r.Offset, r.Length, r.remaining = offset, n, n
	return nil
}

// errShrunk reports a file that ended before the range did.
func (r *Reader) errShrunk() error {
	return fmt.Errorf("read %s: %w (file shrank while being read)", r.Info.Path, io.ErrUnexpectedEOF)
}

// Read reads from the range; it returns io.EOF at the end of the range and
// io.ErrUnexpectedEOF if the file shrank below it.
func (r *Reader) Read(p []byte) (int, error) {
	if r.remaining <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.remaining {
		p = p[:r.remaining]
	}
	n, err := r.f.Read(p)
	r.remaining -= int64(n)
	if errors.Is(err, io.EOF) {
		if r.remaining > 0 {
			return n, r.errShrunk()
		}
		err = nil
	}
	if err != nil {
		err = osError("read", r.Info.Path, err)
	}
	return n, err
}

// WriteTo writes the rest of the range to w. When w is an
// http.ResponseWriter or a socket, the kernel copies the data (sendfile).
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	lr := &io.LimitedReader{R: r.f, N: r.remaining}
	n, err := io.Copy(w, lr)
	r.remaining -= n
	if err == nil && r.remaining > 0 {
		err = r.errShrunk()
	}
	return n, err
}

// Close closes the file.
func (r *Reader) Close() error { return r.f.Close() }
