package envd

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	pb "github.com/berth-dev/berth/proto/e2b/envd/process"
)

// TestKeepalive: with Keepalive-Ping-Interval set, an idle Start stream
// gets keepalive events; without it, none (the process prints nothing
// until its stdin closes, so any event before that would be one).
func TestKeepalive(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxT(t)
	for _, c := range []struct {
		header string
		want   bool
	}{{"1", true}, {"", false}} {
		req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}})
		if c.header != "" {
			req.Header().Set(KeepaliveHeader, c.header)
		}
		st, err := e.proc.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ch, _ := collect(st)
		pid := (<-ch).GetStart().GetPid()
		// A keepalive comes after a second; the test waits for it up to
		// 10s, and for 1.5s to see that none comes without the header.
		wait := 1500 * time.Millisecond
		if c.want {
			wait = 10 * time.Second
		}
		var got *pb.ProcessEvent
		select {
		case got = <-ch:
		case <-time.After(wait):
		}
		if c.want && got.GetKeepalive() == nil {
			t.Errorf("header %q: got %v, want a keepalive", c.header, got)
		}
		if !c.want && got != nil {
			t.Errorf("header %q: got %v, want nothing", c.header, got)
		}
		if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
			t.Fatal(err)
		}
		if _, _, _, end := untilEnd(t, ch); end.ExitCode != 0 {
			t.Fatalf("end = %v", end)
		}
		st.Close()
	}
}

// TestPTY runs a shell on a terminal: input goes in as pty input, Update
// resizes the terminal (stty sees it), output comes as pty data.
func TestPTY(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxT(t)
	st, err := e.procJS.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "stty size; read x; stty size; echo got=$x"}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Rows: 30, Cols: 100}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ch, _ := collect(st)
	pid := next(t, ch).GetStart().GetPid()
	var out string
	for !strings.Contains(out, "30 100") {
		out += string(next(t, ch).GetData().GetPty())
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: pidSel(pid)})); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("CloseStdin on a pty: %v", err)
	}
	if _, err := e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: pidSel(pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Rows: 40, Cols: 120}}})); err != nil {
		t.Fatal(err)
	}
	in := &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("yes\r")}}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: pidSel(pid), Input: in})); err != nil {
		t.Fatal(err)
	}
	_, _, rest, end := untilEnd(t, ch)
	if !strings.Contains(rest, "40 120") || !strings.Contains(rest, "got=yes") {
		t.Errorf("output after the resize: %q", rest)
	}
	if end.ExitCode != 0 || !end.Exited {
		t.Errorf("end = %v", end)
	}

	// Update of a process without a pty is refused.
	st2, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	ch2, _ := collect(st2)
	pid2 := next(t, ch2).GetStart().GetPid()
	if _, err := e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: pidSel(pid2), Pty: &pb.PTY{Size: &pb.PTY_Size{Rows: 40, Cols: 120}}})); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Update without a pty: %v", err)
	}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid2), Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := untilEnd(t, ch2); end.Status != "signal: terminated" {
		t.Fatalf("end = %v", end)
	}
}

// TestPTYKill: SIGKILL ends a terminal's program.
func TestPTYKill(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxT(t)
	st, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"1000"}}, Pty: &pb.PTY{Size: &pb.PTY_Size{Rows: 24, Cols: 80}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ch, _ := collect(st)
	pid := next(t, ch).GetStart().GetPid()
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := untilEnd(t, ch); end.Exited || end.Status != "signal: killed" {
		t.Fatalf("end = %v", end)
	}
}
