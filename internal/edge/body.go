package edge

import (
	"errors"
	"io"
)

// EndedBody wraps a request body that a reverse proxy streams upstream so
// that, once it has returned io.EOF, it answers io.EOF again without
// touching the underlying body. The forwarding transport reads once more
// after the last byte; if the upstream has answered by then (an exec
// stream answers at once), net/http's server has already closed the body
// when the response headers went out, that read fails ("invalid Read on
// closed Body"), and the transport cuts the upstream connection in the
// middle of the response.
func EndedBody(body io.ReadCloser) io.ReadCloser {
	return &endedBody{ReadCloser: body}
}

type endedBody struct {
	io.ReadCloser
	eof bool
}

func (b *endedBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}
