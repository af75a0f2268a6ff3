package runtime

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// statNoFollow returns the identity of the file the absolute, clean path
// names, opening it one component at a time from "/" with
// O_PATH|O_NOFOLLOW (openat on the parent's descriptor): a component that
// is a symlink is a *SymlinkError, so the file returned is reached by the
// literal path alone.
func statNoFollow(path string) (FileID, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return FileID{}, fmt.Errorf("%q is not an absolute, clean path", path)
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return FileID{}, &fs.PathError{Op: "open", Path: "/", Err: err}
	}
	defer func() { unix.Close(fd) }()
	var st unix.Stat_t
	walked := ""
	for c := range strings.SplitSeq(strings.TrimPrefix(path, "/"), "/") {
		if c == "" { // path is "/"
			continue
		}
		walked += "/" + c
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return FileID{}, &fs.PathError{Op: "open", Path: walked, Err: err}
		}
		unix.Close(fd)
		fd = next
		if err := unix.Fstat(fd, &st); err != nil {
			return FileID{}, &fs.PathError{Op: "stat", Path: walked, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return FileID{}, &SymlinkError{Path: walked}
		}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return FileID{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return FileID{Dev: uint64(st.Dev), Ino: st.Ino}, nil //nolint:unconvert // Dev is not uint64 on every architecture
}
