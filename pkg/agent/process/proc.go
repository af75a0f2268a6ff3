package process

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var errUnsupported = errors.New("not supported on this system")

// readBufSize is the size of one read from a command's output pipe, and so
// the largest output chunk.
const readBufSize = 32 << 10

// readBufs holds read buffers of readBufSize bytes; sinks copy what they keep.
var readBufs = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// proc is one running (or finished) command.
type proc struct {
	r   *Runner
	id  string // background process id; empty for Exec and Stream
	seq uint64
	pl  plan

	// What the caller asked for, for Info.
	argv    []string
	command string
	cwd     string

	cmd       *exec.Cmd
	pid       int
	startedAt time.Time

	stdin     *os.File // our end of the command's stdin pipe, or nil
	stdinOnce sync.Once
	stdinSem  chan struct{} // a one-slot semaphore that serializes writes to stdin

	outR [2]*os.File // our ends of stdout and stderr
	// readersLeft counts the output readers still running; the last one
	// to end closes readersDone.
	readersLeft atomic.Int32
	readersDone chan struct{}
	logs        *logBuf // background processes only

	timedOut atomic.Bool
	// agentKilled is set when the agent sent the group SIGKILL (stop,
	// timeout, Close, or a caller's Signal); such a death is not an OOM kill.
	agentKilled atomic.Bool
	oomBefore   uint64      // the cgroup's oom_kill count before the start
	oomKnown    bool        // oomBefore was read
	cancelled   atomic.Bool // the caller's context ended the command
	stopOnce    sync.Once
	stopCh      chan struct{}

	leaderCh   chan struct{} // closed when the leader has exited
	leaderAt   time.Time     // when; set before leaderCh is closed
	peeked     bool          // leader observed without being reaped; set before leaderCh is closed
	waitErr    error         // from an early Wait; set before leaderCh is closed
	done       chan struct{} // closed when everything is over
	mu         sync.Mutex    // guards the fields below
	reaped     bool
	exited     bool
	status     ExitStatus
	stdinShut  bool
	exitedWall time.Time
}

// sinkFunc receives output chunks; it is called concurrently for stdout and
// stderr, and must copy data it keeps.
type sinkFunc func(kind EventKind, data []byte)

// spawn starts the command of pl. id and logs are set for background
// processes, whose output goes to logs; other commands' output goes to sink.
// The caller then runs p.supervise, which stops the command when the
// caller's ctx is done or its timeout passes and finishes it: in a new
// goroutine, or (Exec, which waits for the command anyway) in its own.
func (r *Runner) spawn(s Spec, pl plan, id string, logs *logBuf, sink sinkFunc) (*proc, error) {
	if logs != nil {
		sink = logs.add
	}
	p := &proc{
		logs:     logs,
		r:        r,
		id:       id,
		pl:       pl,
		argv:     s.Argv,
		command:  s.Command,
		cwd:      pl.dir,
		stdinSem: make(chan struct{}, 1),
		stopCh:   make(chan struct{}),
		leaderCh: make(chan struct{}),
		done:     make(chan struct{}),

		readersDone: make(chan struct{}),
	}
	if err := r.acquire(p); err != nil {
		return nil, err
	}
	var files []*os.File // every end we opened, closed on failure
	fail := func(err error) (*proc, error) {
		for _, f := range files {
			_ = f.Close()
		}
		r.release(p, false)
		close(p.done) // for Close, which may be waiting
		return nil, err
	}
	pipe := func() (rd, wr *os.File, err error) {
		rd, wr, err = os.Pipe()
		if err == nil {
			files = append(files, rd, wr)
		}
		return rd, wr, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return fail(StartError(pl.args, err))
	}
	errR, errW, err := pipe()
	if err != nil {
		return fail(StartError(pl.args, err))
	}
	env := pl.env
	if env == nil {
		env = []string{} // nil would mean this process's environment
	}
	cmd := &exec.Cmd{
		Path:        pl.path,
		Args:        pl.args,
		Env:         env,
		Dir:         pl.dir,
		Stdout:      outW,
		Stderr:      errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: pl.cred},
	}
	var inR *os.File
	if id != "" || len(pl.stdin) > 0 {
		if inR, p.stdin, err = pipe(); err != nil {
			return fail(StartError(pl.args, err))
		}
		cmd.Stdin = inR
	}
	if r.cfg.OOMKills != nil {
		p.oomBefore, p.oomKnown = r.cfg.OOMKills()
	}
	p.startedAt = time.Now()
	if err := cmd.Start(); err != nil {
		return fail(StartError(pl.args, err))
	}
	p.cmd = cmd
	p.pid = cmd.Process.Pid
	if r.cfg.OOMScoreAdj != 0 {
		// Make the kernel's OOM killer pick the command (and, by
		// inheritance, what it forks) before the agent that serves it.
		// Raising the score needs no privilege; failure is harmless.
		_ = os.WriteFile("/proc/"+strconv.Itoa(p.pid)+"/oom_score_adj", []byte(strconv.Itoa(r.cfg.OOMScoreAdj)), 0)
	}
	// The child has its copies; keeping ours would hold the pipes open.
	_ = outW.Close()
	_ = errW.Close()
	if inR != nil {
		_ = inR.Close()
	}
	p.outR = [2]*os.File{outR, errR}

	if id != "" {
		r.publish(p)
	}
	go p.waitLeader()
	p.readersLeft.Store(2)
	go p.read(outR, EventStdout, sink)
	go p.read(errR, EventStderr, sink)
	if len(pl.stdin) > 0 {
		p.stdinSem <- struct{}{} // held until the initial stdin is written
		go func() {
			defer func() { <-p.stdinSem }()
			_, _ = p.stdin.Write(pl.stdin)
			if id == "" {
				p.closeStdin()
			}
		}()
	}
	r.log.Debug("process started", "pid", p.pid, "process_id", id, "program", pl.args[0])
	return p, nil
}

// read copies one output stream to sink until EOF, an error, or the read
// deadline set by finish.
func (p *proc) read(f *os.File, kind EventKind, sink sinkFunc) {
	defer func() {
		if p.readersLeft.Add(-1) == 0 {
			close(p.readersDone)
		}
	}()
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	ms := p.r.cfg.Masker.Stream()
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if out := ms.Write(buf[:n]); len(out) > 0 {
				sink(kind, out)
			}
		}
		if err != nil {
			if out := ms.Close(); len(out) > 0 {
				sink(kind, out)
			}
			return
		}
	}
}

// waitLeader waits for the group leader to exit.
func (p *proc) waitLeader() {
	err := waitNoReap(p.pid)
	if err == nil {
		p.peeked = true
	} else {
		if !errors.Is(err, errUnsupported) {
			// Someone else reaped our child (a PID 1 reaping every
			// child?); Wait collects what it can.
			p.r.log.Warn("waiting for process failed", "pid", p.pid, "process_id", p.id, "error", err)
		}
		p.waitErr = p.cmd.Wait()
	}
	p.leaderAt = time.Now()
	close(p.leaderCh)
}

// supervise stops the command when ctx is done, its timeout passes or it
// is asked to (stop), and finishes it once its leader has exited.
func (p *proc) supervise(ctx context.Context) {
	ctxDone := ctx.Done()
	var timeout <-chan time.Time
	if p.pl.timeout > 0 {
		t := time.NewTimer(p.pl.timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-p.leaderCh:
	case <-timeout:
		p.timedOut.Store(true)
		p.terminate()
	case <-ctxDone:
		p.cancelled.Store(true)
		p.terminate()
	case <-p.stopCh:
		p.terminate()
	}
	p.finish()
}

// stop asks the supervisor to terminate the command.
func (p *proc) stop() {
	p.stopOnce.Do(func() { close(p.stopCh) })
}

// terminate sends SIGTERM to the group and, if the leader does not exit
// within the kill grace, SIGKILL; it returns once the leader has exited.
func (p *proc) terminate() {
	p.signalGroup(syscall.SIGTERM)
	p.signalGroup(syscall.SIGCONT) // let stopped members see the SIGTERM
	t := time.NewTimer(p.pl.grace)
	defer t.Stop()
	select {
	case <-p.leaderCh:
		return
	case <-t.C:
	}
	p.agentKilled.Store(true)
	p.signalGroup(syscall.SIGKILL)
	<-p.leaderCh
}

// signalGroup sends sig to the process group unless the leader was reaped
// (then the group id may belong to someone else).
func (p *proc) signalGroup(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		_ = syscall.Kill(-p.pid, sig)
	}
}

// finish runs after the leader exited: it kills what is left of the group
// (unless the plan keeps it), reaps the leader, drains the output and
// records the exit status.
func (p *proc) finish() {
	var waitErr error
	if p.peeked {
		p.mu.Lock()
		// The leader is a zombie, so the group id is still ours.
		if !p.pl.keep {
			_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		}
		waitErr = p.cmd.Wait()
		p.reaped = true
		p.mu.Unlock()
	} else {
		waitErr = p.waitErr
		p.mu.Lock()
		p.reaped = true
		p.mu.Unlock()
		// Best effort: the leader is gone, the group id is very probably
		// still ours as long as members are left.
		if !p.pl.keep {
			_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		}
	}

	st := ExitStatus{Duration: p.leaderAt.Sub(p.startedAt), TimedOut: p.timedOut.Load()}
	if ps := p.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			st.ExitCode = -1
			st.Signal = SignalName(ws.Signal())
		} else {
			st.ExitCode = ps.ExitCode()
		}
	} else {
		st.ExitCode = -1
		p.r.log.Warn("exit status of process unknown", "pid", p.pid, "process_id", p.id, "error", waitErr)
	}
	st.OOMKilled = p.oomVerdict(st)
	// Drain the output. Processes that escaped the group may still hold the
	// pipes: stop reading after drainDelay.
	t := time.NewTimer(drainDelay)
	select {
	case <-p.readersDone:
	case <-t.C:
		p.r.log.Debug("output still open after the process group exited; no longer reading", "pid", p.pid, "process_id", p.id)
		for _, f := range p.outR {
			_ = f.SetReadDeadline(time.Now())
		}
		<-p.readersDone
	}
	t.Stop()
	for _, f := range p.outR {
		_ = f.Close()
	}
	p.closeStdin()

	p.r.log.Debug("process exited", "pid", p.pid, "process_id", p.id, "exit_code", st.ExitCode,
		"signal", st.Signal, "timed_out", st.TimedOut, "oom_killed", st.OOMKilled, "duration", st.Duration)
	// Publish the exit only now, so that whoever sees it can read all
	// the output.
	if p.logs != nil {
		p.logs.finish(st)
	}
	p.mu.Lock()
	p.exited = true
	p.status = st
	p.exitedWall = p.leaderAt
	p.mu.Unlock()
	p.r.release(p, true)
	close(p.done)
}

// closeStdin closes our end of the command's stdin, once.
func (p *proc) closeStdin() {
	p.mu.Lock()
	p.stdinShut = true
	p.mu.Unlock()
	p.stdinOnce.Do(func() {
		if p.stdin != nil {
			_ = p.stdin.Close()
		}
	})
}
