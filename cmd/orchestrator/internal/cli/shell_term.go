package cli

import (
	"fmt"
	"strings"
	"sync"

	"golang.org/x/term"
)

// localTerm is the terminal `shell` runs on: stdin's descriptor when stdin
// is a terminal (raw mode, input), and the descriptor the window size is
// read from (stdout's when it is a terminal, else stdin's).
type localTerm struct {
	in, sized int // -1 when there is none
}

// fder is an *os.File.
type fder interface{ Fd() uintptr }

// localTerminal finds env's terminal, if any.
func localTerminal(env Env) localTerm {
	lt := localTerm{in: terminalFD(env.Stdin), sized: terminalFD(env.Stdout)}
	if lt.sized < 0 {
		lt.sized = lt.in
	}
	return lt
}

// terminalFD is v's file descriptor when v is a terminal, else -1.
func terminalFD(v any) int {
	f, ok := v.(fder)
	if !ok {
		return -1
	}
	fd := int(f.Fd())
	if !term.IsTerminal(fd) {
		return -1
	}
	return fd
}

// interactive reports whether stdin is a terminal.
func (t localTerm) interactive() bool { return t.in >= 0 }

// size returns the window's size, if there is a terminal to ask.
func (t localTerm) size() (rows, cols uint32, ok bool) {
	if t.sized < 0 {
		return 0, 0, false
	}
	w, h, err := term.GetSize(t.sized)
	if err != nil || w <= 0 || h <= 0 {
		return 0, 0, false
	}
	return uint32(h), uint32(w), true
}

// makeRaw puts stdin's terminal in raw mode (no echo, no line editing, no
// signals from keys: every byte goes to the sandbox) and returns the
// function that restores it; that function may be called more than once.
// Without a terminal it does nothing.
func (t localTerm) makeRaw() (restore func(), err error) {
	if t.in < 0 {
		return func() {}, nil
	}
	old, err := term.MakeRaw(t.in)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { _ = term.Restore(t.in, old) }) }, nil
}

// parseDetachKeys parses a detach sequence as docker writes it: keys
// separated by commas, each a single character or ctrl-X (X a letter or
// one of @[\]^_). The empty string disables detaching.
func parseDetachKeys(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	var keys []byte
	for _, k := range strings.Split(s, ",") {
		switch name, ok := strings.CutPrefix(strings.ToLower(k), "ctrl-"); {
		case ok && len(name) == 1 && name[0] >= 'a' && name[0] <= 'z':
			keys = append(keys, name[0]-'a'+1)
		case ok && len(name) == 1 && strings.Contains("@[\\]^_", name):
			keys = append(keys, name[0]-'@')
		case !ok && len(k) == 1 && k[0] >= ' ' && k[0] < 0x7f:
			keys = append(keys, k[0])
		default:
			return nil, fmt.Errorf("--detach-keys %q: %q is neither one character nor ctrl-X", s, k)
		}
	}
	return keys, nil
}

// describeKeys writes a detach sequence back for people ("ctrl-p ctrl-q").
func describeKeys(keys []byte) string {
	names := make([]string, len(keys))
	for i, k := range keys {
		if k < ' ' {
			names[i] = "ctrl-" + strings.ToLower(string(rune(k+'@')))
		} else {
			names[i] = string(rune(k))
		}
	}
	return strings.Join(names, " ")
}

// detachKeys spots the detach sequence in the input. The bytes of a
// partial match are held back until the next byte shows whether the
// sequence goes on; they are sent as typed when it does not.
type detachKeys struct {
	keys    []byte
	matched int
}

// filter returns the bytes of p to send and whether the whole sequence has
// been typed (what follows it is dropped).
func (d *detachKeys) filter(p []byte) (out []byte, hit bool) {
	if len(d.keys) == 0 {
		return p, false
	}
	for _, b := range p {
		if b == d.keys[d.matched] {
			d.matched++
			if d.matched == len(d.keys) {
				return out, true
			}
			continue
		}
		out = append(out, d.keys[:d.matched]...)
		d.matched = 0
		if b == d.keys[0] {
			d.matched = 1
			if len(d.keys) == 1 {
				return out, true
			}
			continue
		}
		out = append(out, b)
	}
	return out, false
}
