package process

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestHeadTailMatchesReference(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 500 {
		limit := int64(rng.IntN(64))
		b := newHeadTail(limit)
		var all []byte
		for range rng.IntN(20) {
			p := make([]byte, rng.IntN(40))
			for i := range p {
				p[i] = byte('a' + rng.IntN(26))
			}
			_, _ = b.Write(p)
			all = append(all, p...)
		}
		got, dropped := b.result()
		if int64(len(all)) <= limit {
			if dropped != 0 || !bytes.Equal(got, all) {
				t.Fatalf("iter %d: limit %d: got %q, want %q", iter, limit, got, all)
			}
			continue
		}
		h := limit / 2
		want := string(all[:h]) + TruncationMarker(int64(len(all))-limit) + string(all[int64(len(all))-(limit-h):])
		if dropped != int64(len(all))-limit || string(got) != want {
			t.Fatalf("iter %d: limit %d: got %q (%d), want %q", iter, limit, got, dropped, want)
		}
		if cap(b.head) > int(h) || cap(b.tail) > int(limit-h) {
			t.Fatalf("buffers exceed the limit: %d %d", cap(b.head), cap(b.tail))
		}
	}
}

func TestHeadTailKeepsRunesWhole(t *testing.T) {
	t.Parallel()
	b := newHeadTail(10)
	_, _ = b.Write([]byte(strings.Repeat("é", 20))) // 2 bytes each
	_, _ = b.Write([]byte("€"))                     // 3 bytes
	got, dropped := b.result()
	if !utf8.Valid(got) {
		t.Fatalf("invalid UTF-8: %q", got)
	}
	if int64(len(got))-int64(len(TruncationMarker(dropped)))+dropped != 43 {
		t.Errorf("kept %q, dropped %d", got, dropped)
	}
}

func TestLogBufBoundsAndOffsets(t *testing.T) {
	t.Parallel()
	l := newLogBuf(10)
	l.add(EventStdout, []byte("0123"))
	l.add(EventStdout, []byte("4567")) // coalesced
	l.add(EventStderr, []byte("89ab"))
	gap, evs, next, exit, wait := l.read(0)
	if gap != 2 || next != 12 || exit != nil || wait == nil || len(evs) != 2 ||
		string(evs[0].Data) != "234567" || evs[0].Kind != EventStdout || string(evs[1].Data) != "89ab" || evs[1].Kind != EventStderr {
		t.Fatalf("gap %d next %d evs %+v", gap, next, evs)
	}
	l.add(EventStderr, []byte("this is longer than ten"))
	gap, evs, next, _, _ = l.read(next)
	if gap != 13 || next != 35 || len(evs) != 1 || string(evs[0].Data) != "r than ten" {
		t.Fatalf("gap %d next %d evs %+v", gap, next, evs)
	}
	l.finish(ExitStatus{ExitCode: 3})
	_, evs, _, exit, wait = l.read(next)
	if len(evs) != 0 || exit == nil || exit.ExitCode != 3 || wait != nil {
		t.Fatalf("after finish: %+v %+v", evs, exit)
	}

	// Many alternating small writes: the number of chunks stays bounded.
	l = newLogBuf(1 << 20)
	for i := range 3 * maxChunks {
		l.add(EventKind(EventStdout+EventKind(i%2)), []byte{'x'})
	}
	if n := len(l.chunks) - l.first; n > maxChunks {
		t.Fatalf("%d chunks", n)
	}
	gap, evs, _, _, _ = l.read(0)
	if gap != 2*maxChunks || len(evs) != maxChunks {
		t.Fatalf("gap %d, %d events", gap, len(evs))
	}
}
