package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"
)

// TestPreAuthBodyNotRead is the attack of issue 21 item 9: a client
// without a valid token sends a 64 MiB body to a proxy route, writing it
// while it waits for the answer. The proxy must answer 401 (or 404 for an
// unknown lease) and close the connection after reading at most a small
// bound, so the client cannot get it to read 64 MiB. The client counts
// what it managed to write before the connection was closed: loopback
// socket buffers take a few MiB, never the whole body.
func TestPreAuthBodyNotRead(t *testing.T) {
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
			status, written := putWhileReading(t, c.url, c.token, size, c.chunked)
			if status != c.status {
				t.Errorf("status %d, want %d", status, c.status)
			}
			if written >= 32<<20 {
				t.Errorf("the proxy let an unauthenticated client write %d MiB of a %d MiB body before closing; want a small bound", written>>20, size>>20)
			}
			t.Logf("client wrote %.1f MiB of %d MiB before the connection closed", float64(written)/(1<<20), size>>20)
		})
	}
}

// putWhileReading PUTs size bytes to rawURL over TCP, writing the body in
// the background while it reads the answer (as a streaming client does),
// and returns the answer's status and how many body bytes were written
// before the connection failed or the body ended.
func putWhileReading(t *testing.T, rawURL, token string, size int, chunked bool) (int, int64) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	head := fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: %s\r\n", u.RequestURI(), u.Host)
	if token != "" {
		head += "Authorization: Bearer " + token + "\r\n"
	}
	if chunked {
		head += "Transfer-Encoding: chunked\r\n\r\n"
	} else {
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n", size)
	}
	if _, err := conn.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	var written atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for left := size; left > 0; left -= len(chunk) {
			frame := chunk
			if chunked {
				frame = append(fmt.Appendf(nil, "%x\r\n", len(chunk)), append(chunk, '\r', '\n')...)
			}
			if _, err := conn.Write(frame); err != nil {
				return
			}
			written.Add(int64(len(chunk)))
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	_ = resp.Body.Close()
	if !resp.Close {
		t.Errorf("the answer does not close the connection (Connection: %q)", resp.Header.Get("Connection"))
	}
	// The server closes after the answer; the writer then fails. Close our
	// side too so a writer blocked on a full buffer returns.
	_ = conn.(*net.TCPConn).CloseRead()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = conn.Close()
		<-done
	}
	return resp.StatusCode, written.Load()
}
