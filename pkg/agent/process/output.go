package process

import (
	"strconv"
	"sync"
	"unicode/utf8"
)

// TruncationMarker returns the text Exec puts where it cut dropped bytes
// out of the middle of a stream.
func TruncationMarker(dropped int64) string {
	return "\n…[berth: " + strconv.FormatInt(dropped, 10) + " bytes truncated]…\n"
}

// headTail keeps the first and the last bytes written to it, within a limit:
// memory is bounded by the limit, not by the amount written.
type headTail struct {
	headCap, tailCap int
	head             []byte
	tail             []byte // a ring once len(tail) == tailCap
	pos              int    // next write position in a full ring
	total            int64
}

func newHeadTail(limit int64) *headTail {
	h := int(min(limit/2, int64(maxInt/2)))
	t := int(min(limit-int64(h), int64(maxInt/2)))
	return &headTail{headCap: h, tailCap: t}
}

const maxInt = int(^uint(0) >> 1)

// grow appends p to b without letting b's capacity exceed limit.
func grow(b, p []byte, limit int) []byte {
	if need := len(b) + len(p); need > cap(b) {
		nc := min(max(2*cap(b), need, 512), limit)
		nb := make([]byte, len(b), nc)
		copy(nb, b)
		b = nb
	}
	return append(b, p...)
}

// Write keeps p's bytes that fit in the head, and the rest in the tail ring.
func (b *headTail) Write(p []byte) (int, error) {
	n := len(p)
	b.total += int64(n)
	if room := b.headCap - len(b.head); room > 0 {
		k := min(room, len(p))
		b.head = grow(b.head, p[:k], b.headCap)
		p = p[k:]
	}
	if len(p) == 0 || b.tailCap == 0 {
		return n, nil
	}
	if len(p) >= b.tailCap {
		p = p[len(p)-b.tailCap:]
		if cap(b.tail) < b.tailCap {
			b.tail = make([]byte, 0, b.tailCap)
		}
		b.tail = append(b.tail[:0], p...)
		b.pos = 0
		return n, nil
	}
	if room := b.tailCap - len(b.tail); room > 0 {
		k := min(room, len(p))
		b.tail = grow(b.tail, p[:k], b.tailCap)
		p = p[k:]
	}
	for len(p) > 0 { // the ring is full: overwrite the oldest bytes
		k := copy(b.tail[b.pos:], p)
		p = p[k:]
		b.pos = (b.pos + k) % b.tailCap
	}
	return n, nil
}

// result returns the kept bytes, with a TruncationMarker where bytes were
// dropped, and the number of dropped bytes. Cuts fall on UTF-8 character
// boundaries when the text is UTF-8.
func (b *headTail) result() ([]byte, int64) {
	head := b.head
	tail := b.tail
	if b.pos > 0 {
		tail = append(append(make([]byte, 0, len(b.tail)), b.tail[b.pos:]...), b.tail[:b.pos]...)
	}
	dropped := b.total - int64(len(head)) - int64(len(tail))
	if dropped == 0 {
		return append(head, tail...), 0
	}
	// Do not split a UTF-8 sequence at either side of the cut.
	if i := lastRuneStart(head); i >= 0 && !utf8.FullRune(head[i:]) {
		dropped += int64(len(head) - i)
		head = head[:i]
	}
	for k := 0; k < utf8.UTFMax-1 && len(tail) > 0 && !utf8.RuneStart(tail[0]); k++ {
		tail = tail[1:]
		dropped++
	}
	marker := TruncationMarker(dropped)
	out := make([]byte, 0, len(head)+len(marker)+len(tail))
	out = append(append(append(out, head...), marker...), tail...)
	return out, dropped
}

// lastRuneStart returns the index of the start of the last (possibly
// incomplete) UTF-8 sequence in the final utf8.UTFMax bytes of b, or -1.
func lastRuneStart(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return -1
}

// chunk is one piece of a background process's output.
type chunk struct {
	kind EventKind
	off  int64 // offset of data[0] in the process's output
	data []byte
}

// Limits of a logBuf's bookkeeping.
const (
	coalesceMax = 32 << 10 // consecutive output of one stream is merged up to this size
	maxChunks   = 8192     // bounds the chunk headers when stdout and stderr alternate
)

// logBuf is a background process's bounded replay buffer: the latest
// output, in order, with its stream kind, addressed by absolute offsets so
// that readers can follow it and notice what they missed.
type logBuf struct {
	mu     sync.Mutex
	limit  int64
	chunks []chunk
	first  int   // index of the oldest chunk in chunks
	start  int64 // offset of the oldest byte held
	end    int64 // offset after the newest byte: all output so far
	notify chan struct{}
	closed bool
	exit   *ExitStatus
}

func newLogBuf(limit int64) *logBuf {
	return &logBuf{limit: limit, notify: make(chan struct{})}
}

// add appends output of kind and wakes the readers.
func (l *logBuf) add(kind EventKind, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	skip := int64(0)
	if int64(len(p)) > l.limit {
		skip = int64(len(p)) - l.limit
		l.end += skip // as if written and dropped at once
		p = p[skip:]
	}
	if n := len(l.chunks); skip == 0 && n > l.first && l.chunks[n-1].kind == kind && len(l.chunks[n-1].data)+len(p) <= coalesceMax {
		c := &l.chunks[n-1]
		c.data = append(c.data, p...)
	} else {
		l.chunks = append(l.chunks, chunk{kind: kind, off: l.end, data: append([]byte(nil), p...)})
	}
	l.end += int64(len(p))
	// Drop the oldest output beyond the limits.
	for l.end-l.start > l.limit || len(l.chunks)-l.first > maxChunks {
		c := &l.chunks[l.first]
		over := l.end - l.start - l.limit
		if len(l.chunks)-l.first > maxChunks || over >= c.off+int64(len(c.data))-l.start {
			l.start = c.off + int64(len(c.data))
			l.chunks[l.first] = chunk{}
			l.first++
			continue
		}
		l.start += over
	}
	if l.first > 0 && l.first >= len(l.chunks)/2 { // compact
		n := copy(l.chunks, l.chunks[l.first:])
		clear(l.chunks[n:])
		l.chunks = l.chunks[:n]
		l.first = 0
	}
	if len(l.chunks) > l.first {
		if c := &l.chunks[l.first]; c.off < l.start { // trim a partly dropped chunk
			c.data = c.data[l.start-c.off:]
			c.off = l.start
		}
	}
	close(l.notify)
	l.notify = make(chan struct{})
}

// finish records the exit status; readers get it after the last output.
func (l *logBuf) finish(st ExitStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exit = &st
	l.closed = true
	close(l.notify)
}

// read returns the output from offset pos on: the bytes skipped because the
// buffer no longer holds them, the events, the next offset, and then the
// exit status if the process has exited and all its output was returned,
// else a channel that is closed when there is more to read. Event data must
// not be modified.
func (l *logBuf) read(pos int64) (gap int64, evs []Event, next int64, exit *ExitStatus, wait <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if pos < l.start {
		gap = l.start - pos
		pos = l.start
	}
	for _, c := range l.chunks[l.first:] {
		cend := c.off + int64(len(c.data))
		if cend <= pos {
			continue
		}
		d := c.data[pos-c.off:]
		evs = append(evs, Event{Kind: c.kind, Data: d[:len(d):len(d)]})
		pos = cend
	}
	if l.closed {
		return gap, evs, pos, l.exit, nil
	}
	return gap, evs, pos, nil, l.notify
}
