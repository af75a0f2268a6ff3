// Package uploadtest has HTTP clients for tests that, like Python's urllib
// and requests, write a request's whole body before they read the
// response: a refused upload must reach them as a readable error, not as a
// connection reset.
package uploadtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// Response is what a client read.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Body is the response body.
	Body string
}

// Code returns the gRPC code of a berth JSON error body, or -1.
func (r Response) Code() int {
	var e struct {
		Code *int `json:"code"`
	}
	if json.Unmarshal([]byte(r.Body), &e) != nil || e.Code == nil {
		return -1
	}
	return *e.Code
}

// pythonPut sends one PUT with urllib, which writes the whole body before
// reading the response, and prints {"status": N, "body": "..."}. A
// connection error is a traceback and exit status 1.
const pythonPut = `
import json, sys, urllib.error, urllib.request
url, size, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
req = urllib.request.Request(url, data=b"x" * size, method="PUT")
req.add_header("Content-Type", "application/octet-stream")
if token:
    req.add_header("Authorization", "Bearer " + token)
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        status, body = r.status, r.read()
except urllib.error.HTTPError as e:
    status, body = e.code, e.read()
print(json.dumps({"status": status, "body": body.decode()}))
`

// RequirePython skips the test when python3 is not installed (fails with
// BERTH_REQUIRE_DOCKER=1: make deps installs python3).
func RequirePython(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.SkipOrFail(t, "python3 is not installed (make deps)")
	}
}

// PythonPut PUTs size bytes to rawURL with Python's urllib (bearer token
// unless empty) and returns what it read. A client that failed to read a
// response (connection reset, broken pipe) fails the test with Python's
// traceback.
func PythonPut(t testing.TB, rawURL, token string, size int) Response {
	t.Helper()
	RequirePython(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-c", pythonPut, rawURL, strconv.Itoa(size), token)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python3 urllib PUT %s (%d bytes): %v\n%s", rawURL, size, err, stderr.String())
	}
	var out struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("python3 output %q: %v", stdout.String(), err)
	}
	return Response{Status: out.Status, Body: out.Body}
}

// RawPut PUTs size bytes to rawURL over a plain TCP connection: it writes
// the request line, headers and the entire body (with Content-Length, or
// chunked when chunked is set) and only then reads the response. hdr adds
// headers. A write or read failure (a reset) fails the test.
func RawPut(t testing.TB, rawURL string, hdr http.Header, size int, chunked bool) Response {
	t.Helper()
	conn := dialPut(t, rawURL, hdr, size, chunked)
	defer conn.Close()
	if err := writeBody(conn, size, chunked, nil); err != nil {
		t.Fatalf("raw PUT %s: writing the body: %v", rawURL, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("raw PUT %s: reading the response after the whole body: %v", rawURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("raw PUT %s: reading the response body: %v", rawURL, err)
	}
	return Response{Status: resp.StatusCode, Body: string(body)}
}

// Streamed is what RawPutWhileReading saw.
type Streamed struct {
	// Status is the HTTP status code of the answer.
	Status int
	// Closes tells whether the answer said it closes the connection.
	Closes bool
	// Written is how many body bytes the client wrote before the
	// connection failed or the body ended.
	Written int64
}

// RawPutWhileReading PUTs size bytes to rawURL over TCP as a streaming
// client does: it writes the body in the background while it reads the
// answer. After the answer it stops reading, waits for the writer to end
// (the server closing the connection ends it) and reports how much of the
// body got written.
func RawPutWhileReading(t testing.TB, rawURL string, hdr http.Header, size int, chunked bool) Streamed {
	t.Helper()
	conn := dialPut(t, rawURL, hdr, size, chunked)
	defer conn.Close()
	var written atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = writeBody(conn, size, chunked, &written)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("raw PUT %s: reading the answer: %v", rawURL, err)
	}
	_ = resp.Body.Close()
	// Close our reading side so a writer blocked on a full buffer returns
	// once the server has closed; then give up on it after a while.
	_ = conn.(*net.TCPConn).CloseRead()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = conn.Close()
		<-done
	}
	return Streamed{Status: resp.StatusCode, Closes: resp.Close, Written: written.Load()}
}

// dialPut connects to rawURL's host and writes a PUT's request line and
// headers (hdr, then Content-Length or chunked framing).
func dialPut(t testing.TB, rawURL string, hdr http.Header, size int, chunked bool) net.Conn {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	var head strings.Builder
	fmt.Fprintf(&head, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n", u.RequestURI(), u.Host)
	for k, vs := range hdr {
		for _, v := range vs {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	if chunked {
		head.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	} else {
		fmt.Fprintf(&head, "Content-Length: %d\r\n\r\n", size)
	}
	if _, err := io.WriteString(conn, head.String()); err != nil {
		conn.Close()
		t.Fatalf("raw PUT %s: writing the headers: %v", rawURL, err)
	}
	return conn
}

// writeBody writes size bytes of body to w, chunk-framed when chunked,
// adding each chunk's length to written (when not nil) once it is sent.
func writeBody(w io.Writer, size int, chunked bool, written *atomic.Int64) error {
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	for left := size; left > 0; {
		n := min(left, len(chunk))
		frame := chunk[:n]
		if chunked {
			frame = append(fmt.Appendf(nil, "%x\r\n", n), append(chunk[:n:n], '\r', '\n')...)
		}
		if _, err := w.Write(frame); err != nil {
			return fmt.Errorf("%d of %d bytes left: %w", left, size, err)
		}
		if written != nil {
			written.Add(int64(n))
		}
		left -= n
	}
	if chunked {
		if _, err := io.WriteString(w, "0\r\n\r\n"); err != nil {
			return fmt.Errorf("the last chunk: %w", err)
		}
	}
	return nil
}
