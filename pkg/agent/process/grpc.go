package process

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// Server serves berth.agent.v1.ProcessService over a Runner. It only
// converts messages and maps errors with errgrpc.ToGRPC.
type Server struct {
	agentv1.UnimplementedProcessServiceServer
	r *Runner
}

// NewServer returns a Server over r.
func NewServer(r *Runner) *Server {
	return &Server{r: r}
}

// Register registers s on g as the ProcessService.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	agentv1.RegisterProcessServiceServer(g, s)
}

// Exec runs a command and waits for it.
func (s *Server) Exec(ctx context.Context, req *agentv1.ExecRequest) (*agentv1.ExecResponse, error) {
	spec, err := specFromProto(req)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	res, err := s.r.Exec(ctx, spec)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.ExecResponse{
		ExitCode:           int32(res.ExitCode),
		Signal:             res.Signal,
		Stdout:             strings.ToValidUTF8(string(res.Stdout), "\uFFFD"),
		Stderr:             strings.ToValidUTF8(string(res.Stderr), "\uFFFD"),
		StdoutTruncated:    res.StdoutTruncated,
		StdoutDroppedBytes: res.StdoutDropped,
		StderrTruncated:    res.StderrTruncated,
		StderrDroppedBytes: res.StderrDropped,
		Duration:           durationpb.New(res.Duration),
		TimedOut:           res.TimedOut,
		Pid:                int32(res.Pid),
		OomKilled:          res.OOMKilled,
	}, nil
}

// ExecStream runs a command and streams its events.
func (s *Server) ExecStream(req *agentv1.ExecRequest, stream grpc.ServerStreamingServer[agentv1.ExecEvent]) error {
	spec, err := specFromProto(req)
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	_, err = s.r.Stream(stream.Context(), spec, func(ev Event) error {
		return stream.Send(eventToProto(ev))
	})
	return errgrpc.ToGRPC(err)
}

// StartProcess starts a background process.
func (s *Server) StartProcess(ctx context.Context, req *agentv1.ExecRequest) (*agentv1.ProcessInfo, error) {
	spec, err := specFromProto(req)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	info, err := s.r.Start(ctx, spec)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return infoToProto(info), nil
}

// GetProcess returns one background process.
func (s *Server) GetProcess(_ context.Context, req *agentv1.GetProcessRequest) (*agentv1.ProcessInfo, error) {
	info, err := s.r.Get(req.GetId())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return infoToProto(info), nil
}

// ListProcesses lists the background processes, oldest first.
func (s *Server) ListProcesses(context.Context, *agentv1.ListProcessesRequest) (*agentv1.ListProcessesResponse, error) {
	infos := s.r.List()
	resp := &agentv1.ListProcessesResponse{Processes: make([]*agentv1.ProcessInfo, len(infos))}
	for i, in := range infos {
		resp.Processes[i] = infoToProto(in)
	}
	return resp, nil
}

// ProcessLogs replays, and by default follows, a background process's output.
func (s *Server) ProcessLogs(req *agentv1.ProcessLogsRequest, stream grpc.ServerStreamingServer[agentv1.ExecEvent]) error {
	follow := req.Follow == nil || *req.Follow
	err := s.r.Logs(stream.Context(), req.GetId(), follow, func(ev Event) error {
		return stream.Send(eventToProto(ev))
	})
	return errgrpc.ToGRPC(err)
}

// WriteStdin writes text, then data, to a background process's stdin.
func (s *Server) WriteStdin(ctx context.Context, req *agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error) {
	data := req.GetData()
	if req.GetText() != "" {
		data = append([]byte(req.GetText()), data...)
	}
	n, err := s.r.WriteStdin(ctx, req.GetId(), data, req.GetClose())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.WriteStdinResponse{Written: int64(n)}, nil
}

// SignalProcess signals a background process's process group.
func (s *Server) SignalProcess(_ context.Context, req *agentv1.SignalProcessRequest) (*agentv1.SignalProcessResponse, error) {
	if err := s.r.Signal(req.GetId(), req.GetSignal()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.SignalProcessResponse{}, nil
}

// specFromProto converts an ExecRequest; stdin is the text followed by the
// bytes.
func specFromProto(req *agentv1.ExecRequest) (Spec, error) {
	timeout, err := durationFromProto("timeout", req.GetTimeout())
	if err != nil {
		return Spec{}, err
	}
	grace, err := durationFromProto("kill_grace", req.GetKillGrace())
	if err != nil {
		return Spec{}, err
	}
	stdin := req.GetStdinData()
	if req.GetStdin() != "" {
		stdin = append([]byte(req.GetStdin()), stdin...)
	}
	return Spec{
		Argv:        req.GetArgv(),
		Command:     req.GetCommand(),
		Cwd:         req.GetCwd(),
		Env:         req.GetEnv(),
		User:        req.GetUser(),
		Stdin:       stdin,
		Timeout:     timeout,
		KillGrace:   grace,
		OutputLimit: req.GetOutputLimit(),
	}, nil
}

func durationFromProto(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, errdefs.InvalidArgument(field, "%v", err)
	}
	return d.AsDuration(), nil
}

func exitedToProto(st *ExitStatus) *agentv1.Exited {
	return &agentv1.Exited{
		ExitCode:  int32(st.ExitCode),
		Signal:    st.Signal,
		TimedOut:  st.TimedOut,
		Duration:  durationpb.New(st.Duration),
		OomKilled: st.OOMKilled,
	}
}

func eventToProto(ev Event) *agentv1.ExecEvent {
	out := &agentv1.ExecEvent{}
	switch ev.Kind {
	case EventStarted:
		out.Event = &agentv1.ExecEvent_Started{Started: &agentv1.Started{Pid: int32(ev.Pid), ProcessId: ev.ProcessID}}
	case EventStdout:
		out.Event = &agentv1.ExecEvent_Stdout{Stdout: ev.Data}
	case EventStderr:
		out.Event = &agentv1.ExecEvent_Stderr{Stderr: ev.Data}
	case EventExited:
		out.Event = &agentv1.ExecEvent_Exited{Exited: exitedToProto(ev.Exit)}
	case EventGap:
		out.Event = &agentv1.ExecEvent_Gap{Gap: &agentv1.Gap{DroppedBytes: ev.Dropped}}
	}
	return out
}

func infoToProto(in Info) *agentv1.ProcessInfo {
	out := &agentv1.ProcessInfo{
		Id:          in.ID,
		Pid:         int32(in.Pid),
		Argv:        in.Argv,
		Command:     in.Command,
		Cwd:         in.Cwd,
		State:       agentv1.ProcessState_PROCESS_STATE_RUNNING,
		StartedAt:   timestamppb.New(in.StartedAt),
		StdinClosed: in.StdinClosed,
	}
	if in.Exit != nil {
		out.State = agentv1.ProcessState_PROCESS_STATE_EXITED
		out.ExitCode = int32(in.Exit.ExitCode)
		out.Signal = in.Exit.Signal
		out.TimedOut = in.Exit.TimedOut
		out.OomKilled = in.Exit.OOMKilled
		out.ExitedAt = timestamppb.New(in.ExitedAt)
	}
	return out
}
