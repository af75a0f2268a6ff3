package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/agent/terminal"
	"github.com/berth-dev/berth/pkg/errdefs"
	pb "github.com/berth-dev/berth/proto/e2b/envd/process"
)

// procEntry is a process started through the service.
type procEntry struct {
	pid    uint32
	tag    *string
	config *pb.ProcessConfig
	seq    uint64
	// runID is the runner's id of a process without a PTY.
	runID string
	// sess is the terminal session of a process with a PTY.
	sess *terminal.Session
}

// procTable indexes the processes by pid; a pid reused by a later process
// names that one.
type procTable struct {
	mu    sync.Mutex
	seq   uint64
	byPID map[uint32]*procEntry
}

func newProcTable() *procTable { return &procTable{byPID: make(map[uint32]*procEntry)} }

func (t *procTable) add(e *procEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	e.seq = t.seq
	t.byPID[e.pid] = e
}

func (t *procTable) all() []*procEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	es := slices.Collect(maps.Values(t.byPID))
	slices.SortFunc(es, func(a, b *procEntry) int { return int(a.seq) - int(b.seq) })
	return es
}

func (t *procTable) remove(e *procEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byPID[e.pid] == e {
		delete(t.byPID, e.pid)
	}
}

// processService implements processconnect.ProcessHandler.
type processService struct {
	s *Service
}

// state says whether e still runs, and whether its backend forgot it.
func (s *Service) state(e *procEntry) (running, gone bool) {
	if e.sess != nil {
		select {
		case <-e.sess.Done():
			_, err := s.cfg.Terminals.Get(e.sess.ID())
			return false, err != nil
		default:
			return true, false
		}
	}
	info, err := s.cfg.Runner.Get(e.runID)
	if err != nil {
		return false, true
	}
	return info.State == process.StateRunning, false
}

// live returns the known processes, forgetting those their backend forgot.
func (s *Service) live() []*procEntry {
	var out []*procEntry
	for _, e := range s.procs.all() {
		if _, gone := s.state(e); gone {
			s.procs.remove(e)
			continue
		}
		out = append(out, e)
	}
	return out
}

// lookup finds the process sel names: by pid, or the latest with the tag
// (a running one first).
func (s *Service) lookup(sel *pb.ProcessSelector) (*procEntry, error) {
	if sel == nil || sel.Selector == nil {
		return nil, errdefs.InvalidArgument("process", "must name a pid or a tag")
	}
	var found *procEntry
	for _, e := range s.live() {
		switch v := sel.Selector.(type) {
		case *pb.ProcessSelector_Pid:
			if e.pid == v.Pid {
				found = e
			}
		case *pb.ProcessSelector_Tag:
			if e.tag != nil && *e.tag == v.Tag {
				if running, _ := s.state(e); running || found == nil {
					found = e
				}
			}
		}
	}
	if found == nil {
		switch v := sel.Selector.(type) {
		case *pb.ProcessSelector_Pid:
			return nil, errdefs.NotFound("process with pid %d not found", v.Pid)
		case *pb.ProcessSelector_Tag:
			return nil, errdefs.NotFound("process with tag %q not found", v.Tag)
		}
	}
	return found, nil
}

func (p *processService) List(ctx context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	res := &pb.ListResponse{}
	for _, e := range p.s.live() {
		if running, _ := p.s.state(e); running {
			res.Processes = append(res.Processes, &pb.ProcessInfo{Config: e.config, Pid: e.pid, Tag: e.tag})
		}
	}
	return connect.NewResponse(res), nil
}

func (p *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	s := p.s
	id := identityFrom(ctx)
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return toConnect(errdefs.InvalidArgument("process.cmd", "must not be empty"))
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	cwd := id.base
	if cfg.Cwd != nil {
		cwd = id.abs(cfg.GetCwd())
	}
	e := &procEntry{tag: req.Msg.Tag, config: cfg}
	if pty := req.Msg.Pty; pty != nil {
		sess, err := s.cfg.Terminals.Open(terminal.Spec{Argv: argv, Cwd: cwd, Env: cfg.GetEnvs(), User: id.spec,
			Rows: int(pty.GetSize().GetRows()), Cols: int(pty.GetSize().GetCols())})
		if err != nil {
			return toConnect(err)
		}
		e.sess, e.pid = sess, uint32(sess.Info().Pid)
	} else {
		info, err := s.cfg.Runner.Start(ctx, process.Spec{Argv: argv, Cwd: cwd, Env: cfg.GetEnvs(), User: id.spec})
		if err != nil {
			return toConnect(err)
		}
		e.runID, e.pid = info.ID, uint32(info.Pid)
		if req.Msg.Stdin != nil && !*req.Msg.Stdin {
			if _, err := s.cfg.Runner.WriteStdin(ctx, info.ID, nil, true); err != nil && !errdefs.IsFailedPrecondition(err) {
				_ = s.cfg.Runner.Signal(info.ID, "SIGKILL")
				return toConnect(err)
			}
		}
	}
	s.procs.add(e)
	s.log.Debug("envd process started", "pid", e.pid, "pty", e.sess != nil, "user", id.Name)
	send := serialize(func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) })
	return s.follow(ctx, req.Header(), e, send)
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	e, err := p.s.lookup(req.Msg.GetProcess())
	if err != nil {
		return toConnect(err)
	}
	send := serialize(func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) })
	return p.s.follow(ctx, req.Header(), e, send)
}

// follow streams e's events to send: start, output, end; with keepalives
// as the request's KeepaliveHeader asks. The process outlives the stream.
func (s *Service) follow(ctx context.Context, h http.Header, e *procEntry, send func(*pb.ProcessEvent) error) error {
	stop := keepalive(ctx, keepaliveInterval(h), func() error {
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}})
	})
	defer stop()
	if e.sess != nil {
		return toConnect(s.followPTY(ctx, e, send))
	}
	err := s.cfg.Runner.Logs(ctx, e.runID, true, func(ev process.Event) error {
		switch ev.Kind {
		case process.EventStarted:
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: e.pid}}})
		case process.EventStdout:
			return send(dataEvent(&pb.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}))
		case process.EventStderr:
			return send(dataEvent(&pb.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}))
		case process.EventExited:
			return send(endEvent(ev.Exit.ExitCode, ev.Exit.Signal, exitError(ev.Exit)))
		}
		return nil
	})
	return toConnect(err)
}

func (s *Service) followPTY(ctx context.Context, e *procEntry, send func(*pb.ProcessEvent) error) error {
	att := e.sess.Attach(true)
	defer att.Detach()
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: e.pid}}}); err != nil {
		return err
	}
	if b := att.Replay(); len(b) > 0 {
		if err := send(dataEvent(&pb.ProcessEvent_DataEvent_Pty{Pty: b})); err != nil {
			return err
		}
	}
	for {
		b, err := att.Next(ctx)
		if errors.Is(err, io.EOF) {
			ex, _ := e.sess.Exit()
			return send(endEvent(ex.Code, ex.Signal, ""))
		}
		if err != nil {
			return err
		}
		if err := send(dataEvent(&pb.ProcessEvent_DataEvent_Pty{Pty: b})); err != nil {
			return err
		}
	}
}

func dataEvent(out any) *pb.ProcessEvent {
	d := &pb.ProcessEvent_DataEvent{}
	switch o := out.(type) {
	case *pb.ProcessEvent_DataEvent_Stdout:
		d.Output = o
	case *pb.ProcessEvent_DataEvent_Stderr:
		d.Output = o
	case *pb.ProcessEvent_DataEvent_Pty:
		d.Output = o
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}
}

// endEvent describes an exit as envd does: exited is false when a signal
// ended the process, status reads like Go's os.ProcessState
// ("exit status 1", "signal: killed").
func endEvent(code int, signal, errMsg string) *pb.ProcessEvent {
	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: signal == "", Status: fmt.Sprintf("exit status %d", code)}
	if signal != "" {
		end.Status = "signal: " + signal
		if sig, err := process.ParseSignal(signal); err == nil {
			end.Status = "signal: " + sig.String()
		}
	}
	if errMsg != "" {
		end.Error = &errMsg
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
}

func exitError(st *process.ExitStatus) string {
	switch {
	case st.OOMKilled:
		return "killed by the kernel: out of memory"
	case st.TimedOut:
		return "timed out"
	}
	return ""
}

func (p *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	e, err := p.s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, toConnect(err)
	}
	size := req.Msg.GetPty().GetSize()
	if size == nil {
		return nil, toConnect(errdefs.InvalidArgument("pty.size", "must be set"))
	}
	if e.sess == nil {
		return nil, toConnect(errdefs.FailedPrecondition("process %d has no pty", e.pid))
	}
	if err := e.sess.Resize(int(size.GetRows()), int(size.GetCols())); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// write sends input to e: to its terminal, or to its standard input.
func (s *Service) write(ctx context.Context, e *procEntry, in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if e.sess == nil {
			return errdefs.FailedPrecondition("process %d has no pty: send stdin", e.pid)
		}
		_, err := e.sess.Write(v.Pty)
		return err
	case *pb.ProcessInput_Stdin:
		if e.sess != nil {
			_, err := e.sess.Write(v.Stdin)
			return err
		}
		_, err := s.cfg.Runner.WriteStdin(ctx, e.runID, v.Stdin, false)
		return err
	}
	return errdefs.InvalidArgument("input", "must hold stdin or pty")
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	e, err := p.s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, toConnect(err)
	}
	if err := p.s.write(ctx, e, req.Msg.GetInput()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var e *procEntry
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			var err error
			if e, err = p.s.lookup(ev.Start.GetProcess()); err != nil {
				return nil, toConnect(err)
			}
		case *pb.StreamInputRequest_Data:
			if e == nil {
				return nil, toConnect(errdefs.InvalidArgument("event", "the first event must be start, naming the process"))
			}
			if err := p.s.write(ctx, e, ev.Data.GetInput()); err != nil {
				return nil, toConnect(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig string
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case pb.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, toConnect(errdefs.InvalidArgument("signal", "must be SIGNAL_SIGKILL or SIGNAL_SIGTERM, got %v", req.Msg.GetSignal()))
	}
	e, err := p.s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, toConnect(err)
	}
	if e.sess != nil {
		err = p.s.cfg.Terminals.Kill(ctx, e.sess.ID(), sig)
	} else {
		err = p.s.cfg.Runner.Signal(e.runID, sig)
	}
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	e, err := p.s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, toConnect(err)
	}
	if e.sess != nil {
		return nil, toConnect(errdefs.FailedPrecondition("process %d has a pty: send Ctrl-D (0x04) instead", e.pid))
	}
	if _, err := p.s.cfg.Runner.WriteStdin(ctx, e.runID, nil, true); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}
