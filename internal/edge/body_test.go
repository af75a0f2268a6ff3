package edge

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// closedAfterEOF is a body that fails every read after it has been read to
// its end, as net/http's server body does once the handler has answered.
type closedAfterEOF struct {
	r     io.Reader
	ended bool
}

func (c *closedAfterEOF) Read(p []byte) (int, error) {
	if c.ended {
		return 0, errors.New("http: invalid Read on closed Body")
	}
	n, err := c.r.Read(p)
	if err == io.EOF {
		c.ended = true
	}
	return n, err
}

func (c *closedAfterEOF) Close() error { return nil }

func TestEndedBodyAnswersEOFAfterTheEnd(t *testing.T) {
	b := EndedBody(&closedAfterEOF{r: strings.NewReader("payload")})
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "payload" {
		t.Fatalf("ReadAll = %q, %v", got, err)
	}
	for i := range 3 {
		if n, err := b.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("read %d after the end = %d, %v; want 0, io.EOF", i, n, err)
		}
	}
}
