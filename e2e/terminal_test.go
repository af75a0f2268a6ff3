package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// termWS is a terminal WebSocket client (docs/terminals.md): binary
// messages are the terminal's bytes, text messages JSON controls.
type termWS struct {
	tb   testing.TB
	c    *websocket.Conn
	out  strings.Builder
	ctrl []map[string]any
}

// dialTerminal opens GET {base}{path}/v1/terminals/ws?query with the token
// and reads the session message.
func dialTerminal(tb testing.TB, ctx context.Context, base string, query url.Values, token string) (*termWS, map[string]any) {
	tb.Helper()
	u := "ws" + strings.TrimPrefix(base, "http") + "/v1/terminals/ws?" + query.Encode()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			tb.Fatalf("dial %s: %v: HTTP %d %s", u, err, resp.StatusCode, b)
		}
		tb.Fatalf("dial %s: %v", u, err)
	}
	tb.Cleanup(func() { _ = c.CloseNow() })
	c.SetReadLimit(1 << 20)
	w := &termWS{tb: tb, c: c}
	typ, data, err := c.Read(ctx)
	var sess map[string]any
	if err != nil || typ != websocket.MessageText || json.Unmarshal(data, &sess) != nil || sess["type"] != "session" {
		tb.Fatalf("first message: %v %q %v", typ, data, err)
	}
	return w, sess
}

func (w *termWS) send(ctx context.Context, s string) {
	w.tb.Helper()
	if err := w.c.Write(ctx, websocket.MessageBinary, []byte(s)); err != nil {
		w.tb.Fatalf("write %q: %v", s, err)
	}
}

func (w *termWS) control(ctx context.Context, v any) {
	w.tb.Helper()
	b, _ := json.Marshal(v)
	if err := w.c.Write(ctx, websocket.MessageText, b); err != nil {
		w.tb.Fatalf("write control: %v", err)
	}
}

// waitFor reads until the output after from holds want; it returns the
// output's length after want.
func (w *termWS) waitFor(ctx context.Context, want string, from int) int {
	w.tb.Helper()
	for {
		if i := strings.Index(w.out.String()[from:], want); i >= 0 {
			return from + i + len(want)
		}
		typ, data, err := w.c.Read(ctx)
		if err != nil {
			w.tb.Fatalf("waiting for %q: %v; output:\n%s", want, err, w.out.String())
		}
		if typ == websocket.MessageBinary {
			w.out.Write(data)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			w.tb.Fatalf("text message %q: %v", data, err)
		}
		w.ctrl = append(w.ctrl, m)
	}
}

// readToEnd reads until the connection closes and returns the close status.
func (w *termWS) readToEnd(ctx context.Context) websocket.StatusCode {
	w.tb.Helper()
	for {
		typ, data, err := w.c.Read(ctx)
		if err != nil {
			return websocket.CloseStatus(err)
		}
		if typ == websocket.MessageBinary {
			w.out.Write(data)
			continue
		}
		var m map[string]any
		_ = json.Unmarshal(data, &m)
		w.ctrl = append(w.ctrl, m)
	}
}

// TestTerminalThroughProxy drives an interactive python3 REPL in a real
// Docker sandbox over the terminal WebSocket, through the orchestrator's
// proxy with the lease's token: output, the lease's user, Ctrl-C, resize,
// detach and re-attach with the scrollback, the exit code; and the same
// session over the gRPC stream through the proxy.
func TestTerminalThroughProxy(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	l := o.mustAcquire(t, "c-terminal", baseImage, "600s")
	id, tok := l.GetLease().GetId(), l.GetToken()
	base := o.base + sandboxPath(id, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// No token, no terminal.
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/terminals/ws?argv=python3", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a token: %v %v", resp, err)
	}

	w, sess := dialTerminal(t, ctx, base, url.Values{"argv": {"python3", "-q"}, "rows": {"30"}, "cols": {"100"}}, tok)
	sid, _ := sess["id"].(string)
	if sess["user"] != "sandbox" || !strings.HasPrefix(sid, "t-") {
		t.Errorf("session message %v", sess)
	}
	n := w.waitFor(ctx, ">>> ", 0)
	// Enter is "\r" from a terminal; the line discipline makes it "\n".
	w.send(ctx, "print(6*7, 'x' * 3)\r")
	n = w.waitFor(ctx, "42 xxx", n)
	w.send(ctx, "import os, shutil; print('uid', os.getuid(), shutil.get_terminal_size())\r")
	n = w.waitFor(ctx, "uid 1000 os.terminal_size(columns=100, lines=30)", n)
	w.control(ctx, map[string]any{"type": "resize", "rows": 50, "cols": 132})
	w.send(ctx, "print('size', shutil.get_terminal_size())\r")
	n = w.waitFor(ctx, "size os.terminal_size(columns=132, lines=50)", n)
	// Ctrl-C interrupts a running statement; the REPL lives on.
	w.send(ctx, "import time; time.sleep(60)\r")
	time.Sleep(500 * time.Millisecond)
	w.send(ctx, "\x03")
	n = w.waitFor(ctx, "KeyboardInterrupt", n)
	w.send(ctx, "print('after', 7*6)\r")
	w.waitFor(ctx, "after 42", n)

	// Detach; the session keeps running in the sandbox.
	_ = w.c.Close(websocket.StatusNormalClosure, "detach")
	code, _, body := o.mustCall(t, http.MethodGet, sandboxPath(id, "/v1/terminals"), nil, tok)
	if code != http.StatusOK || !strings.Contains(string(body), sid) || !strings.Contains(string(body), `"running":true`) {
		t.Fatalf("list through the proxy: %d %s", code, body)
	}
	// Re-attach: the scrollback comes first.
	w2, _ := dialTerminal(t, ctx, base, url.Values{"session": {sid}}, tok)
	m := w2.waitFor(ctx, "after 42", 0)
	if !strings.Contains(w2.out.String(), "42 xxx") {
		t.Errorf("replay misses earlier output: %q", w2.out.String())
	}

	// The same session over the gRPC stream through the proxy.
	tc := agentv1.NewTerminalServiceClient(o.grpcConn(t))
	stream, err := tc.Connect(leaseCtx(ctx, id, tok))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Attach{Attach: &agentv1.TerminalAttach{SessionId: sid, NoReplay: true}}}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetSession().GetId() != sid || first.GetSession().GetClients() != 2 {
		t.Fatalf("gRPC attach: %v %v", first, err)
	}
	if err := stream.Send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Input{Input: []byte("print('grpc', 5*5)\r")}}); err != nil {
		t.Fatal(err)
	}
	var gout strings.Builder
	for !strings.Contains(gout.String(), "grpc 25") {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("gRPC stream: %v; output %q", err, gout.String())
		}
		gout.Write(msg.GetOutput())
	}
	// The WebSocket client sees what the gRPC client typed.
	w2.waitFor(ctx, "grpc 25", m)

	// The program's exit code reaches every client.
	w2.send(ctx, "raise SystemExit(3)\r")
	if st := w2.readToEnd(ctx); st != websocket.StatusNormalClosure {
		t.Errorf("close status %v", st)
	}
	if i := slices.IndexFunc(w2.ctrl, func(c map[string]any) bool { return c["type"] == "exit" }); i < 0 || w2.ctrl[i]["code"] != float64(3) {
		t.Errorf("controls %v, want exit code 3", w2.ctrl)
	}
	var exit *agentv1.TerminalExit
	for {
		msg, err := stream.Recv()
		if err != nil {
			if err != io.EOF {
				t.Errorf("gRPC end: %v", err)
			}
			break
		}
		if msg.GetExit() != nil {
			exit = msg.GetExit()
		}
	}
	if exit.GetExitCode() != 3 {
		t.Errorf("gRPC exit %v", exit)
	}
}

// TestTerminalKeystrokeLatency measures the round trip of one keystroke
// through the proxy: a byte sent over the WebSocket to a `cat` session in
// a Docker sandbox, echoed by the terminal, back to the client; and the
// same straight to the agent for comparison. It logs p50 and p99 over
// BERTH_TERMINAL_KEYS (default 200) keystrokes; run with -v to see them.
func TestTerminalKeystrokeLatency(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	l := o.mustAcquire(t, "c-terminal-latency", baseImage, "600s")
	id, tok := l.GetLease().GetId(), l.GetToken()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	keys := 200
	if v, err := strconv.Atoi(os.Getenv("BERTH_TERMINAL_KEYS")); err == nil && v > 0 {
		keys = v
	}
	for _, tc := range []struct {
		name, base, token string
	}{
		{"proxy", o.base + sandboxPath(id, ""), tok},
		{"direct", "http://" + l.GetLease().GetEndpoint(), o.agentToken(id)},
	} {
		w, _ := dialTerminal(t, ctx, tc.base, url.Values{"argv": {"cat"}}, tc.token)
		// Warm up, and make sure the terminal echoes.
		w.send(ctx, "w")
		n := w.waitFor(ctx, "w", 0)
		lat := make([]time.Duration, 0, keys)
		for i := range keys {
			b := string(rune('a' + i%26))
			t0 := time.Now()
			w.send(ctx, b)
			n = w.waitFor(ctx, b, n)
			lat = append(lat, time.Since(t0))
			if i%64 == 63 {
				// Keep the line short (the terminal holds 4095 bytes of
				// an unfinished line): Ctrl-U erases it, echoed as
				// backspaces and spaces, never a letter.
				w.send(ctx, "\x15")
				time.Sleep(20 * time.Millisecond)
			}
		}
		_ = w.c.Close(websocket.StatusNormalClosure, "done")
		slices.Sort(lat)
		p := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
		t.Logf("keystroke round trip %-6s over %d keys: p50 %v p99 %v max %v", tc.name, keys, p(0.50), p(0.99), lat[len(lat)-1])
	}
}
