package files

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// FuzzAbsPath checks the path validation every file operation starts with
// and the raw routes' URL-to-path extraction: neither panics, every accepted
// path is absolute, clean, NUL-free and within validate.MaxPathLen, every
// rejection is InvalidArgument naming the "path" field, and extraction is
// idempotent (the route URL of an extracted path names the same path).
func FuzzAbsPath(f *testing.F) {
	for _, s := range []string{
		"/workspace/a.txt", "relative/x", "", "/", "//a//b/../c/.", "/a\x00b",
		"/v1/files/workspace/a.txt", "/v1/files", "/v1/files/", "/v1/filesx", "/v1/files/../../etc",
		"/v1/files/a:b", "/v1/files//..", strings.Repeat("/a", 2100),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		check := func(what, p string, err error) {
			if err != nil {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "path") {
					t.Fatalf("%s(%q): error %v is not InvalidArgument naming path", what, s, err)
				}
				return
			}
			switch {
			case !filepath.IsAbs(p):
				t.Fatalf("%s(%q) = %q: not absolute", what, s, p)
			case filepath.Clean(p) != p:
				t.Fatalf("%s(%q) = %q: not clean", what, s, p)
			case strings.IndexByte(p, 0) >= 0:
				t.Fatalf("%s(%q) = %q: has NUL", what, s, p)
			case len(p) > validate.MaxPathLen:
				t.Fatalf("%s(%q) = %q: too long", what, s, p)
			}
		}

		p, err := validate.AbsPath("path", s)
		check("AbsPath", p, err)
		if err == nil {
			if _, err := checkPath("path", s, false); (err == nil) == (p == "/") {
				t.Fatalf("checkPath(%q, root=false) = %v", s, err)
			}
		}

		q, err := PathFromURL(s)
		check("PathFromURL", q, err)
		if err == nil {
			if !strings.HasPrefix(s, RoutePrefix) {
				t.Fatalf("PathFromURL(%q) accepted a URL outside %s", s, RoutePrefix)
			}
			if again, err := PathFromURL(RoutePrefix + q); err != nil || again != q {
				t.Fatalf("PathFromURL(%q) = %q, but PathFromURL(%q) = %q, %v", s, q, RoutePrefix+q, again, err)
			}
		}
	})
}
