// Package mask replaces secret values in command output with a placeholder
// naming the secret, <secret:NAME>.
//
// A Masker holds the secrets; a Stream masks one output stream written in
// chunks, and catches a value split across chunk boundaries by holding back
// a tail that could still start a value (at most the longest value's length
// minus one byte) until the next chunk or Close. Where values overlap the
// longest match wins. Values shorter than MinLen bytes are not masked: a
// two-letter value would mangle ordinary output everywhere it appears.
//
// Masking is literal: a transformed value (base64, hex, URL-encoded, in
// another case, or split by the program itself across writes with other
// output between) is not recognised.
package mask

import (
	"bytes"
	"sort"
	"sync/atomic"
)

// MinLen is the length, in bytes, below which a value is not masked.
const MinLen = 4

// Placeholder returns the text that replaces the value of secret name.
func Placeholder(name string) string { return "<secret:" + name + ">" }

type secret struct {
	value []byte
	repl  []byte
}

// Masker replaces the values of a set of secrets. A nil *Masker masks
// nothing. It is safe for concurrent use; its Streams are not. The set
// of a Masker made with NewSettable can be replaced (Set); a Stream keeps
// the set it was started with.
type Masker struct {
	cur atomic.Pointer[table]
}

// table is one set of secrets, immutable once built.
type table struct {
	secrets []secret // longest value first
	first   [256]bool
	maxLen  int
}

// New returns a Masker for secrets (name → value), or nil when no value is
// at least MinLen bytes long. When two names share a value, the
// alphabetically first name is used.
func New(secrets map[string]string) *Masker {
	t := newTable(secrets)
	if t == nil {
		return nil
	}
	m := &Masker{}
	m.cur.Store(t)
	return m
}

// NewSettable returns a Masker for secrets whose set Set can replace;
// never nil.
func NewSettable(secrets map[string]string) *Masker {
	m := &Masker{}
	m.cur.Store(newTable(secrets))
	return m
}

// Set replaces m's secrets (a Masker from NewSettable; New's may be nil).
// Streams started before keep the old set.
func (m *Masker) Set(secrets map[string]string) { m.cur.Store(newTable(secrets)) }

// load returns the current set, nil when there is nothing to mask.
func (m *Masker) load() *table {
	if m == nil {
		return nil
	}
	return m.cur.Load()
}

// newTable builds the set for secrets, nil when no value is long enough.
func newTable(secrets map[string]string) *table {
	names := make([]string, 0, len(secrets))
	for n := range secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	m := &table{}
	seen := make(map[string]bool)
	for _, n := range names {
		v := secrets[n]
		if len(v) < MinLen || seen[v] {
			continue
		}
		seen[v] = true
		m.secrets = append(m.secrets, secret{value: []byte(v), repl: []byte(Placeholder(n))})
		m.first[v[0]] = true
		m.maxLen = max(m.maxLen, len(v))
	}
	if len(m.secrets) == 0 {
		return nil
	}
	sort.SliceStable(m.secrets, func(i, j int) bool { return len(m.secrets[i].value) > len(m.secrets[j].value) })
	return m
}

// Bytes returns p with every value replaced.
func (m *Masker) Bytes(p []byte) []byte {
	t := m.load()
	if t == nil {
		return p
	}
	out, _ := t.scan(nil, p, true)
	return out
}

// scan appends p, masked, to out. Unless final, it stops at a tail that is
// a proper prefix of some value (longer values first) and returns that
// tail's length as held.
func (m *table) scan(out, p []byte, final bool) (_ []byte, held int) {
	start := 0 // p[start:i] is plain output not yet appended
	for i := 0; i < len(p); {
		if !m.first[p[i]] {
			i++
			continue
		}
		matched := false
		for _, s := range m.secrets {
			rest := p[i:]
			if len(rest) >= len(s.value) {
				if bytes.Equal(rest[:len(s.value)], s.value) {
					out = append(append(out, p[start:i]...), s.repl...)
					i += len(s.value)
					start = i
					matched = true
					break
				}
			} else if !final && bytes.HasPrefix(s.value, rest) {
				// A longer value may still complete: hold the tail.
				return append(out, p[start:i]...), len(rest)
			}
		}
		if !matched {
			i++
		}
	}
	return append(out, p[start:]...), 0
}

// Stream returns a masker for one stream of chunks.
func (m *Masker) Stream() *Stream { return &Stream{m: m.load()} }

// Stream masks one output stream given in chunks. A Stream of a nil Masker
// passes chunks through unchanged.
type Stream struct {
	m       *table
	pending []byte
}

// Write returns chunk p masked, less a held-back tail that could start a
// value; the returned slice is only valid until the next call.
func (s *Stream) Write(p []byte) []byte {
	if s.m == nil {
		return p
	}
	in := p
	if len(s.pending) > 0 {
		in = append(s.pending, p...)
	}
	out, held := s.m.scan(make([]byte, 0, len(in)+16), in, false)
	s.pending = append(s.pending[:0:0], in[len(in)-held:]...)
	return out
}

// Close returns the held-back tail, masked.
func (s *Stream) Close() []byte {
	if s.m == nil || len(s.pending) == 0 {
		return nil
	}
	out, _ := s.m.scan(nil, s.pending, true)
	s.pending = nil
	return out
}

// Pending reports whether bytes are held back.
func (s *Stream) Pending() bool { return len(s.pending) > 0 }
