package proxy_test

import (
	"net/http"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/uploadtest"
)

// TestPreAuthBodyNotRead is the attack of issue 21 item 9: a client
// without a valid token sends a 64 MiB body to a proxy route, writing it
// while it waits for the answer. The proxy must answer 401 (or 404 for an
// unknown lease) and close the connection after reading at most a small
// bound, so the client cannot get it to read 64 MiB. The client counts
// what it managed to write before the connection was closed: loopback
// socket buffers take a few MiB, never the whole body.
func TestPreAuthBodyNotRead(t *testing.T) {
	t.Parallel() // its own orchestrator and proxy; mostly waits
	e := newEnv(t, nil)
	id, _ := e.acquire(t, "preauth-drain", "")
	const size = 64 << 20
	for _, c := range []struct {
		name    string
		url     string
		token   string
		status  int
		chunked bool
	}{
		{"wrong token", e.sandboxURL(id, "/v1/files/tmp/x"), "wrong-token", http.StatusUnauthorized, false},
		{"wrong token, chunked", e.sandboxURL(id, "/v1/files/tmp/x"), "wrong-token", http.StatusUnauthorized, true},
		{"no token", e.sandboxURL(id, "/v1/files/tmp/x"), "", http.StatusUnauthorized, false},
		{"unknown lease", e.sandboxURL("01JZZZZZZZZZZZZZZZZZZZZZZZ", "/v1/files/tmp/x"), "wrong-token", http.StatusUnauthorized, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			hdr := http.Header{}
			if c.token != "" {
				hdr.Set("Authorization", "Bearer "+c.token)
			}
			got := uploadtest.RawPutWhileReading(t, c.url, hdr, size, c.chunked)
			status, written := got.Status, got.Written
			if status != c.status {
				t.Errorf("status %d, want %d", status, c.status)
			}
			if !got.Closes {
				t.Errorf("the answer does not close the connection")
			}
			if written >= 32<<20 {
				t.Errorf("the proxy let an unauthenticated client write %d MiB of a %d MiB body before closing; want a small bound", written>>20, size>>20)
			}
			t.Logf("client wrote %.1f MiB of %d MiB before the connection closed", float64(written)/(1<<20), size>>20)
		})
	}
}
