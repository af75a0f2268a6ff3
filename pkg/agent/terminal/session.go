package terminal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// ErrSlowClient ends an attachment whose client fell more than
// Config.ClientBuffer bytes behind the terminal's output. It is in the
// errdefs.ErrUnavailable category: the client may re-attach.
var ErrSlowClient = errdefs.Unavailable("terminal client too slow: more output was pending than its buffer holds; re-attach to continue")

// errDetached ends an attachment that Detach closed.
var errDetached = errors.New("detached")

// errEnded is wrapped by the errors of input, resizes and signals sent to
// a session whose program has exited.
var errEnded = errors.New("has ended")

const (
	// readBufSize is the largest output chunk.
	readBufSize = 32 << 10
	// drainDelay is how long output is still read after the program exited
	// and its session was killed, for processes that escaped the session
	// but hold the terminal open.
	drainDelay = 500 * time.Millisecond
	// watcherChunks bounds a client's queue in chunks (ClientBuffer bounds
	// it in bytes).
	watcherChunks = 4096
)

// Exit says how a session's program ended.
type Exit struct {
	// Code is the exit status, or -1 when a signal ended the program.
	Code int
	// Signal names the terminating signal ("SIGKILL"), if any.
	Signal string
}

// Info describes a session.
type Info struct {
	// ID identifies the session, like "t-1f2e3d4c5b6a7988".
	ID string
	// Pid is the program's process id, which is also its session id.
	Pid int
	// Argv is the program and its arguments as started; Command the shell
	// line when one was given.
	Argv    []string
	Command string
	// Cwd is the working directory the program started in ("" for the
	// agent's own).
	Cwd string
	// User is the user the program runs as (its USER variable).
	User string
	// Term is the TERM variable.
	Term string
	// Rows and Cols are the terminal's current size.
	Rows, Cols int
	// Running is false once the program ended; Exit says how.
	Running bool
	Exit    *Exit
	// StartedAt and ExitedAt are wall-clock times; ExitedAt is zero while
	// the program runs.
	StartedAt, ExitedAt time.Time
	// Clients is the number of attached clients.
	Clients int
}

// Session is one program on one pseudo-terminal. It is safe for concurrent
// use.
type Session struct {
	m         *Manager
	id        string
	command   string
	user      string
	term      string
	startedAt time.Time
	cmd       *exec.Cmd
	pid       int
	ptmx      *os.File // the terminal's master side, non-blocking

	readDone   chan struct{} // closed when the reader stopped
	draining   atomic.Bool   // wait gave up on the output: the reader must stop
	leaderDone chan struct{} // closed when the program has exited and was reaped
	stopOnce   sync.Once
	done       chan struct{} // closed when the exit is published

	mu       sync.Mutex // guards the fields below
	rows     int
	cols     int
	scroll   *ring
	watchers map[*watcher]struct{}
	reaped   bool // the leader was reaped: its pid may belong to someone else
	ended    bool // the exit is published
	exit     Exit
	exitedAt time.Time
}

// watcher is one attached client's queue.
type watcher struct {
	ch     chan []byte
	queued atomic.Int64 // bytes in ch
	err    error        // why ch was closed; set before closing
}

// ID returns the session's id.
func (s *Session) ID() string { return s.id }

// Done is closed when the session has ended and its exit is known.
func (s *Session) Done() <-chan struct{} { return s.done }

// Exit returns how the program ended, and false while it runs.
func (s *Session) Exit() (Exit, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exit, s.ended
}

// Info describes the session.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := Info{
		ID: s.id, Pid: s.pid, Argv: append([]string(nil), s.cmd.Args...), Command: s.command,
		Cwd: s.cmd.Dir, User: s.user, Term: s.term, Rows: s.rows, Cols: s.cols,
		Running: !s.ended, StartedAt: s.startedAt, ExitedAt: s.exitedAt, Clients: len(s.watchers),
	}
	if s.ended {
		e := s.exit
		in.Exit = &e
	}
	return in
}

// read copies the terminal's output to the scrollback and the clients
// until the terminal is closed or hung up (EIO once no process holds it).
func (s *Session) read() {
	defer close(s.readDone)
	buf := make([]byte, readBufSize)
	ms := s.m.cfg.Masker.Stream()
	for {
		n, err := s.ptmx.Read(buf)
		if n > 0 {
			if out := ms.Write(buf[:n]); len(out) > 0 {
				s.publish(out)
			}
			if ms.Pending() && !s.draining.Load() {
				// A held-back tail that could start a secret waits for the
				// next output, but no longer than Config.MaskQuiet: a
				// terminal must not sit on an echo.
				_ = s.ptmx.SetReadDeadline(time.Now().Add(s.m.cfg.MaskQuiet))
			}
		}
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && ms.Pending() && !s.draining.Load() {
			if out := ms.Close(); len(out) > 0 {
				s.publish(out)
			}
			_ = s.ptmx.SetReadDeadline(time.Time{})
			if !s.draining.Load() {
				continue
			}
		}
		if err != nil {
			if out := ms.Close(); len(out) > 0 {
				s.publish(out)
			}
			return
		}
	}
}

// DefaultMaskQuiet is Config.MaskQuiet's default: a held-back tail that
// could start a secret waits this long for more output.
const DefaultMaskQuiet = 100 * time.Millisecond

// publish appends p to the scrollback and queues a copy for every client;
// a client whose queue is full is disconnected, never waited for.
func (s *Session) publish(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scroll.write(p)
	if len(s.watchers) == 0 {
		return
	}
	c := bytes.Clone(p) // shared, read-only, by every client
	n := int64(len(c))
	for w := range s.watchers {
		if w.queued.Add(n) > int64(s.m.cfg.ClientBuffer) {
			s.dropLocked(w, ErrSlowClient)
			continue
		}
		select {
		case w.ch <- c:
		default:
			s.dropLocked(w, ErrSlowClient)
		}
	}
}

// dropLocked ends w's attachment with err. s.mu must be held.
func (s *Session) dropLocked(w *watcher, err error) {
	if _, ok := s.watchers[w]; !ok {
		return
	}
	delete(s.watchers, w)
	w.err = err
	close(w.ch)
	if errors.Is(err, ErrSlowClient) {
		s.m.log.Warn("terminal client too slow, disconnected", "session_id", s.id)
	}
}

// wait waits for the program to exit, kills what is left of its session,
// drains the output and publishes the exit.
func (s *Session) wait() {
	peeked := waitExited(s.pid) == nil
	if !peeked {
		_ = s.cmd.Wait()
	}
	s.mu.Lock()
	if peeked {
		// The leader is a zombie: the session id is still ours.
		s.signalSessionLocked(syscall.SIGKILL)
		_ = s.cmd.Wait()
	}
	s.reaped = true
	s.mu.Unlock()
	if !peeked {
		// Best effort: the group id is very probably still ours.
		_ = syscall.Kill(-s.pid, syscall.SIGKILL)
	}
	close(s.leaderDone)
	exit := Exit{Code: -1}
	if ps := s.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			exit.Signal = process.SignalName(ws.Signal())
		} else {
			exit.Code = ps.ExitCode()
		}
	}
	t := time.NewTimer(drainDelay)
	select {
	case <-s.readDone:
	case <-t.C:
		s.m.log.Debug("terminal still open after its session was killed; no longer reading", "session_id", s.id, "pid", s.pid)
		s.draining.Store(true)
		_ = s.ptmx.SetReadDeadline(time.Now())
		<-s.readDone
	}
	t.Stop()
	_ = s.ptmx.Close()

	s.mu.Lock()
	s.ended = true
	s.exit = exit
	s.exitedAt = time.Now()
	for w := range s.watchers {
		w.err = io.EOF
		close(w.ch)
	}
	clear(s.watchers)
	s.mu.Unlock()
	s.m.log.Info("terminal session ended", "session_id", s.id, "pid", s.pid, "exit_code", exit.Code, "signal", exit.Signal)
	s.m.ended(s) // before done: whoever waited for the end finds the slot free
	close(s.done)
}

// signalSessionLocked sends sig to every process of the terminal's session
// (and the leader's group, should /proc be unreadable). s.mu must be held
// and the leader not reaped.
func (s *Session) signalSessionLocked(sig syscall.Signal) {
	_ = syscall.Kill(-s.pid, sig)
	for _, pid := range sessionMembers(s.pid) {
		_ = syscall.Kill(pid, sig)
	}
}

// stop ends the session: SIGHUP and SIGCONT to its processes, SIGKILL after
// the kill grace. It returns at once.
func (s *Session) stop() {
	s.stopOnce.Do(func() { go s.terminate() })
}

func (s *Session) terminate() {
	if !s.signalAll(syscall.SIGHUP) {
		return
	}
	s.signalAll(syscall.SIGCONT) // let stopped jobs see the hangup
	t := time.NewTimer(s.m.cfg.KillGrace)
	defer t.Stop()
	select {
	case <-s.leaderDone:
	case <-t.C:
		s.signalAll(syscall.SIGKILL)
	}
}

// signalAll sends sig to every process of the session; false when the
// program has already exited.
func (s *Session) signalAll(sig syscall.Signal) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reaped {
		return false
	}
	s.signalSessionLocked(sig)
	return true
}

// endedError is the error of input, resizes and signals after the end.
func (s *Session) endedError() error {
	return fmt.Errorf("%w: terminal session %s %w", errdefs.ErrFailedPrecondition, s.id, errEnded)
}

// Write writes p to the terminal as if typed. It blocks while the
// terminal's input queue is full (the program does not read).
func (s *Session) Write(p []byte) (int, error) {
	select {
	case <-s.leaderDone:
		return 0, s.endedError()
	default:
	}
	n, err := s.ptmx.Write(p)
	if err != nil {
		select {
		case <-s.leaderDone:
			return n, s.endedError()
		default:
		}
		if errors.Is(err, os.ErrClosed) {
			return n, s.endedError()
		}
		return n, errdefs.FailedPrecondition("terminal session %s: write: %v", s.id, err)
	}
	return n, nil
}

// Resize sets the terminal's size; the program gets SIGWINCH.
func (s *Session) Resize(rows, cols int) error {
	if err := checkSize(rows, cols); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reaped {
		return s.endedError()
	}
	if err := setWinsize(s.ptmx, uint16(rows), uint16(cols)); err != nil {
		return errdefs.FailedPrecondition("terminal session %s: resize: %v", s.id, err)
	}
	s.rows, s.cols = rows, cols
	return nil
}

// Signal sends sig to the terminal's foreground process group, as the
// terminal's own keys (Ctrl-C, Ctrl-\) do.
func (s *Session) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reaped {
		return s.endedError()
	}
	pg, err := foregroundGroup(s.ptmx)
	if err != nil || pg <= 0 {
		pg = s.pid
	}
	_ = syscall.Kill(-pg, sig)
	return nil
}

// Attachment is one client's view of a session: the scrollback at the time
// it attached, then the output as produced. Detach it when done.
type Attachment struct {
	s      *Session
	w      *watcher
	replay []byte
}

// Attach attaches a client. With replay, Replay returns the scrollback.
// Attaching to an ended session succeeds: Next then reports io.EOF at once.
func (s *Session) Attach(replay bool) *Attachment {
	w := &watcher{ch: make(chan []byte, watcherChunks)}
	a := &Attachment{s: s, w: w}
	s.mu.Lock()
	defer s.mu.Unlock()
	if replay {
		a.replay = s.scroll.bytes()
	}
	if s.ended {
		w.err = io.EOF
		close(w.ch)
		return a
	}
	s.watchers[w] = struct{}{}
	return a
}

// Session returns the attached session.
func (a *Attachment) Session() *Session { return a.s }

// Replay returns the scrollback as it was when the client attached (nil
// without replay).
func (a *Attachment) Replay() []byte { return a.replay }

// Next returns the next chunk of output. It returns io.EOF once the session
// ended and every chunk was returned (Session.Exit then says how),
// ErrSlowClient when the client fell too far behind, and ctx's error when
// ctx ends first.
func (a *Attachment) Next(ctx context.Context) ([]byte, error) {
	select {
	case b, ok := <-a.w.ch:
		if !ok {
			return nil, a.w.err
		}
		a.w.queued.Add(-int64(len(b)))
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Detach ends the attachment; the session keeps running.
func (a *Attachment) Detach() {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	a.s.dropLocked(a.w, errDetached)
}
