package terminal

// ring keeps the most recent size bytes written to it. It is not safe for
// concurrent use.
type ring struct {
	buf   []byte // capacity size; grows until full
	size  int
	start int // index of the oldest byte once the buffer is full
}

func newRing(size int) *ring { return &ring{size: size} }

// write appends p, dropping the oldest bytes beyond the size.
func (r *ring) write(p []byte) {
	if len(p) >= r.size {
		r.buf = append(r.buf[:0], p[len(p)-r.size:]...)
		r.start = 0
		return
	}
	if len(r.buf) < r.size {
		room := r.size - len(r.buf)
		if len(p) <= room {
			r.buf = append(r.buf, p...)
			return
		}
		r.buf = append(r.buf, p[:room]...)
		p = p[room:]
	}
	// Full: overwrite from start, wrapping.
	n := copy(r.buf[r.start:], p)
	if n < len(p) {
		copy(r.buf, p[n:])
	}
	r.start = (r.start + len(p)) % r.size
}

// bytes returns a copy of the contents, oldest first.
func (r *ring) bytes() []byte {
	out := make([]byte, 0, len(r.buf))
	out = append(out, r.buf[r.start:]...)
	return append(out, r.buf[:r.start]...)
}
