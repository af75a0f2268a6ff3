package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/pkg/agent/envd"
	pb "github.com/berth-dev/berth/proto/e2b/envd/process"
	"github.com/berth-dev/berth/proto/e2b/envd/process/processconnect"
)

// TestEnvdListen runs the agent binary with --envd-listen: the envd
// address answers /health and runs a command over Connect with the
// agent's token as the access token, and refuses a call without it.
func TestEnvdListen(t *testing.T) {
	bin := buildAgent(t)
	addr, envdAddr := freePort(t), freePort(t)
	cmd := exec.Command(bin, "--listen", addr, "--envd-listen", envdAddr, "--workdir", t.TempDir(), "--state-file", "")
	cmd.Env = append(os.Environ(), "BERTH_AGENT_TOKEN=tok")
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("agent did not exit 15s after SIGTERM")
		}
	})
	base := "http://" + envdAddr
	for i := 0; ; i++ {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("/health: %d", resp.StatusCode)
			}
			break
		}
		if i > 400 {
			t.Fatalf("envd not up: %v", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := processconnect.NewProcessClient(http.DefaultClient, base)
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo hi"}}})
	req.Header().Set(envd.AccessTokenHeader, "tok")
	st, err := client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	var end *pb.ProcessEvent_EndEvent
	for st.Receive() {
		ev := st.Msg().GetEvent()
		out += string(ev.GetData().GetStdout())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	st.Close()
	if st.Err() != nil || out != "hi\n" || end == nil || end.ExitCode != 0 {
		t.Fatalf("out %q, end %v, err %v", out, end, st.Err())
	}
	_, err = client.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("List without the token: %v", err)
	}

	// HTTP/2 without TLS (h2c) is served too.
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	resp, err := h2.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("h2c /health: %s %d", resp.Proto, resp.StatusCode)
	}
	lreq := connect.NewRequest(&pb.ListRequest{})
	lreq.Header().Set(envd.AccessTokenHeader, "tok")
	if _, err := processconnect.NewProcessClient(h2, base, connect.WithGRPC()).List(ctx, lreq); err != nil {
		t.Fatalf("List over gRPC on h2c: %v", err)
	}
}
