package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// readWSUntil reads a terminal WebSocket until its output holds want and
// returns the text messages seen.
func readWSUntil(t *testing.T, ctx context.Context, c *websocket.Conn, want string) []string {
	t.Helper()
	var out strings.Builder
	var texts []string
	for !strings.Contains(out.String(), want) {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (output %q)", err, out.String())
		}
		if typ == websocket.MessageText {
			texts = append(texts, string(data))
		} else {
			out.Write(data)
		}
	}
	return texts
}

// TestTerminalRoutes: the terminal WebSocket, gRPC stream and REST routes
// are served on the agent's port behind its token.
func TestTerminalRoutes(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := "ws://" + a.addr + "/v1/terminals/ws?argv=/bin/sh"

	_, resp, err := websocket.Dial(ctx, u, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a token: %v %v", resp, err)
	}
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + testToken}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("echo agent-$((6*7)); pwd\n")); err != nil {
		t.Fatal(err)
	}
	texts := readWSUntil(t, ctx, c, "agent-42\r\n"+a.workDir)
	var sess struct{ Type, ID string }
	if len(texts) == 0 || json.Unmarshal([]byte(texts[0]), &sess) != nil || sess.Type != "session" {
		t.Fatalf("text messages %q", texts)
	}

	// REST: list and kill.
	code, body := a.do(t, http.MethodGet, "/v1/terminals", nil)
	if code != http.StatusOK || !strings.Contains(string(body), sess.ID) || !strings.Contains(string(body), `"running":true`) {
		t.Fatalf("GET /v1/terminals: %d %s", code, body)
	}
	code, body = a.do(t, http.MethodPost, "/v1/terminals/"+sess.ID+":kill", "{}")
	if code != http.StatusOK {
		t.Fatalf("kill: %d %s", code, body)
	}
	texts = nil
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Errorf("close: %v", err)
			}
			break
		}
		if typ == websocket.MessageText {
			texts = append(texts, string(data))
		}
	}
	if len(texts) != 1 || !strings.Contains(texts[0], `"type":"exit"`) || !strings.Contains(texts[0], "SIGHUP") {
		t.Errorf("after kill: %q", texts)
	}
	code, body = a.do(t, http.MethodPost, "/v1/terminals/t-nope:kill", "{}")
	if code != http.StatusNotFound {
		t.Errorf("kill unknown: %d %s", code, body)
	}

	// gRPC: the token is required; with it the stream works.
	tc := agentv1.NewTerminalServiceClient(a.conn)
	stream, err := tc.Connect(ctx)
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC without a token: %v", err)
	}
	stream, err = tc.Connect(authed(ctx, testToken))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Open{Open: &agentv1.TerminalOpen{Command: "echo grpc-$((5*5)); exit 9"}}}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var exit *agentv1.TerminalExit
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out.Write(msg.GetOutput())
		if msg.GetExit() != nil {
			exit = msg.GetExit()
		}
	}
	if !strings.Contains(out.String(), "grpc-25") || exit.GetExitCode() != 9 {
		t.Errorf("gRPC session: %q, exit %v", out.String(), exit)
	}
}

// TestTerminalsEndWhenTheAgentStops: a running session ends, and its client
// gets the exit, when the agent shuts down; the shutdown does not wait out
// its grace for the open stream.
func TestTerminalsEndWhenTheAgentStops(t *testing.T) {
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, ln) }()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+ln.Addr().String()+"/v1/terminals/ws?argv=/bin/sh",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + testToken}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("echo up-$((2*2))\n")); err != nil {
		t.Fatal(err)
	}
	readWSUntil(t, ctx, c, "up-4")
	t0 := time.Now()
	stop()
	var exit string
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageText {
			exit = string(data)
		}
	}
	if !strings.Contains(exit, `"type":"exit"`) {
		t.Errorf("last text message %q, want the exit", exit)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not stop")
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("shutdown took %s", d)
	}
}

// TestTerminalUserPolicy: a terminal runs as the agent's default user and
// obeys the root policy, as exec does (403 before any upgrade).
func TestTerminalUserPolicy(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "running terminals as other users needs root")
	}
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: t.TempDir(), User: "nobody", DenyRoot: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	addr := testserve.Serve(t, srv.Serve)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hdr := &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + testToken}}}
	_, resp, err := websocket.Dial(ctx, "ws://"+addr+"/v1/terminals/ws?argv=/bin/sh&user=root", hdr)
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("as root with root forbidden: %v %v", resp, err)
	}
	// The test's work directory is not open to nobody.
	_, resp, err = websocket.Dial(ctx, "ws://"+addr+"/v1/terminals/ws?argv=/bin/sh", hdr)
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("in a directory closed to the user: %v %v", resp, err)
	}
	if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), "permission denied") {
		t.Errorf("error %s", b)
	}
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/terminals/ws?argv=/bin/sh&cwd=/", hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("echo uid-$(id -u)-$USER\n")); err != nil {
		t.Fatal(err)
	}
	readWSUntil(t, ctx, c, "uid-65534-nobody")
}
