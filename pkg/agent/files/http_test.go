package files

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// startHTTP mounts the raw routes the way the agent does and serves them
// on a real loopback listener.
func startHTTP(t testing.TB, fsys *FS) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(RoutePrefix+"/", NewHTTPHandler(fsys))
	mux.Handle(ArchiveRoutePrefix+"/", NewHTTPHandler(fsys))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// fileURL is the raw-route URL of the absolute path p, with query q.
func fileURL(srv *httptest.Server, p, q string) string {
	u := srv.URL + RoutePrefix + (&url.URL{Path: p}).EscapedPath()
	if q != "" {
		u += "?" + q
	}
	return u
}

func do(t testing.TB, method, u string, body io.Reader, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func bodyString(t testing.TB, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type errBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// wantHTTPError checks the status, the JSON error body and its message.
func wantHTTPError(t testing.TB, resp *http.Response, httpStatus int, code codes.Code, parts ...string) {
	t.Helper()
	var e errBody
	body := bodyString(t, resp)
	if resp.StatusCode != httpStatus || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d (%s), want %d: %s", resp.StatusCode, resp.Header.Get("Content-Type"), httpStatus, body)
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != int(code) {
		t.Fatalf("body %s, want code %d (%v)", body, code, err)
	}
	for _, p := range parts {
		if !strings.Contains(e.Message, p) {
			t.Fatalf("message %q does not mention %q", e.Message, p)
		}
	}
}

type putResult struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	SHA256  string `json:"sha256"`
	Created bool   `json:"created"`
}

func TestHTTPPutGet(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	p := filepath.Join(dir, "with space & ü.txt")

	resp := do(t, http.MethodPut, fileURL(srv, p, "mode=0750"), strings.NewReader("hello"))
	var res putResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || res.Path != p || res.Size != 5 || res.SHA256 != sumBytes([]byte("hello")) || !res.Created {
		t.Fatalf("PUT: %d %+v", resp.StatusCode, res)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o750 {
		t.Fatalf("mode %v", fi.Mode())
	}
	resp = do(t, http.MethodPut, fileURL(srv, p, ""), strings.NewReader("hello again"))
	if resp.StatusCode != http.StatusOK || readFile(t, p) != "hello again" {
		t.Fatalf("replace: %d %s", resp.StatusCode, bodyString(t, resp))
	}
	resp = do(t, http.MethodPut, fileURL(srv, p, "overwrite=fail"), strings.NewReader("no"))
	wantHTTPError(t, resp, http.StatusConflict, codes.AlreadyExists, p)

	resp = do(t, http.MethodGet, fileURL(srv, p, ""), nil)
	if got := bodyString(t, resp); resp.StatusCode != 200 || got != "hello again" ||
		resp.Header.Get("Content-Type") != "application/octet-stream" || resp.ContentLength != 11 ||
		resp.Header.Get("Accept-Ranges") != "bytes" || resp.Header.Get("Last-Modified") == "" {
		t.Fatalf("GET: %d %q %v", resp.StatusCode, got, resp.Header)
	}
	resp = do(t, http.MethodHead, fileURL(srv, p, ""), nil)
	if got := bodyString(t, resp); resp.StatusCode != 200 || got != "" || resp.ContentLength != 11 {
		t.Fatalf("HEAD: %d %q %d", resp.StatusCode, got, resp.ContentLength)
	}

	// Parents, sha256 and the errors of PUT.
	deep := filepath.Join(dir, "a", "b", "c.bin")
	resp = do(t, http.MethodPut, fileURL(srv, deep, "parents=false"), strings.NewReader("x"))
	wantHTTPError(t, resp, http.StatusNotFound, codes.NotFound, filepath.Join(dir, "a", "b"))
	if exists(filepath.Join(dir, "a")) {
		t.Fatal("parents=false created a directory")
	}
	resp = do(t, http.MethodPut, fileURL(srv, deep, "sha256="+sumBytes([]byte("x"))), strings.NewReader("x"))
	if resp.StatusCode != http.StatusCreated || readFile(t, deep) != "x" {
		t.Fatalf("missing parents are created by default: %d %s", resp.StatusCode, bodyString(t, resp))
	}
	resp = do(t, http.MethodPut, fileURL(srv, filepath.Join(dir, "p", "q", "r.bin"), "parents=true"), strings.NewReader("x"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("parents=true: %d %s", resp.StatusCode, bodyString(t, resp))
	}
	resp = do(t, http.MethodPut, fileURL(srv, deep, "sha256="+sumBytes([]byte("y"))), strings.NewReader("x"))
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "sha256")
	resp = do(t, http.MethodPut, fileURL(srv, dir, ""), strings.NewReader("x"))
	wantHTTPError(t, resp, http.StatusBadRequest, codes.FailedPrecondition, "directory")
	resp = do(t, http.MethodPut, fileURL(srv, dir+"/newdir/", ""), strings.NewReader("x"))
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "path", "slash")
	for _, q := range []string{"mode=999", "mode=rwx", "mode=010000", "parents=maybe", "overwrite=sometimes", "parent=true"} {
		resp = do(t, http.MethodPut, fileURL(srv, filepath.Join(dir, "q"), q), strings.NewReader("x"))
		field, _, _ := strings.Cut(q, "=")
		wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, field)
	}
	if exists(filepath.Join(dir, "q")) || exists(filepath.Join(dir, "newdir")) || hasTemp(dirNames(t, dir)) {
		t.Fatalf("rejected PUTs left files: %v", dirNames(t, dir))
	}
	resp = do(t, http.MethodPut, srv.URL+RoutePrefix+"/", strings.NewReader("x"))
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "root")

	// GET errors.
	resp = do(t, http.MethodGet, fileURL(srv, filepath.Join(dir, "missing"), ""), nil)
	wantHTTPError(t, resp, http.StatusNotFound, codes.NotFound, "missing")
	resp = do(t, http.MethodGet, fileURL(srv, dir, ""), nil)
	wantHTTPError(t, resp, http.StatusBadRequest, codes.FailedPrecondition, "directory")
	resp = do(t, http.MethodGet, fileURL(srv, p, "offset=100"), nil)
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "offset")
	resp = do(t, http.MethodGet, fileURL(srv, p, "offset=x"), nil)
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "offset")
	resp = do(t, http.MethodGet, fileURL(srv, p, "length=-1"), nil)
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "length")
	resp = do(t, http.MethodGet, fileURL(srv, p, "offset=1"), nil, "Range", "bytes=0-1")
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "range")
	resp = do(t, http.MethodDelete, fileURL(srv, p, ""), nil)
	wantHTTPError(t, resp, http.StatusMethodNotAllowed, codes.Unimplemented)
	if resp.Header.Get("Allow") == "" {
		t.Fatal("405 without Allow")
	}
}

func TestHTTPRanges(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	p := filepath.Join(dir, "digits")
	writeFile(t, p, "0123456789")
	lastMod := do(t, http.MethodHead, fileURL(srv, p, ""), nil).Header.Get("Last-Modified")

	for _, tc := range []struct {
		query, rng, ifRange string
		status              int
		body, contentRange  string
	}{
		{query: "offset=3", status: 200, body: "3456789"},
		{query: "offset=3&length=4", status: 200, body: "3456"},
		{query: "offset=10", status: 200, body: ""},
		{query: "length=0", status: 200, body: "0123456789"},
		{rng: "bytes=2-5", status: 206, body: "2345", contentRange: "bytes 2-5/10"},
		{rng: "bytes=7-", status: 206, body: "789", contentRange: "bytes 7-9/10"},
		{rng: "bytes=-3", status: 206, body: "789", contentRange: "bytes 7-9/10"},
		{rng: "bytes=-30", status: 206, body: "0123456789", contentRange: "bytes 0-9/10"},
		{rng: "bytes=8-100", status: 206, body: "89", contentRange: "bytes 8-9/10"},
		{rng: "bytes=0-0", status: 206, body: "0", contentRange: "bytes 0-0/10"},
		{rng: "bytes=0-1,4-5", status: 200, body: "0123456789"}, // several ranges: ignored
		{rng: "items=0-1", status: 200, body: "0123456789"},     // other unit: ignored
		{rng: "bytes=2-5", ifRange: lastMod, status: 206, body: "2345", contentRange: "bytes 2-5/10"},
		{rng: "bytes=2-5", ifRange: "Mon, 02 Jan 2006 15:04:05 GMT", status: 200, body: "0123456789"},
		{rng: "bytes=2-5", ifRange: `"some-etag"`, status: 200, body: "0123456789"},
		{rng: "bytes=10-", status: 416, contentRange: "bytes */10"},
		{rng: "bytes=5-2", status: 416, contentRange: "bytes */10"},
		{rng: "bytes=-0", status: 416, contentRange: "bytes */10"},
		{rng: "bytes=x-y", status: 416, contentRange: "bytes */10"},
	} {
		name := tc.query + tc.rng + " " + tc.ifRange
		var hdr []string
		if tc.rng != "" {
			hdr = append(hdr, "Range", tc.rng)
		}
		if tc.ifRange != "" {
			hdr = append(hdr, "If-Range", tc.ifRange)
		}
		resp := do(t, http.MethodGet, fileURL(srv, p, tc.query), nil, hdr...)
		body := bodyString(t, resp)
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Range") != tc.contentRange {
			t.Fatalf("%s: status %d Content-Range %q body %q", name, resp.StatusCode, resp.Header.Get("Content-Range"), body)
		}
		if tc.status == 416 {
			var e errBody
			if json.Unmarshal([]byte(body), &e) != nil || e.Code != int(codes.OutOfRange) {
				t.Fatalf("%s: 416 body %q", name, body)
			}
			continue
		}
		if body != tc.body || resp.ContentLength != int64(len(tc.body)) {
			t.Fatalf("%s: body %q (Content-Length %d), want %q", name, body, resp.ContentLength, tc.body)
		}
	}
}

func TestHTTPLarge(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	size := bigSize()
	want := prngSum(t, 3, size)
	p := filepath.Join(dir, "big.bin")

	start := time.Now()
	// No Content-Length: the body is sent chunked and streamed through.
	resp := do(t, http.MethodPut, fileURL(srv, p, ""), io.MultiReader(prng(3, size)))
	var res putResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || res.Size != size || res.SHA256 != want {
		t.Fatalf("PUT: %d %+v %v", resp.StatusCode, res, err)
	}
	t.Logf("HTTP upload of %d MiB: %v", size>>20, time.Since(start))

	start = time.Now()
	resp = do(t, http.MethodGet, fileURL(srv, p, ""), nil)
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil || n != size || resp.ContentLength != size || hex.EncodeToString(h.Sum(nil)) != want {
		t.Fatalf("GET: %d bytes, Content-Length %d, err %v", n, resp.ContentLength, err)
	}
	t.Logf("HTTP download of %d MiB: %v", size>>20, time.Since(start))

	// A range from the middle matches the same bytes of the stream.
	off, length := size/2+3, int64(1<<20)
	resp = do(t, http.MethodGet, fileURL(srv, p, ""), nil, "Range", fmt.Sprintf("bytes=%d-%d", off, off+length-1))
	got, _ := io.ReadAll(resp.Body)
	wantBytes, _ := io.ReadAll(io.LimitReader(skip(prng(3, size), off), length))
	if resp.StatusCode != 206 || string(got) != string(wantBytes) {
		t.Fatalf("range: %d, %d bytes", resp.StatusCode, len(got))
	}
}

func skip(r io.Reader, n int64) io.Reader {
	_, _ = io.CopyN(io.Discard, r, n)
	return r
}

// blockingBody yields n bytes, then waits for release and fails.
type blockingBody struct {
	n       int64
	release chan struct{}
}

func (b *blockingBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		<-b.release
		return 0, errors.New("client body broke")
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	b.n -= int64(len(p))
	return len(p), nil
}

func TestHTTPPutBodyFailsLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	p := filepath.Join(dir, "broken.bin")
	body := &blockingBody{n: 2 << 20, release: make(chan struct{})}
	req, _ := http.NewRequest(http.MethodPut, fileURL(srv, p, ""), body)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("PUT succeeded with status %d", resp.StatusCode)
		}
		errc <- err
	}()
	waitTemp(t, dir) // the server is writing
	close(body.release)
	if err := <-errc; !strings.Contains(err.Error(), "client body broke") {
		t.Fatalf("client error %v", err)
	}
	waitEmpty(t, dir)
}

func TestHTTPPutConnectionClosedLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	for _, chunked := range []bool{false, true} {
		p := filepath.Join(dir, fmt.Sprintf("cut-%v.bin", chunked))
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(conn)
		fmt.Fprintf(w, "PUT %s HTTP/1.1\r\nHost: x\r\n", strings.TrimPrefix(fileURL(srv, p, ""), srv.URL))
		chunk := strings.Repeat("z", 64<<10)
		if chunked {
			fmt.Fprintf(w, "Transfer-Encoding: chunked\r\n\r\n")
			for range 16 {
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk)
			}
		} else {
			fmt.Fprintf(w, "Content-Length: %d\r\n\r\n", 100<<20)
			for range 16 {
				w.WriteString(chunk)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		waitTemp(t, dir)
		conn.Close() // midway: 1 MiB of 100 MiB, or no final chunk
		waitEmpty(t, dir)
	}
}

func TestPathFromURL(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/files/workspace/a.txt":  "/workspace/a.txt",
		"/v1/files/workspace//a.txt": "/workspace/a.txt",
		"/v1/files/workspace/./b/..": "/workspace",
		"/v1/files/":                 "/",
		"/v1/files":                  "/",
		"/v1/files/a:b":              "/a:b",
	} {
		got, err := PathFromURL(in)
		if err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/v1/filesx/a", "/v2/files/a", "", "/v1/files/a\x00b", "v1/files/a"} {
		if got, err := PathFromURL(in); err == nil {
			t.Errorf("%q accepted as %q", in, got)
		}
	}
}

// TestHTTPPutDigestNone: digest=none writes the file and answers without a
// sha256; an unknown digest, or none with sha256=, is refused naming
// digest, and writes nothing.
func TestHTTPPutDigestNone(t *testing.T) {
	dir := t.TempDir()
	srv := startHTTP(t, newTestFS(t, Config{}))
	p := filepath.Join(dir, "nodigest.bin")

	resp := do(t, http.MethodPut, fileURL(srv, p, "digest=none"), strings.NewReader("hello"))
	raw := bodyString(t, resp)
	var fields map[string]any
	if err := json.Unmarshal([]byte(raw), &fields); err != nil {
		t.Fatal(err)
	}
	if _, ok := fields["sha256"]; resp.StatusCode != http.StatusCreated || ok || fields["size"] != 5.0 || readFile(t, p) != "hello" {
		t.Fatalf("PUT digest=none: %d %s", resp.StatusCode, raw)
	}
	resp = do(t, http.MethodPut, fileURL(srv, p, "digest=SHA256"), strings.NewReader("again"))
	var res putResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusOK || res.SHA256 != sumBytes([]byte("again")) {
		t.Fatalf("PUT digest=SHA256: %d %+v %v", resp.StatusCode, res, err)
	}

	other := filepath.Join(dir, "refused.bin")
	resp = do(t, http.MethodPut, fileURL(srv, other, "digest=md5"), strings.NewReader("x"))
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "digest", "md5")
	resp = do(t, http.MethodPut, fileURL(srv, other, "digest=none&sha256="+sumBytes([]byte("x"))), strings.NewReader("x"))
	wantHTTPError(t, resp, http.StatusBadRequest, codes.InvalidArgument, "digest", "sha256")
	if exists(other) {
		t.Fatal("a refused upload wrote its file")
	}
}
