package envd

import (
	"strings"
	"testing"

	"connectrpc.com/connect"
	pb "github.com/berth-dev/berth/proto/e2b/envd/process"
	"github.com/berth-dev/berth/proto/e2b/envd/process/processconnect"
)

// TestStartStreamsOutputAndExit runs a shell with both codecs: the start
// event carries the pid, stdout and stderr come apart, the end event the
// exit code.
func TestStartStreamsOutputAndExit(t *testing.T) {
	e := newEnv(t, "")
	for name, client := range map[string]func() (*connect.ServerStreamForClient[pb.StartResponse], error){
		"proto": func() (*connect.ServerStreamForClient[pb.StartResponse], error) {
			return e.proc.Start(ctxT(t), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{
				Cmd: "/bin/sh", Args: []string{"-c", "echo out; echo err >&2; pwd; echo $GREETING; exit 3"},
				Envs: map[string]string{"GREETING": "hello"}}}))
		},
		"json": func() (*connect.ServerStreamForClient[pb.StartResponse], error) {
			return e.procJS.Start(ctxT(t), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{
				Cmd: "/bin/sh", Args: []string{"-c", "echo out; echo err >&2; pwd; echo $GREETING; exit 3"},
				Envs: map[string]string{"GREETING": "hello"}}}))
		},
	} {
		t.Run(name, func(t *testing.T) {
			st, err := client()
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ch, errc := collect(st)
			if start := next(t, ch).GetStart(); start == nil || start.Pid == 0 {
				t.Fatalf("first event is not a start with a pid")
			}
			stdout, stderr, _, end := untilEnd(t, ch)
			if want := "out\n" + e.workDir + "\nhello\n"; stdout != want {
				t.Errorf("stdout = %q, want %q", stdout, want)
			}
			if stderr != "err\n" {
				t.Errorf("stderr = %q", stderr)
			}
			if end.ExitCode != 3 || !end.Exited || end.Status != "exit status 3" || end.Error != nil {
				t.Errorf("end = %v", end)
			}
			if _, ok := <-ch; ok {
				t.Error("events after the end")
			}
			if err := <-errc; err != nil {
				t.Errorf("stream error: %v", err)
			}
		})
	}
}

// TestStartMissingProgram: a program that does not exist fails the call.
func TestStartMissingProgram(t *testing.T) {
	e := newEnv(t, "")
	st, err := e.proc.Start(ctxT(t), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/no/such/program"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Receive() {
		t.Fatalf("got an event: %v", st.Msg())
	}
	if codeOf(st.Err()) != connect.CodeFailedPrecondition {
		t.Fatalf("err = %v, want failed_precondition", st.Err())
	}
	st2, err := e.proc.Start(ctxT(t), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if st2.Receive() || codeOf(st2.Err()) != connect.CodeInvalidArgument || !strings.Contains(st2.Err().Error(), "process.cmd") {
		t.Fatalf("empty cmd: err = %v, want invalid_argument naming process.cmd", st2.Err())
	}
}

// TestStdinSendInputCloseStdin feeds cat through SendInput and ends it by
// closing its stdin; StreamInput feeds a second one in order.
func TestStdinSendInputCloseStdin(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxT(t)
	st, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: ptr(true)}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ch, _ := collect(st)
	pid := next(t, ch).GetStart().GetPid()
	in := &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}}
	if _, err := e.procJS.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: pidSel(pid), Input: in})); err != nil {
		t.Fatal(err)
	}
	if got := string(next(t, ch).GetData().GetStdout()); got != "hello\n" {
		t.Fatalf("echoed %q", got)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := untilEnd(t, ch); end.ExitCode != 0 || !end.Exited {
		t.Fatalf("end = %v", end)
	}
	// Input to a process that has ended is refused.
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: pidSel(pid), Input: in}))
	if code := codeOf(err); code != connect.CodeFailedPrecondition && code != connect.CodeNotFound {
		t.Fatalf("input after the end: %v", err)
	}

	// StreamInput, with a tag as the selector.
	st2, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Tag: ptr("feeder")}))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	ch2, _ := collect(st2)
	pid2 := next(t, ch2).GetStart().GetPid()
	is := e.proc.StreamInput(ctx)
	msgs := []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "feeder"}}}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("a")}}}}},
		{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("b\n")}}}}},
	}
	for _, m := range msgs {
		if err := is.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := is.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: pidSel(pid2)})); err != nil {
		t.Fatal(err)
	}
	if stdout, _, _, end := untilEnd(t, ch2); stdout != "ab\n" || end.ExitCode != 0 {
		t.Fatalf("stdout %q, end %v", stdout, end)
	}
}

// TestStdinFalse: a process started with stdin false reads EOF at once.
func TestStdinFalse(t *testing.T) {
	e := newEnv(t, "")
	st, err := e.proc.Start(ctxT(t), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: ptr(false)}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ch, _ := collect(st)
	next(t, ch)
	if _, _, _, end := untilEnd(t, ch); end.ExitCode != 0 {
		t.Fatalf("end = %v", end)
	}
}

// TestSignalListConnect: a tagged sleep is listed, a second client
// connects to it by tag, SIGKILL ends it for both, and it leaves the list.
func TestSignalListConnect(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxT(t)
	st, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"1000"}}, Tag: ptr("sleeper")}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ch, _ := collect(st)
	pid := next(t, ch).GetStart().GetPid()

	for _, c := range []processconnect.ProcessClient{e.proc, e.procJS} {
		list, err := c.List(ctx, connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if ps := list.Msg.Processes; len(ps) != 1 || ps[0].Pid != pid || ps[0].GetTag() != "sleeper" || ps[0].Config.GetCmd() != "sleep" {
			t.Fatalf("list = %v", ps)
		}
	}

	cs, err := e.procJS.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "sleeper"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	cch, _ := collect(cs)
	if got := next(t, cch).GetStart().GetPid(); got != pid {
		t.Fatalf("connect start pid %d, want %d", got, pid)
	}

	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_UNSPECIFIED})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("unspecified signal: %v", err)
	}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for _, c := range []<-chan *pb.ProcessEvent{ch, cch} {
		_, _, _, end := untilEnd(t, c)
		if end.Exited || end.Status != "signal: killed" || end.ExitCode != -1 {
			t.Fatalf("end = %v", end)
		}
	}
	list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Processes) != 0 {
		t.Fatalf("list after kill = %v", list.Msg.Processes)
	}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(1 << 30), Signal: pb.Signal_SIGNAL_SIGTERM})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown pid: %v", err)
	}
}
