package files

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// simpleTar is a tar of a directory, a file in it and a symlink.
func simpleTar(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o640, Size: 2})
	tw.Write([]byte("hi"))
	tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "d/f"})
	tw.Close()
	return buf.Bytes()
}

func TestArchiveHTTP(t *testing.T) {
	var mu sync.Mutex
	var chowned []string
	fsys := newTestFS(t, Config{Chown: func(p string) error {
		mu.Lock()
		defer mu.Unlock()
		name := filepath.Base(p)
		if strings.HasPrefix(name, ".berth-archive-") {
			name = "(staging)" // the target, chowned before its rename
		}
		chowned = append(chowned, name)
		return nil
	}})
	srv := startHTTP(t, fsys)
	dir := t.TempDir()
	u := func(p, q string) string {
		s := srv.URL + ArchiveRoutePrefix + (&url.URL{Path: p}).EscapedPath()
		if q != "" {
			s += "?" + q
		}
		return s
	}

	// PUT, plain and gzip.
	resp := do(t, "PUT", u(dir+"/a/b", ""), bytes.NewReader(simpleTar(t)))
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"entries":3`) || !strings.Contains(string(body), `"created":true`) {
		t.Fatalf("PUT: %d %s", resp.StatusCode, body)
	}
	if readFile(t, filepath.Join(dir, "a/b/d/f")) != "hi" {
		t.Fatal("file not extracted")
	}
	mu.Lock()
	sort.Strings(chowned)
	got := strings.Join(chowned, " ")
	mu.Unlock()
	if got != "(staging) a d f l" { // the created parent, the target, and every entry
		t.Errorf("chowned %q", got)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(simpleTar(t))
	zw.Close()
	resp = do(t, "PUT", u(dir+"/z", "parents=false"), &gz, "Content-Encoding", "gzip")
	if resp.StatusCode != 200 || readFile(t, filepath.Join(dir, "z/d/f")) != "hi" {
		t.Fatalf("PUT gzip: %d", resp.StatusCode)
	}
	resp.Body.Close()

	// Refusals: a missing parent with parents=false, an unknown query,
	// a bad encoding, a traversal.
	for _, c := range []struct {
		url, enc string
		body     []byte
		code     int
		msg      string
	}{
		{u(dir+"/no/x", "parents=false"), "", simpleTar(t), 404, "does not exist"},
		{u(dir+"/q", "mode=1"), "", simpleTar(t), 400, "unknown query parameter"},
		{u(dir+"/e", ""), "br", simpleTar(t), 400, "Content-Encoding"},
		{u(dir+"/g", ""), "gzip", simpleTar(t), 400, "not a gzip stream"},
		{u(dir+"/t", ""), "", tarWith(t, "../x"), 400, `entry \"../x\": escapes`},
	} {
		hdr := []string{}
		if c.enc != "" {
			hdr = []string{"Content-Encoding", c.enc}
		}
		resp := do(t, "PUT", c.url, bytes.NewReader(c.body), hdr...)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != c.code || !strings.Contains(string(b), c.msg) {
			t.Errorf("PUT %s: %d %s, want %d %q", c.url, resp.StatusCode, b, c.code, c.msg)
		}
	}
	for _, n := range []string{"no", "q", "e", "g", "t"} {
		if exists(filepath.Join(dir, n)) {
			t.Errorf("a refused upload left %s", n)
		}
	}

	// GET, plain and gzip; a missing path is 404; POST is 405.
	for _, q := range []string{"", "gzip=true"} {
		resp := do(t, "GET", u(dir+"/a/b", q), nil)
		var r io.Reader = resp.Body
		if q != "" {
			if ct := resp.Header.Get("Content-Type"); ct != "application/gzip" {
				t.Errorf("gzip Content-Type %q", ct)
			}
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		var names []string
		tr := tar.NewReader(r)
		for h, err := tr.Next(); err == nil; h, err = tr.Next() {
			names = append(names, h.Name)
		}
		resp.Body.Close()
		if got := strings.Join(names, " "); got != "b/ b/d/ b/d/f b/l" {
			t.Errorf("GET ?%s: %q", q, got)
		}
	}
	if resp := do(t, "GET", u(dir+"/missing", ""), nil); resp.StatusCode != 404 {
		t.Errorf("GET missing: %d", resp.StatusCode)
	}
	if resp := do(t, "POST", u(dir, ""), nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}
}

func tarWith(t *testing.T, name string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	return buf.Bytes()
}
