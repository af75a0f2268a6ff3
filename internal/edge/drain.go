package edge

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// DrainLimit is the most request-body bytes DrainBody reads and discards
// before an error response: 64 MiB.
const DrainLimit = 64 << 20

// DrainTimeout bounds how long DrainBody reads: 10s.
const DrainTimeout = 10 * time.Second

// DrainBody reads and discards what is left of r's body, up to DrainLimit
// bytes and for up to DrainTimeout, before a handler answers a request it
// refuses (a 4xx on an upload, a 401).
//
// Clients such as Python's urllib and requests write the whole request body
// before they read the response. net/http's HTTP/1 server closes a
// connection whose request body was left unread beyond 256 KiB, and closing
// a socket with unread data makes the kernel send a reset: such a client
// then fails with "connection reset by peer" (or a broken pipe) instead of
// reading the error. Once the body is drained the connection stays usable
// and the error is read like any response.
//
// Nothing is read when the body is declared (Content-Length) larger than
// DrainLimit: the connection is closed after the answer as before. Nor
// when the client sent "Expect: 100-continue" and the handler has not read
// the body (consumed is false): such a client waits for the answer before
// sending the body, and reading would ask it to send everything. consumed
// says whether the handler read any of the body already; pass false if
// unsure only when the body was certainly not touched.
func DrainBody(w http.ResponseWriter, r *http.Request, consumed bool) {
	DrainBodyUpTo(w, r, consumed, DrainLimit)
}

// PreAuthDrainLimit is the most request-body bytes a handler should drain
// before answering a caller it has not authenticated: 1 MiB. Draining more
// would let anyone make the server read (and spend bandwidth and time on)
// a large body without a token.
const PreAuthDrainLimit = 1 << 20

// DrainBodyUpTo is DrainBody with a bound of its own: at most limit bytes
// are read. When the body is declared larger than limit, or a body of
// unknown length (chunked) goes on past it, the response is marked
// "Connection: close", so the server closes the connection after the
// answer instead of reading the rest; such a client may then see a reset
// instead of the answer, which is the price of not reading its body.
func DrainBodyUpTo(w http.ResponseWriter, r *http.Request, consumed bool, limit int64) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return
	}
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return
	}
	if !consumed && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	// HTTP/2 and handlers without a deadline-capable connection do not
	// support this; they still get the byte bound.
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(DrainTimeout)) == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	n, _ := io.Copy(io.Discard, io.LimitReader(r.Body, limit))
	if n == limit && r.ContentLength < 0 {
		// A chunked body that went on to the bound: do not read the rest.
		w.Header().Set("Connection", "close")
	}
}

// ReadTracker reads from R and records whether anything was read, for
// DrainBody's consumed argument. Hand it to the code that reads the body
// instead of replacing http.Request.Body: net/http's server decides how to
// finish a request by the type of Request.Body (for example, whether a
// "100 Continue" is still owed), so Body must stay what the server set.
type ReadTracker struct {
	// R is the request body.
	R    io.Reader
	read atomic.Bool
}

// Read reads from R and records the attempt.
func (t *ReadTracker) Read(p []byte) (int, error) {
	t.read.Store(true)
	return t.R.Read(p)
}

// Consumed reports whether Read was called.
func (t *ReadTracker) Consumed() bool { return t.read.Load() }
