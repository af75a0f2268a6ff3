package process

import (
	"cmp"
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// State is the state of a background process.
type State int

// States of a background process.
const (
	// StateRunning means the process has not exited yet.
	StateRunning State = iota + 1
	// StateExited means the process has exited; Info.Exit says how.
	StateExited
)

// String returns "running" or "exited".
func (s State) String() string {
	switch s {
	case StateRunning:
		return "running"
	case StateExited:
		return "exited"
	}
	return "unknown"
}

// Info describes a background process.
type Info struct {
	// ID identifies the process to the Runner, like "p-1f2e3d4c5b6a7988".
	ID string
	// Pid is the process id of the command (and its process group id).
	Pid int
	// Argv and Command are as given in the Spec.
	Argv    []string
	Command string
	// Cwd is the working directory the command started in.
	Cwd string
	// State is running or exited.
	State State
	// Exit says how the process ended; nil while it runs.
	Exit *ExitStatus
	// StartedAt and ExitedAt are wall-clock times; ExitedAt is zero while
	// the process runs.
	StartedAt, ExitedAt time.Time
	// StdinClosed is true once the process's stdin was closed.
	StdinClosed bool
}

// Start starts a command in the background and returns at once; ctx only
// bounds the start. The command's stdin is a pipe that receives Spec.Stdin
// and then whatever WriteStdin writes, until WriteStdin closes it. Its
// output goes to a replay buffer (Config.ReplayBuffer bytes) that Logs
// reads. Spec.Timeout, if set, stops it; Config.DefaultTimeout does not
// apply. Once it exited it stays visible for Config.ExitedRetention.
func (r *Runner) Start(ctx context.Context, s Spec) (Info, error) {
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	pl, err := r.prepare(s, 0)
	if err != nil {
		return Info{}, err
	}
	if pl.dir == "" {
		if wd, err := os.Getwd(); err == nil {
			pl.dir = wd
		}
	}
	p, err := r.spawn(s, pl, newID(), newLogBuf(int64(r.cfg.ReplayBuffer)), nil)
	if err != nil {
		return Info{}, err
	}
	go p.supervise(context.Background())
	return p.info(), nil
}

// Get returns the background process id, running or recently exited.
func (r *Runner) Get(id string) (Info, error) {
	p, err := r.lookup(id)
	if err != nil {
		return Info{}, err
	}
	return p.info(), nil
}

// List returns the background processes, running and recently exited,
// oldest first.
func (r *Runner) List() []Info {
	r.mu.Lock()
	ps := make([]*proc, 0, len(r.bg))
	for _, p := range r.bg {
		ps = append(ps, p)
	}
	r.mu.Unlock()
	slices.SortFunc(ps, func(a, b *proc) int { return cmp.Compare(a.seq, b.seq) })
	infos := make([]Info, len(ps))
	for i, p := range ps {
		infos[i] = p.info()
	}
	return infos
}

func (p *proc) info() Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := Info{
		ID:          p.id,
		Pid:         p.pid,
		Argv:        p.argv,
		Command:     p.command,
		Cwd:         p.cwd,
		State:       StateRunning,
		StartedAt:   p.startedAt,
		StdinClosed: p.stdinShut,
	}
	if p.exited {
		st := p.status
		in.State = StateExited
		in.Exit = &st
		in.ExitedAt = p.exitedWall
	}
	return in
}

// Logs passes a background process's events to emit: Started, then the
// output the replay buffer still holds (preceded by a Gap event if older
// output was dropped), then, if follow is set, new output as it comes, and
// Exited once the process has exited and all its output was passed. Without
// follow, Logs returns after the replay (with Exited if the process has
// already exited). Logs returns emit's error, or ctx's when ctx ends first.
// Any number of Logs calls may read one process at once; a slow one does not
// hold up the process or the others, it gets a Gap instead.
func (r *Runner) Logs(ctx context.Context, id string, follow bool, emit EmitFunc) error {
	p, err := r.lookup(id)
	if err != nil {
		return err
	}
	if err := emit(Event{Kind: EventStarted, Pid: p.pid, ProcessID: p.id}); err != nil {
		return err
	}
	var pos int64
	for {
		gap, evs, next, exit, wait := p.logs.read(pos)
		pos = next
		if gap > 0 {
			if err := emit(Event{Kind: EventGap, Dropped: gap}); err != nil {
				return err
			}
		}
		for _, ev := range evs {
			if err := emit(ev); err != nil {
				return err
			}
		}
		if exit != nil {
			return emit(Event{Kind: EventExited, Exit: exit})
		}
		if !follow {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WriteStdin writes data to a background process's stdin and, if closeStdin is
// set, then closes it. It blocks while the pipe is full, until ctx ends; it
// returns the number of bytes written. Writes are not interleaved. Writing
// to a closed stdin or an exited process is errdefs.ErrFailedPrecondition;
// data is limited to validate.MaxStdin bytes per call.
func (r *Runner) WriteStdin(ctx context.Context, id string, data []byte, closeStdin bool) (int, error) {
	if len(data) > validate.MaxStdin {
		return 0, errdefs.InvalidArgument("data", "longer than %d bytes", validate.MaxStdin)
	}
	p, err := r.lookup(id)
	if err != nil {
		return 0, err
	}
	select {
	case p.stdinSem <- struct{}{}:
		defer func() { <-p.stdinSem }()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	p.mu.Lock()
	exited, shut := p.reaped, p.stdinShut
	p.mu.Unlock()
	switch {
	case exited:
		return 0, errdefs.FailedPrecondition("process %s has exited", id)
	case shut:
		return 0, errdefs.FailedPrecondition("stdin of process %s is closed", id)
	}
	n := 0
	if len(data) > 0 {
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(fired)
			_ = p.stdin.SetWriteDeadline(time.Unix(1, 0))
		})
		n, err = p.stdin.Write(data)
		if !stop() {
			<-fired
			_ = p.stdin.SetWriteDeadline(time.Time{})
		}
		if err != nil {
			p.mu.Lock()
			exited = p.reaped
			p.mu.Unlock()
			switch {
			case ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded):
				return n, ctx.Err()
			case exited || errors.Is(err, fs.ErrClosed):
				return n, errdefs.FailedPrecondition("process %s has exited", id)
			case errors.Is(err, syscall.EPIPE):
				return n, errdefs.FailedPrecondition("process %s closed its stdin", id)
			default:
				return n, err
			}
		}
	}
	if closeStdin {
		p.closeStdin()
	}
	return n, nil
}

// Signal sends a signal to a background process's process group. sig is a
// name or number as ParseSignal accepts; empty means SIGTERM. Signalling a
// process that has exited is errdefs.ErrFailedPrecondition.
func (r *Runner) Signal(id string, sig string) error {
	s, err := ParseSignal(sig)
	if err != nil {
		return err
	}
	p, err := r.lookup(id)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.leaderCh:
		return errdefs.FailedPrecondition("process %s has exited", id)
	default:
	}
	if p.reaped {
		return errdefs.FailedPrecondition("process %s has exited", id)
	}
	if s == syscall.SIGKILL {
		p.agentKilled.Store(true) // a requested kill is not an OOM kill
	}
	if err := syscall.Kill(-p.pid, s); err != nil {
		return errdefs.FailedPrecondition("signal process %s: %v", id, err)
	}
	return nil
}
