package process

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// ExitStatus says how a command ended.
type ExitStatus struct {
	// ExitCode is the exit status, or -1 when a signal ended the command.
	ExitCode int
	// Signal names the signal that ended the command, like "SIGKILL", if any.
	Signal string
	// TimedOut is true when the command's timeout stopped it.
	TimedOut bool
	// OOMKilled is true when the kernel's OOM killer ended the command (see
	// Config.OOMKills for how it is detected).
	OOMKilled bool
	// Duration is the wall time from start until the command's main
	// process exited.
	Duration time.Duration
}

// Result is the outcome of Exec (and, without output, of Stream).
type Result struct {
	ExitStatus
	// Pid was the process id of the command (and its process group id).
	Pid int
	// Stdout and Stderr are the command's output, each bounded by
	// Spec.OutputLimit: when a stream was longer, its head and tail are kept
	// with a TruncationMarker between them. Stream leaves them nil.
	Stdout, Stderr []byte
	// StdoutTruncated and StderrTruncated report that bytes were cut.
	StdoutTruncated, StderrTruncated bool
	// StdoutDropped and StderrDropped count the bytes cut.
	StdoutDropped, StderrDropped int64
}

// EventKind is the kind of an Event.
type EventKind int

// Event kinds. A sequence is Started, output (Stdout, Stderr, and Gap in a
// replay), then Exited.
const (
	// EventStarted is the first event; it carries Pid (and ProcessID for
	// a background process).
	EventStarted EventKind = iota + 1
	// EventStdout carries a chunk of standard output in Data.
	EventStdout
	// EventStderr carries a chunk of standard error in Data.
	EventStderr
	// EventExited is the last event; it carries Exit.
	EventExited
	// EventGap says that a replay skipped Dropped bytes of output that the
	// replay buffer no longer holds.
	EventGap
)

// String returns the kind's name, like "stdout".
func (k EventKind) String() string {
	switch k {
	case EventStarted:
		return "started"
	case EventStdout:
		return "stdout"
	case EventStderr:
		return "stderr"
	case EventExited:
		return "exited"
	case EventGap:
		return "gap"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one event of a streamed or background command.
type Event struct {
	// Kind says which of the other fields is set.
	Kind EventKind
	// Pid is the command's process id (Started).
	Pid int
	// ProcessID is the background process id (Started, background only).
	ProcessID string
	// Data is an output chunk (Stdout, Stderr). It must not be modified; it
	// may be kept.
	Data []byte
	// Exit is how the command ended (Exited).
	Exit *ExitStatus
	// Dropped is the number of output bytes skipped (Gap).
	Dropped int64
}

// EmitFunc receives the events of a command, one call at a time. An error
// ends the call that emits: Stream then stops the command, Logs leaves the
// background process running.
type EmitFunc func(Event) error

// Exec runs a command and waits for it. Stdout and stderr are kept
// separately, each bounded by Spec.OutputLimit (head and tail, with a
// TruncationMarker where the middle was cut); memory use is bounded by the
// limit whatever the command prints.
//
// A command that ran is not an error, whatever its exit: see
// Result.ExitCode, Signal and TimedOut. The error is set when the command
// could not start (see the package doc for the categories), or when ctx
// ended before the command did: the command's process group is then
// stopped and Result holds the partial output, with an error wrapping
// ctx.Err().
func (r *Runner) Exec(ctx context.Context, s Spec) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	pl, err := r.prepare(s, r.cfg.DefaultTimeout)
	if err != nil {
		return Result{}, err
	}
	stdout, stderr := newHeadTail(pl.limit), newHeadTail(pl.limit)
	p, err := r.spawn(s, pl, "", nil, func(kind EventKind, data []byte) {
		if kind == EventStdout {
			_, _ = stdout.Write(data)
		} else {
			_, _ = stderr.Write(data)
		}
	})
	if err != nil {
		return Result{}, err
	}
	// Exec waits anyway: supervising here saves a goroutine and a wake-up
	// per command.
	p.supervise(ctx)
	res := Result{ExitStatus: p.status, Pid: p.pid}
	res.Stdout, res.StdoutDropped = stdout.result()
	res.Stderr, res.StderrDropped = stderr.result()
	res.StdoutTruncated = res.StdoutDropped > 0
	res.StderrTruncated = res.StderrDropped > 0
	if p.cancelled.Load() {
		return res, fmt.Errorf("command stopped: %w", ctx.Err())
	}
	return res, nil
}

// Stream runs a command and passes its events to emit as they happen:
// Started, then output chunks as the command produces them (never
// truncated; at most 32 KiB each), then Exited. emit is called from one
// goroutine at a time. If emit fails (the consumer went away) the command's
// process group is stopped, and Stream returns emit's error.
//
// The Result carries the exit status but no output. Errors are as for
// Exec; when the command could not start, emit is not called.
func (r *Runner) Stream(ctx context.Context, s Spec, emit EmitFunc) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	pl, err := r.prepare(s, r.cfg.DefaultTimeout)
	if err != nil {
		return Result{}, err
	}
	ch := make(chan Event, 16)
	p, err := r.spawn(s, pl, "", nil, func(kind EventKind, data []byte) {
		ch <- Event{Kind: kind, Data: bytes.Clone(data)}
	})
	if err != nil {
		return Result{}, err
	}
	go p.supervise(ctx)
	go func() {
		<-p.readersDone
		close(ch)
	}()

	emitErr := emit(Event{Kind: EventStarted, Pid: p.pid})
	if emitErr != nil {
		p.stop()
	}
	for ev := range ch {
		if emitErr != nil {
			continue // drain, so that the readers finish
		}
		if emitErr = emit(ev); emitErr != nil {
			p.stop()
		}
	}
	<-p.done
	res := Result{ExitStatus: p.status, Pid: p.pid}
	if emitErr == nil {
		st := p.status
		emitErr = emit(Event{Kind: EventExited, Exit: &st})
	}
	switch {
	case p.cancelled.Load():
		return res, fmt.Errorf("command stopped: %w", ctx.Err())
	case emitErr != nil:
		return res, emitErr
	}
	return res, nil
}
