package terminal

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// Server serves berth.agent.v1.TerminalService over a Manager. It only
// converts messages and maps errors with errgrpc.ToGRPC.
type Server struct {
	agentv1.UnimplementedTerminalServiceServer
	m *Manager
}

// NewServer returns a Server over m.
func NewServer(m *Manager) *Server { return &Server{m: m} }

// Register registers s on g as the TerminalService.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	agentv1.RegisterTerminalServiceServer(g, s)
}

// Connect opens or attaches to a session and carries its bytes both ways.
// Cancelling the call detaches; closing the client's side only ends input.
func (s *Server) Connect(stream grpc.BidiStreamingServer[agentv1.TerminalClientMessage, agentv1.TerminalServerMessage]) error {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return errgrpc.ToGRPC(errdefs.InvalidArgument("msg", "the first message must be open or attach"))
	}
	if err != nil {
		return err
	}
	att, err := s.connect(first)
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	defer att.Detach()
	sess := att.Session()
	if err := stream.Send(&agentv1.TerminalServerMessage{Msg: &agentv1.TerminalServerMessage_Session{Session: infoToProto(sess.Info())}}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) { // EOF: no more input, output goes on
					cancel(err)
				}
				return
			}
			if err := apply(sess, msg); err != nil {
				cancel(errgrpc.ToGRPC(err))
				return
			}
		}
	}()
	err = follow(ctx, att,
		func(b []byte) error {
			return stream.Send(&agentv1.TerminalServerMessage{Msg: &agentv1.TerminalServerMessage_Output{Output: b}})
		},
		func(e Exit) error {
			return stream.Send(&agentv1.TerminalServerMessage{Msg: &agentv1.TerminalServerMessage_Exit{Exit: exitToProto(e)}})
		})
	return errgrpc.ToGRPC(err)
}

// connect handles the first message: open or attach.
func (s *Server) connect(msg *agentv1.TerminalClientMessage) (*Attachment, error) {
	switch m := msg.GetMsg().(type) {
	case *agentv1.TerminalClientMessage_Open:
		o := m.Open
		sess, err := s.m.Open(Spec{
			Argv: o.GetArgv(), Command: o.GetCommand(), Cwd: o.GetCwd(), Env: o.GetEnv(), User: o.GetUser(),
			Rows: clampSize(o.GetRows()), Cols: clampSize(o.GetCols()), Term: o.GetTerm(),
		})
		if err != nil {
			return nil, err
		}
		return sess.Attach(true), nil
	case *agentv1.TerminalClientMessage_Attach:
		return s.m.Attach(m.Attach.GetSessionId(), !m.Attach.GetNoReplay())
	}
	return nil, errdefs.InvalidArgument("msg", "the first message must be open or attach")
}

// apply carries out one later client message. Input, resizes and signals
// that arrive after the program ended are ignored: the exit follows.
func apply(sess *Session, msg *agentv1.TerminalClientMessage) error {
	var err error
	switch m := msg.GetMsg().(type) {
	case *agentv1.TerminalClientMessage_Input:
		_, err = sess.Write(m.Input)
	case *agentv1.TerminalClientMessage_Resize:
		err = sess.Resize(clampSize(m.Resize.GetRows()), clampSize(m.Resize.GetCols()))
	case *agentv1.TerminalClientMessage_Signal:
		err = signal(sess, m.Signal)
	case *agentv1.TerminalClientMessage_Open, *agentv1.TerminalClientMessage_Attach:
		err = errdefs.InvalidArgument("msg", "open and attach are only allowed as the first message")
	}
	if errors.Is(err, errEnded) {
		return nil
	}
	return err
}

// signal parses name and sends it to the session's foreground group.
func signal(sess *Session, name string) error {
	sig, err := process.ParseSignal(name)
	if err != nil {
		return err
	}
	return sess.Signal(sig)
}

// clampSize converts a size from the wire; values beyond MaxSize stay
// beyond it, so checkSize names them.
func clampSize(v uint32) int { return int(min(v, MaxSize+1)) }

// replayChunk bounds one message of replayed scrollback.
const replayChunk = readBufSize

// follow sends a's replay and then its output with out until the session
// ends, then the exit with exit. It returns context.Cause(ctx) when ctx
// ends first, and ErrSlowClient when the client fell behind.
func follow(ctx context.Context, a *Attachment, out func([]byte) error, exit func(Exit) error) error {
	for r := a.Replay(); len(r) > 0; {
		n := min(len(r), replayChunk)
		if err := out(r[:n]); err != nil {
			return err
		}
		r = r[n:]
	}
	for {
		b, err := a.Next(ctx)
		switch {
		case err == nil:
			if err := out(b); err != nil {
				return err
			}
		case errors.Is(err, io.EOF):
			e, _ := a.Session().Exit()
			return exit(e)
		case ctx.Err() != nil:
			return context.Cause(ctx)
		default:
			return err
		}
	}
}

// ListTerminals lists the sessions.
func (s *Server) ListTerminals(context.Context, *agentv1.ListTerminalsRequest) (*agentv1.ListTerminalsResponse, error) {
	infos := s.m.List()
	out := &agentv1.ListTerminalsResponse{Sessions: make([]*agentv1.TerminalInfo, 0, len(infos))}
	for _, in := range infos {
		out.Sessions = append(out.Sessions, infoToProto(in))
	}
	return out, nil
}

// KillTerminal ends or signals a session.
func (s *Server) KillTerminal(ctx context.Context, req *agentv1.KillTerminalRequest) (*agentv1.KillTerminalResponse, error) {
	if err := s.m.Kill(ctx, req.GetId(), req.GetSignal()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.KillTerminalResponse{}, nil
}

func exitToProto(e Exit) *agentv1.TerminalExit {
	return &agentv1.TerminalExit{ExitCode: int32(e.Code), Signal: e.Signal}
}

func infoToProto(in Info) *agentv1.TerminalInfo {
	p := &agentv1.TerminalInfo{
		Id: in.ID, Pid: int32(in.Pid), Argv: in.Argv, Command: in.Command, Cwd: in.Cwd, User: in.User,
		Rows: uint32(in.Rows), Cols: uint32(in.Cols), Term: in.Term, Running: in.Running,
		StartedAt: timestamppb.New(in.StartedAt), Clients: int32(in.Clients),
	}
	if in.Exit != nil {
		p.Exit = exitToProto(*in.Exit)
		p.ExitedAt = timestamppb.New(in.ExitedAt)
	}
	return p
}
