package files

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/uploadtest"
	"google.golang.org/grpc/codes"
)

// refusedBody is the size of the bodies of the refused-upload tests: far
// beyond what net/http discards by itself (256 KiB) and what loopback
// socket buffers absorb, so an undrained body resets the connection.
const refusedBody = 24 << 20

// TestRefusedUploadWholeBodyClients sends refused uploads with clients that
// write the whole body before reading (Python's urllib, a raw TCP client
// with Content-Length and chunked): each must read the 4xx JSON error.
func TestRefusedUploadWholeBodyClients(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	existing := filepath.Join(dir, "existing.txt")
	if err := os.WriteFile(existing, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		url    string
		status int
		code   codes.Code
	}{
		{"parent missing with parents=false", fileURL(srv, filepath.Join(dir, "no", "such", "f"), "parents=false"), http.StatusNotFound, codes.NotFound},
		{"path ends with a slash", fileURL(srv, dir+"/d/", ""), http.StatusBadRequest, codes.InvalidArgument},
		{"already exists with overwrite=fail", fileURL(srv, existing, "overwrite=fail"), http.StatusConflict, codes.AlreadyExists},
		{"unknown query parameter", fileURL(srv, filepath.Join(dir, "f"), "bogus=1"), http.StatusBadRequest, codes.InvalidArgument},
		{"sha256 mismatch after the whole body", fileURL(srv, filepath.Join(dir, "f"), "sha256="+strings.Repeat("0", 64)), http.StatusBadRequest, codes.InvalidArgument},
		{"target is a directory", fileURL(srv, dir, ""), http.StatusBadRequest, codes.FailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := func(client string, r uploadtest.Response) {
				t.Helper()
				if r.Status != c.status || r.Code() != int(c.code) {
					t.Errorf("%s: got %d %s, want %d with code %d", client, r.Status, r.Body, c.status, c.code)
				}
			}
			check("python3 urllib", uploadtest.PythonPut(t, c.url, "", refusedBody))
			check("raw TCP, Content-Length", uploadtest.RawPut(t, c.url, nil, refusedBody, false))
			check("raw TCP, chunked", uploadtest.RawPut(t, c.url, nil, refusedBody, true))
		})
	}
	if got := readFile(t, existing); got != "old" {
		t.Fatalf("existing file changed: %q", got)
	}
	if names := dirNames(t, dir); len(names) != 1 {
		t.Fatalf("refused uploads left files: %v", names)
	}
}

// TestUploadCreatesParentsByDefault: the default creates missing parent
// directories, for Python's urllib too.
func TestUploadCreatesParentsByDefault(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	p := filepath.Join(dir, "a", "b", "c.bin")
	r := uploadtest.PythonPut(t, fileURL(srv, p, ""), "", 3<<20)
	if r.Status != http.StatusCreated || !strings.Contains(r.Body, `"created":true`) {
		t.Fatalf("got %d %s", r.Status, r.Body)
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != 3<<20 {
		t.Fatalf("stat: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "a")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("created parent: %v %v", fi, err)
	}
}

// TestRefusedUploadExpectContinue: a client that asks "Expect:
// 100-continue" gets the refusal at once, without being invited to send
// the body (no 100 Continue).
func TestRefusedUploadExpectContinue(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	u := fileURL(srv, filepath.Join(dir, "no", "f"), "parents=false")
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", strings.TrimPrefix(u, srv.URL), refusedBody)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d, want 404 without a 100 Continue", resp.StatusCode)
	}
}
