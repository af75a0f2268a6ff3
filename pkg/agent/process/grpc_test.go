package process

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// startGRPC serves a Runner on a real listener and returns a client.
func startGRPC(t *testing.T, cfg Config) agentv1.ProcessServiceClient {
	t.Helper()
	r := newRunner(t, cfg)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	NewServer(r).Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return agentv1.NewProcessServiceClient(conn)
}

func wantCode(t *testing.T, err error, code codes.Code, substr string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), substr) {
		t.Fatalf("error %v, want %v naming %q", err, code, substr)
	}
}

func TestGRPCExec(t *testing.T) {
	t.Parallel()
	c := startGRPC(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	resp, err := c.Exec(ctx, &agentv1.ExecRequest{
		Command:   `read a; read b; echo "$a$b $X"; printf '\377' >&2; exit 2`,
		Stdin:     "one\n",
		StdinData: []byte("two\n"),
		Env:       map[string]string{"X": "x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ExitCode != 2 || resp.Stdout != "onetwo x\n" || resp.Stderr != "\uFFFD" || resp.Pid == 0 || resp.Duration.AsDuration() <= 0 {
		t.Errorf("response %v", resp)
	}

	resp, err = c.Exec(ctx, &agentv1.ExecRequest{
		Argv:        []string{"sh", "-c", "head -c 5000 /dev/zero | tr '\\0' y; sleep 100"},
		Timeout:     durationpb.New(500 * time.Millisecond),
		KillGrace:   durationpb.New(100 * time.Millisecond),
		OutputLimit: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.TimedOut || resp.ExitCode != -1 || resp.Signal != "SIGTERM" || !resp.StdoutTruncated || resp.StdoutDroppedBytes != 4900 ||
		!strings.Contains(resp.Stdout, "[berth: 4900 bytes truncated]") {
		t.Errorf("response %v", resp)
	}

	_, err = c.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"true"}, Timeout: durationpb.New(-time.Second)})
	wantCode(t, err, codes.InvalidArgument, "timeout")
	_, err = c.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"true"}, Timeout: &durationpb.Duration{Seconds: 1, Nanos: -1}})
	wantCode(t, err, codes.InvalidArgument, "timeout")
	_, err = c.Exec(ctx, &agentv1.ExecRequest{})
	wantCode(t, err, codes.InvalidArgument, "argv")
	_, err = c.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"no-such-program-xyz"}})
	wantCode(t, err, codes.FailedPrecondition, "argv[0]")
	if back := errgrpc.FromGRPC(err); !errors.Is(back, errdefs.ErrFailedPrecondition) || errdefs.Reason(back) != ReasonCommandNotFound {
		t.Errorf("FromGRPC(%v): %v, reason %q", err, back, errdefs.Reason(back))
	}
	_, err = c.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"/tmp"}})
	if back := errgrpc.FromGRPC(err); errdefs.Reason(back) != ReasonCommandNotExecutable {
		t.Errorf("exec of a directory: %v, reason %q", err, errdefs.Reason(back))
	}
}

func TestGRPCExecStream(t *testing.T) {
	t.Parallel()
	c := startGRPC(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	stream, err := c.ExecStream(ctx, &agentv1.ExecRequest{Command: "echo a; echo b >&2; exit 5"})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*agentv1.ExecEvent
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	if len(evs) < 4 || evs[0].GetStarted().GetPid() == 0 || evs[len(evs)-1].GetExited().GetExitCode() != 5 {
		t.Fatalf("events %v", evs)
	}
	var out, errOut string
	for _, ev := range evs {
		out += string(ev.GetStdout())
		errOut += string(ev.GetStderr())
	}
	if out != "a\n" || errOut != "b\n" {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}

	// A validation error arrives as the stream's status.
	stream, err = c.ExecStream(ctx, &agentv1.ExecRequest{Argv: []string{"true"}, Cwd: "rel"})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.InvalidArgument, "cwd")

	// A client that goes away kills the command's group.
	sctx, cancel := context.WithCancel(ctx)
	stream, err = c.ExecStream(sctx, &agentv1.ExecRequest{Command: "sleep 100 & sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	requireGroupGone(t, int(ev.GetStarted().GetPid()))
}

func TestGRPCBackgroundRoundTrip(t *testing.T) {
	t.Parallel()
	c := startGRPC(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	info, err := c.StartProcess(ctx, &agentv1.ExecRequest{Argv: []string{"cat"}, Stdin: "hello "})
	if err != nil {
		t.Fatal(err)
	}
	if info.State != agentv1.ProcessState_PROCESS_STATE_RUNNING || info.Id == "" || info.StartedAt == nil || info.ExitedAt != nil {
		t.Errorf("info %v", info)
	}
	got, err := c.GetProcess(ctx, &agentv1.GetProcessRequest{Id: info.Id})
	if err != nil || got.Pid != info.Pid {
		t.Fatalf("GetProcess: %v %v", got, err)
	}
	list, err := c.ListProcesses(ctx, &agentv1.ListProcessesRequest{})
	if err != nil || len(list.Processes) != 1 || list.Processes[0].Id != info.Id {
		t.Fatalf("ListProcesses: %v %v", list, err)
	}

	logs, err := c.ProcessLogs(ctx, &agentv1.ProcessLogsRequest{Id: info.Id}) // follow defaults to true
	if err != nil {
		t.Fatal(err)
	}
	ev, err := logs.Recv()
	if err != nil || ev.GetStarted().GetProcessId() != info.Id {
		t.Fatalf("first event %v %v", ev, err)
	}
	w, err := c.WriteStdin(ctx, &agentv1.WriteStdinRequest{Id: info.Id, Text: "wor", Data: []byte("ld"), Close: true})
	if err != nil || w.Written != 5 {
		t.Fatalf("WriteStdin: %v %v", w, err)
	}
	var out string
	var exited *agentv1.Exited
	for {
		ev, err := logs.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out += string(ev.GetStdout())
		if ev.GetExited() != nil {
			exited = ev.GetExited()
		}
	}
	if out != "hello world" || exited == nil || exited.ExitCode != 0 {
		t.Errorf("logs %q exited %v", out, exited)
	}

	// Replay without follow after exit.
	follow := false
	logs, err = c.ProcessLogs(ctx, &agentv1.ProcessLogsRequest{Id: info.Id, Follow: &follow})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		_, err := logs.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 { // started, stdout, exited
		t.Errorf("%d events in replay", n)
	}

	got, err = c.GetProcess(ctx, &agentv1.GetProcessRequest{Id: info.Id})
	if err != nil || got.State != agentv1.ProcessState_PROCESS_STATE_EXITED || !got.StdinClosed || got.ExitedAt == nil {
		t.Errorf("GetProcess after exit: %v %v", got, err)
	}
	_, err = c.SignalProcess(ctx, &agentv1.SignalProcessRequest{Id: info.Id})
	wantCode(t, err, codes.FailedPrecondition, info.Id)
	_, err = c.GetProcess(ctx, &agentv1.GetProcessRequest{Id: "p-nope"})
	wantCode(t, err, codes.NotFound, "p-nope")
	_, err = c.WriteStdin(ctx, &agentv1.WriteStdinRequest{Id: info.Id, Text: "x"})
	wantCode(t, err, codes.FailedPrecondition, info.Id)

	// Signal a running one.
	info, err = c.StartProcess(ctx, &agentv1.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SignalProcess(ctx, &agentv1.SignalProcessRequest{Id: info.Id, Signal: "SIGKILL"}); err != nil {
		t.Fatal(err)
	}
	for {
		got, err = c.GetProcess(ctx, &agentv1.GetProcessRequest{Id: info.Id})
		if err != nil {
			t.Fatal(err)
		}
		if got.State == agentv1.ProcessState_PROCESS_STATE_EXITED {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got.Signal != "SIGKILL" || got.ExitCode != -1 {
		t.Errorf("killed: %v", got)
	}
}
