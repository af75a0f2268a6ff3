package orchestrator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc"
)

// Sources of log entries besides the runtime's streams (runtime.LogStdout,
// LogStderr, LogOutput).
const (
	// logSourceTransition is a lease state change; its text is the reason.
	logSourceTransition = "transition"
	// logSourceBerth is a note from the orchestrator (e.g. the output is gone).
	logSourceBerth = "berth"
)

// maxLogTail bounds LogsRequest.tail.
const maxLogTail = 100000

// logSource reads leases' logs: transitions from the lease manager, the
// container output from the runtime (runtime.LogStreamer; nil when the
// backend cannot).
type logSource struct {
	m  *lease.Manager
	rt runtime.LogStreamer
}

func newLogSource(m *lease.Manager, rt runtime.Runtime) *logSource {
	ls, _ := rt.(runtime.LogStreamer)
	return &logSource{m: m, rt: ls}
}

// Logs streams a lease's log to a caller that may see the lease (the
// operator, its owner, its own token): first its recorded transitions with
// their reasons, then the container's output; with follow, new transitions
// and output as they happen, until the lease ends or the caller goes away.
// Nothing here holds secret values: the orchestrator never has them after
// the sandbox is created, and the agent does not log them.
func (s *leaseServer) Logs(req *orchv1.LogsRequest, stream grpc.ServerStreamingServer[orchv1.LogEntry]) error {
	ctx := stream.Context()
	if req.Tail < 0 || req.Tail > maxLogTail {
		return errdefs.InvalidArgument("tail", "%d is not between 0 and %d", req.Tail, maxLogTail)
	}
	var since time.Time
	if req.Since != nil {
		if err := req.Since.CheckValid(); err != nil {
			return errdefs.InvalidArgument("since", "%v", err)
		}
		since = req.Since.AsTime()
	}
	// Subscribe before reading the lease, so no transition falls between.
	var events <-chan lease.Event
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if req.Follow {
		if _, err := s.lookup(ctx, req.Id); err != nil {
			return err
		}
		// A follow is a long-lived stream: it counts in the caller's
		// stream limit (a plain read ends by itself).
		done, err := s.streams.Acquire(streamCaller(principal(ctx)))
		if err != nil {
			return err
		}
		defer done()
		events = s.m.Subscribe(fctx, lease.EventFilter{LeaseID: req.Id})
	}
	l, err := s.lookup(ctx, req.Id)
	if err != nil {
		return err
	}
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	var mu sync.Mutex // Send is not safe for concurrent use
	send := func(e *orchv1.LogEntry) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(e)
	}
	seen := l.TransitionCount()
	for _, t := range l.Transitions {
		if t.At.Before(since) {
			continue
		}
		if err := send(transitionEntry(t)); err != nil {
			return err
		}
	}
	follow := req.Follow && !l.State.Ended()
	opts := runtime.LogOptions{Tail: int(req.Tail), Since: since, Follow: follow}
	output := func(cid string, opts runtime.LogOptions) error {
		return s.logs.output(fctx, cid, opts, send)
	}
	if !follow {
		return output(l.ContainerID, opts)
	}
	// Follow: the output in one goroutine, transitions here. The output
	// ends when the container stops (hibernate, a crash); it is read
	// again from then on when the lease is READY again.
	outDone := make(chan error, 1)
	// streamed is the container whose output was followed, ended when its
	// stream ended: a later READY reads a new container from its start,
	// the same container (an in-place restart, a resume from hibernation)
	// from then on.
	streamed, ended := l.ContainerID, time.Time{}
	running := l.ContainerID != "" // a PENDING lease has no container yet
	if running {
		go func() { outDone <- output(l.ContainerID, opts) }()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-outDone:
			running, ended = false, time.Now()
			if err != nil && ctx.Err() == nil {
				return err
			}
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errdefs.Newf(errdefs.ErrConflict, "log follow fell behind the lease's events; run logs again")
			}
			if ev.Transition == nil {
				continue
			}
			if seen > 0 { // the first events may repeat recorded transitions
				if n := ev.Lease.TransitionCount(); n > 0 && n <= seen {
					continue
				}
			}
			seen = ev.Lease.TransitionCount()
			if err := send(transitionEntry(*ev.Transition)); err != nil {
				return err
			}
			switch {
			case ev.Lease.State.Ended():
				// Let the output's last lines arrive, then stop.
				if running {
					select {
					case <-outDone:
					case <-time.After(2 * time.Second):
					case <-ctx.Done():
					}
				}
				return nil
			case ev.Lease.State == lease.StateReady && !running && ev.Lease.ContainerID != "":
				running = true
				o := runtime.LogOptions{Follow: true}
				cid := ev.Lease.ContainerID
				if cid == streamed && !ended.IsZero() {
					o.Since = ended
				}
				streamed = cid
				go func() { outDone <- output(cid, o) }()
			}
		}
	}
}

// output sends container cid's output; a container that is gone (or a
// backend without logs) becomes one note instead of an error.
func (ls *logSource) output(ctx context.Context, cid string, opts runtime.LogOptions, send func(*orchv1.LogEntry) error) error {
	note := func(text string) error {
		return send(&orchv1.LogEntry{Time: ts(time.Now()), Source: logSourceBerth, Text: text})
	}
	if cid == "" {
		return note("the lease has no container: its output was never captured")
	}
	if ls.rt == nil {
		return note("this runtime backend does not provide container output")
	}
	var sendErr error
	err := ls.rt.StreamLogs(ctx, cid, opts, func(l runtime.LogLine) error {
		e := &orchv1.LogEntry{Source: l.Stream, Text: l.Text}
		if !l.Time.IsZero() {
			e.Time = ts(l.Time)
		}
		sendErr = send(e)
		return sendErr
	})
	switch {
	case sendErr != nil:
		return sendErr
	case errors.Is(err, errdefs.ErrNotFound):
		return note("the container's output is gone: its sandbox was removed")
	case err != nil && ctx.Err() != nil:
		return nil
	case err != nil:
		// The transitions were sent; say why the output is missing
		// (e.g. a container being removed) rather than fail the stream.
		return note("the container's output cannot be read: " + err.Error())
	}
	return nil
}

// transitionEntry is a transition as a log entry.
func transitionEntry(t lease.Transition) *orchv1.LogEntry {
	return &orchv1.LogEntry{Time: ts(t.At), Source: logSourceTransition, Text: t.Reason, Transition: toTransition(t)}
}
