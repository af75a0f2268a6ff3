package terminal

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// startGRPC serves m's TerminalService on a real listener.
func startGRPC(t *testing.T, m *Manager) agentv1.TerminalServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	NewServer(m).Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return agentv1.NewTerminalServiceClient(conn)
}

// grpcTerm is a client of one Connect stream.
type grpcTerm struct {
	t      *testing.T
	stream grpc.BidiStreamingClient[agentv1.TerminalClientMessage, agentv1.TerminalServerMessage]
	cancel context.CancelFunc
	info   *agentv1.TerminalInfo

	mu   sync.Mutex
	out  strings.Builder
	exit *agentv1.TerminalExit
	err  error // the stream's end (io.EOF after exit)
	wake chan struct{}
	done chan struct{}
}

// connect sends first and reads the session message.
func connect(t *testing.T, c agentv1.TerminalServiceClient, first *agentv1.TerminalClientMessage) (*grpcTerm, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	stream, err := c.Connect(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := stream.Send(first); err != nil {
		cancel()
		return nil, err
	}
	msg, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, err
	}
	g := &grpcTerm{t: t, stream: stream, cancel: cancel, info: msg.GetSession(),
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	if g.info == nil {
		t.Fatalf("first message %v, want session", msg)
	}
	t.Cleanup(func() { cancel(); <-g.done })
	go func() {
		defer close(g.done)
		for {
			msg, err := stream.Recv()
			g.mu.Lock()
			switch {
			case err != nil:
				g.err = err
			case msg.GetExit() != nil:
				g.exit = msg.GetExit()
			default:
				g.out.Write(msg.GetOutput())
			}
			g.mu.Unlock()
			select {
			case g.wake <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return g, nil
}

func (g *grpcTerm) send(msg *agentv1.TerminalClientMessage) {
	g.t.Helper()
	if err := g.stream.Send(msg); err != nil {
		g.t.Fatalf("send: %v", err)
	}
}

func (g *grpcTerm) input(s string) {
	g.t.Helper()
	g.send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Input{Input: []byte(s)}})
}

func (g *grpcTerm) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.out.String()
}

func (g *grpcTerm) waitFor(want string) {
	g.t.Helper()
	deadline := time.After(20 * time.Second)
	for !strings.Contains(g.String(), want) {
		select {
		case <-g.wake:
		case <-g.done:
			if !strings.Contains(g.String(), want) {
				g.t.Fatalf("stream ended (%v) without %q: %q", g.err, want, tail(g.String()))
			}
		case <-deadline:
			g.t.Fatalf("timed out waiting for %q: %q", want, tail(g.String()))
		}
	}
}

// end waits for the stream to end and returns the exit and the error.
func (g *grpcTerm) end() (*agentv1.TerminalExit, error) {
	g.t.Helper()
	select {
	case <-g.done:
	case <-time.After(20 * time.Second):
		g.t.Fatalf("stream did not end: %q", tail(g.String()))
	}
	return g.exit, g.err
}

func openMsg(o *agentv1.TerminalOpen) *agentv1.TerminalClientMessage {
	return &agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Open{Open: o}}
}

func attachMsg(id string, noReplay bool) *agentv1.TerminalClientMessage {
	return &agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Attach{Attach: &agentv1.TerminalAttach{SessionId: id, NoReplay: noReplay}}}
}

func TestGRPCConnect(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	c := startGRPC(t, m)
	g, err := connect(t, c, openMsg(&agentv1.TerminalOpen{Argv: []string{"/bin/sh"}, Rows: 25, Cols: 90, Env: map[string]string{"X": "ex"}}))
	if err != nil {
		t.Fatal(err)
	}
	if g.info.GetId() == "" || !g.info.GetRunning() || g.info.GetPid() == 0 || g.info.GetRows() != 25 || g.info.GetTerm() != DefaultTerm {
		t.Fatalf("session info %v", g.info)
	}
	g.input("echo hi-$((2+3))-$X $(stty size)\n")
	g.waitFor("hi-5-ex 25 90")
	g.send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Resize{Resize: &agentv1.TerminalResize{Rows: 33, Cols: 111}}})
	g.input("echo size-$((3+3)) $(stty size)\n")
	g.waitFor("size-6 33 111")
	g.input("sleep 30\n")
	time.Sleep(300 * time.Millisecond)
	g.send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Signal{Signal: "INT"}})
	g.input("echo int-$?\n")
	g.waitFor("int-130")

	// A second client attaches and gets the scrollback first.
	g2, err := connect(t, c, attachMsg(g.info.GetId(), false))
	if err != nil {
		t.Fatal(err)
	}
	g2.waitFor("hi-5-ex 25 90")
	if g2.info.GetClients() != 2 {
		t.Errorf("clients %d", g2.info.GetClients())
	}
	// The first detaches by cancelling; the session goes on.
	g.cancel()
	if _, err := g.end(); status.Code(err) != codes.Canceled {
		t.Errorf("detached stream: %v", err)
	}
	l, err := c.ListTerminals(context.Background(), &agentv1.ListTerminalsRequest{})
	if err != nil || len(l.GetSessions()) != 1 || !l.GetSessions()[0].GetRunning() {
		t.Fatalf("list: %v, %v", l, err)
	}
	g2.input("exit 3\n")
	exit, err := g2.end()
	if !errors.Is(err, io.EOF) || exit == nil || exit.GetExitCode() != 3 {
		t.Fatalf("end: exit %v, err %v", exit, err)
	}
	l, err = c.ListTerminals(context.Background(), &agentv1.ListTerminalsRequest{})
	if err != nil || len(l.GetSessions()) != 1 || l.GetSessions()[0].GetRunning() || l.GetSessions()[0].GetExit().GetExitCode() != 3 {
		t.Fatalf("list after exit: %v, %v", l, err)
	}
}

// TestGRPCCloseSendKeepsOutput: a client that closes its side (no more
// input) still gets the output and the exit.
func TestGRPCCloseSendKeepsOutput(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	c := startGRPC(t, m)
	g, err := connect(t, c, openMsg(&agentv1.TerminalOpen{Command: "sleep 0.3; echo late-$((9*9)); exit 4"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	exit, err := g.end()
	if !errors.Is(err, io.EOF) || exit.GetExitCode() != 4 || !strings.Contains(g.String(), "late-81") {
		t.Fatalf("exit %v, err %v, out %q", exit, err, g.String())
	}
}

func TestGRPCErrors(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{MaxSessions: 1})
	c := startGRPC(t, m)
	for _, tc := range []struct {
		name  string
		first *agentv1.TerminalClientMessage
		code  codes.Code
		msg   string
	}{
		{"input first", &agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Input{Input: []byte("x")}}, codes.InvalidArgument, "open or attach"},
		{"unknown session", attachMsg("t-0000000000000000", false), codes.NotFound, "t-0000000000000000"},
		{"empty session", attachMsg("", false), codes.InvalidArgument, "session_id"},
		{"missing program", openMsg(&agentv1.TerminalOpen{Argv: []string{"no-such-program-xyz"}}), codes.FailedPrecondition, "argv[0]"},
		{"bad size", openMsg(&agentv1.TerminalOpen{Argv: []string{"sh"}, Rows: 1 << 31}), codes.InvalidArgument, "rows"},
	} {
		_, err := connect(t, c, tc.first)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
	g, err := connect(t, c, openMsg(&agentv1.TerminalOpen{Argv: []string{"/bin/sh"}}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connect(t, c, openMsg(&agentv1.TerminalOpen{Argv: []string{"/bin/sh"}})); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("over the limit: %v", err)
	}
	// A second open on a stream ends it with INVALID_ARGUMENT.
	g.send(openMsg(&agentv1.TerminalOpen{}))
	if _, err := g.end(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("second open: %v", err)
	}
	// KillTerminal ends the session.
	if _, err := c.KillTerminal(context.Background(), &agentv1.KillTerminalRequest{Id: g.info.GetId()}); err != nil {
		t.Fatal(err)
	}
	s, _ := m.Get(g.info.GetId())
	if e, ok := s.Exit(); !ok || e.Signal != "SIGHUP" {
		t.Errorf("after KillTerminal: %+v %v", e, ok)
	}
	if _, err := c.KillTerminal(context.Background(), &agentv1.KillTerminalRequest{Id: "t-nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("kill unknown: %v", err)
	}
	if _, err := c.KillTerminal(context.Background(), &agentv1.KillTerminalRequest{Id: g.info.GetId(), Signal: "BOGUS"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("kill with a bad signal: %v", err)
	}
}
