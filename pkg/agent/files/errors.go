package files

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"syscall"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// osError wraps an error from the os package in its errdefs category, with
// the operation and the path (the one the caller named, not a temp file):
// ENOENT is NotFound, EEXIST AlreadyExists, EACCES and EPERM
// PermissionDenied, ENOSPC and friends ResourceExhausted, ENAMETOOLONG and
// EINVAL InvalidArgument("path"), and ENOTDIR, EISDIR, ENOTEMPTY, ELOOP,
// EROFS, EBUSY, ETXTBSY and EXDEV FailedPrecondition. Context errors keep
// their identity; other errors are wrapped without a category (Unknown at
// the gRPC edge).
func osError(op, path string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: %w", op, path, err)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s %s: %w", op, path, err)
	}
	var cat error
	switch errno {
	case syscall.ENOENT:
		cat = errdefs.ErrNotFound
	case syscall.EEXIST:
		cat = errdefs.ErrAlreadyExists
	case syscall.EACCES, syscall.EPERM:
		cat = errdefs.ErrPermissionDenied
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EMFILE, syscall.ENFILE, syscall.EFBIG, syscall.EMLINK:
		cat = errdefs.ErrResourceExhausted
	case syscall.ENAMETOOLONG, syscall.EINVAL:
		return fmt.Errorf("%w: path: %s %s: %w", errdefs.ErrInvalidArgument, op, path, errno)
	case syscall.ENOTDIR, syscall.EISDIR, syscall.ENOTEMPTY, syscall.ELOOP, syscall.EROFS,
		syscall.EBUSY, syscall.ETXTBSY, syscall.EXDEV:
		cat = errdefs.ErrFailedPrecondition
	default:
		return fmt.Errorf("%s %s: %w", op, path, errno)
	}
	return fmt.Errorf("%w: %s %s: %w", cat, op, path, errno)
}

// randSuffix returns a short random hex string for temporary names.
func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
