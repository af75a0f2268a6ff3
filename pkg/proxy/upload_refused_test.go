package proxy_test

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/uploadtest"
	"google.golang.org/grpc/codes"
)

// TestRefusedUploadThroughProxy sends multi-MiB uploads through the proxy
// with clients that write the whole body before reading (Python's urllib,
// a raw TCP client): the agent's 4xx passes through, and the proxy's own
// refusals (401, unknown lease) are readable too.
func TestRefusedUploadThroughProxy(t *testing.T) {
	t.Parallel() // its own orchestrator and proxy; mostly waits
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "upload-refused", "")
	// The agent drains a large refused upload; the proxy, refusing a caller
	// before it is authenticated, drains at most edge.PreAuthDrainLimit
	// (TestPreAuthBodyNotRead), so its refusals are sent smaller bodies.
	const size = 24 << 20
	const proxySize = 768 << 10
	dir := t.TempDir() // in-process agents share the host's file system
	cases := []struct {
		name   string
		url    string
		token  string
		status int
		code   codes.Code
		size   int
	}{
		{"agent: parent missing with parents=false", e.sandboxURL(id, "/v1/files"+filepath.Join(dir, "no", "such", "f")+"?parents=false"), tok, http.StatusNotFound, codes.NotFound, size},
		{"agent: unknown query parameter", e.sandboxURL(id, "/v1/files"+filepath.Join(dir, "f")+"?bogus=1"), tok, http.StatusBadRequest, codes.InvalidArgument, size},
		{"proxy: wrong token", e.sandboxURL(id, "/v1/files"+filepath.Join(dir, "f")), "wrong-token", http.StatusUnauthorized, codes.Unauthenticated, proxySize},
		{"proxy: unknown lease", e.sandboxURL("01JZZZZZZZZZZZZZZZZZZZZZZZ", "/v1/files"+filepath.Join(dir, "f")), opToken, http.StatusNotFound, codes.NotFound, proxySize},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := func(client string, r uploadtest.Response) {
				t.Helper()
				if r.Status != c.status || r.Code() != int(c.code) {
					t.Errorf("%s: got %d %s, want %d with code %d", client, r.Status, r.Body, c.status, c.code)
				}
			}
			check("python3 urllib", uploadtest.PythonPut(t, c.url, c.token, c.size))
			check("raw TCP", uploadtest.RawPut(t, c.url, bearerHdr(c.token), c.size, false))
			check("raw TCP, chunked", uploadtest.RawPut(t, c.url, bearerHdr(c.token), c.size, true))
		})
	}
	// Accepted: the default creates the parents.
	r := uploadtest.PythonPut(t, e.sandboxURL(id, "/v1/files"+filepath.Join(dir, "a", "b", "c.bin")), tok, 3<<20)
	if r.Status != http.StatusCreated {
		t.Fatalf("upload into missing parents through the proxy: %d %s", r.Status, r.Body)
	}
}
