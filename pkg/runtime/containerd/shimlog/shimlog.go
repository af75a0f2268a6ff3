// Package shimlog is berth's logging binary for containerd tasks: the
// containerd backend starts each sandbox's task with a binary:// log URI
// naming the sandbox's copy of sandbox-agent and one argument (Arg), and
// the task's shim runs that binary beside the task. It copies the task's
// stdout and stderr into one file, as containerd's own file logging does,
// but rotates it: at most MaxFiles files (the one being written included)
// of at most MaxBytes each, so a sandbox that floods its output cannot
// fill the host's disk. The binary lives as long as the task, not as the
// orchestrator: a restarted orchestrator finds it still at work.
//
// The protocol is containerd's (runtime v2 logging): the task's stdout and
// stderr are file descriptors 3 and 4, and the binary signals that it is
// ready by writing one byte to descriptor 5 and closing it.
package shimlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Arg is the binary's one argument, whose value is Encode's.
const Arg = "--berth-shim-log"

// Encode is Arg's value for a log at path bounded to maxFiles files of
// maxBytes each.
func Encode(path string, maxBytes int64, maxFiles int) string {
	return strconv.FormatInt(maxBytes, 10) + ":" + strconv.Itoa(maxFiles) + ":" + path
}

// decode reads Encode's value.
func decode(v string) (path string, maxBytes int64, maxFiles int, err error) {
	parts := strings.SplitN(v, ":", 3)
	if len(parts) != 3 {
		return "", 0, 0, fmt.Errorf("%s %q: want MAXBYTES:MAXFILES:PATH", Arg, v)
	}
	maxBytes, err1 := strconv.ParseInt(parts[0], 10, 64)
	maxFiles, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || maxBytes <= 0 || maxFiles <= 0 || !strings.HasPrefix(parts[2], "/") {
		return "", 0, 0, fmt.Errorf("%s %q: want MAXBYTES:MAXFILES:PATH with positive numbers and an absolute path", Arg, v)
	}
	return parts[2], maxBytes, maxFiles, nil
}

// Main runs the logging binary when args (the program's arguments, without
// its name) are [Arg, value], and reports whether it did; code is the exit
// status then.
func Main(args []string) (handled bool, code int) {
	if len(args) != 2 || args[0] != Arg {
		return false, 0
	}
	if err := run(args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "berth shim log:", err)
		return true, 1
	}
	return true, 0
}

func run(v string) error {
	path, maxBytes, maxFiles, err := decode(v)
	if err != nil {
		return err
	}
	stdout, stderr, wait := os.NewFile(3, "stdout"), os.NewFile(4, "stderr"), os.NewFile(5, "wait")
	w, err := Open(path, maxBytes, maxFiles)
	if err != nil {
		wait.Close() // the shim then reports that the binary did not start
		return err
	}
	defer w.Close()
	if _, err := wait.Write([]byte{0}); err != nil {
		return fmt.Errorf("signal ready: %w", err)
	}
	wait.Close()
	var wg sync.WaitGroup
	for _, in := range []*os.File{stdout, stderr} {
		wg.Go(func() { _, _ = io.Copy(w, in) })
	}
	wg.Wait() // both pipes closed: the task is gone
	return nil
}

// Rotator is an io.Writer to a file that never grows past MaxBytes: the
// write that would pass it goes, the rest of it, to a new file, after the
// old ones move up (path → path.1 → path.2 …) and the oldest beyond
// MaxFiles is dropped. It is safe for concurrent use.
type Rotator struct {
	path     string
	maxBytes int64
	maxFiles int

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (appends to) the log at path, bounded to maxFiles files of
// maxBytes each.
func Open(path string, maxBytes int64, maxFiles int) (*Rotator, error) {
	if maxBytes <= 0 || maxFiles <= 0 {
		return nil, errors.New("shimlog: maxBytes and maxFiles must be positive")
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Rotator{path: path, maxBytes: maxBytes, maxFiles: maxFiles, f: f, size: st.Size()}, nil
}

// Write implements io.Writer.
func (r *Rotator) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	written := 0
	for len(p) > 0 {
		if r.size >= r.maxBytes {
			if err := r.rotate(); err != nil {
				return written, err
			}
		}
		n := int(min(int64(len(p)), r.maxBytes-r.size))
		m, err := r.f.Write(p[:n])
		written += m
		r.size += int64(m)
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// rotate moves the files up and starts a new one; r.mu is held.
func (r *Rotator) rotate() error {
	if err := r.f.Close(); err != nil {
		return err
	}
	for i := r.maxFiles - 1; i >= 1; i-- {
		from := r.path
		if i > 1 {
			from = r.path + "." + strconv.Itoa(i-1)
		}
		if err := os.Rename(from, r.path+"."+strconv.Itoa(i)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	r.f, r.size = f, 0
	return nil
}

// Close closes the file.
func (r *Rotator) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.f.Close()
}
