//go:build !linux

package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// statNoFollow returns the identity of the file the absolute, clean path
// names, refusing a symlink in any component (*SymlinkError). Outside Linux
// it checks each component with lstat, which leaves a race between the
// components; berth's container backends run on Linux, where it opens the
// path component by component instead.
func statNoFollow(path string) (FileID, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return FileID{}, fmt.Errorf("%q is not an absolute, clean path", path)
	}
	walked := ""
	var fi os.FileInfo
	for c := range strings.SplitSeq(strings.TrimPrefix(path, "/"), "/") {
		if c == "" {
			continue
		}
		walked += "/" + c
		var err error
		if fi, err = os.Lstat(walked); err != nil {
			return FileID{}, err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return FileID{}, &SymlinkError{Path: walked}
		}
	}
	if fi == nil {
		var err error
		if fi, err = os.Lstat("/"); err != nil {
			return FileID{}, err
		}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileID{}, fmt.Errorf("%s: no device and inode numbers", path)
	}
	return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, nil //nolint:unconvert // the widths differ by platform
}
