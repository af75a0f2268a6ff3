//go:build !linux

package files

import "github.com/berth-dev/berth/pkg/errdefs"

// as runs fn; acting as another user needs Linux's per-thread fsuid.
func (f *FS) as(fn func() error) error {
	if f.asUser != nil {
		return errdefs.FailedPrecondition("files: acting as another user needs Linux")
	}
	return fn()
}
