package workspace

import (
	"path"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// resolver turns request paths into absolute ones against a root. Both
// Local and Remote use it, so relative paths mean the same on both.
type resolver struct{ root string }

// dir resolves a path that names a directory: empty means the root.
func (r resolver) dir(field, p string) (string, error) {
	if p == "" {
		return r.root, nil
	}
	return r.file(field, p)
}

// file resolves a path that names a file: empty is InvalidArgument. A
// trailing slash is kept, so that the implementation can reject it as not
// naming a file.
func (r resolver) file(field, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.InvalidArgument(field, "must not be empty")
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.InvalidArgument(field, "must not contain NUL bytes")
	case path.IsAbs(p):
		return p, nil
	}
	abs := path.Join(r.root, p)
	if strings.HasSuffix(p, "/") && abs != "/" {
		abs += "/"
	}
	return abs, nil
}
