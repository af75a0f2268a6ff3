package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// screenTimeout bounds every wait for the screen: generous, for a loaded
// machine; the waits poll and return as soon as the screen is right.
const screenTimeout = 90 * time.Second

// tmuxServer is a private tmux server (its own socket, no user
// configuration) whose panes run /bin/sh with the CLI's environment.
type tmuxServer struct {
	tb     testing.TB
	socket string
	conf   string
	env    []string
}

// newTmux starts nothing yet; the server starts with the first session and
// is killed when the test ends.
func newTmux(tb testing.TB, env ...string) *tmuxServer {
	tb.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		testenv.SkipOrFail(tb, "tmux not found: the shell tests drive the CLI inside tmux (make deps installs it)")
	}
	conf := filepath.Join(tb.TempDir(), "tmux.conf")
	// No status line: the pane is the whole window, so its size is the
	// size asked for.
	if err := os.WriteFile(conf, []byte("set -g status off\nset -g history-limit 10000\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	// A private server: its socket (berth-test-<random>) in the test's
	// temporary directory, so that nothing is left behind in /tmp/tmux-UID.
	x := &tmuxServer{tb: tb, socket: filepath.Join(filepath.Dir(conf), "berth-test-"+randHex(6)), conf: conf,
		env: append(hermeticEnv(), append([]string{"ENV="}, env...)...)}
	tb.Cleanup(func() { _, _ = x.run("kill-server") })
	return x
}

func (x *tmuxServer) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "tmux", append([]string{"-S", x.socket, "-f", x.conf}, args...)...)
	cmd.Env = x.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (x *tmuxServer) must(args ...string) string {
	x.tb.Helper()
	out, err := x.run(args...)
	if err != nil {
		x.tb.Fatalf("tmux %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// session starts a detached session of cols × rows running /bin/sh.
func (x *tmuxServer) session(name string, cols, rows int) {
	x.tb.Helper()
	x.must("new-session", "-d", "-s", name, "-x", strconv.Itoa(cols), "-y", strconv.Itoa(rows), "/bin/sh")
	x.wait(name, "the host shell's prompt", func(s string) bool { return strings.TrimSpace(s) != "" })
}

// typeLine types text into the pane, then Enter.
func (x *tmuxServer) typeLine(name, text string) {
	x.tb.Helper()
	x.must("send-keys", "-t", name, "-l", text)
	x.must("send-keys", "-t", name, "Enter")
}

// retype types text, then again every few seconds, until a line that is
// exactly line shows.
func (x *tmuxServer) retype(name, text, line string) {
	x.tb.Helper()
	deadline := time.Now().Add(screenTimeout)
	for {
		x.typeLine(name, text)
		for again := time.Now().Add(3 * time.Second); time.Now().Before(again); time.Sleep(100 * time.Millisecond) {
			if hasLine(x.screen(name), line) {
				return
			}
		}
		if time.Now().After(deadline) {
			x.tb.Fatalf("waited %s for a line %q after typing %q; the screen:\n%s", screenTimeout, line, text, x.screen(name))
		}
	}
}

// keys sends tmux key names (C-c, Enter, q).
func (x *tmuxServer) keys(name string, keys ...string) {
	x.tb.Helper()
	x.must(append([]string{"send-keys", "-t", name}, keys...)...)
}

// screen is the pane's visible text.
func (x *tmuxServer) screen(name string) string {
	x.tb.Helper()
	return x.must("capture-pane", "-p", "-t", name)
}

// wait polls the screen until cond holds and returns it.
func (x *tmuxServer) wait(name, what string, cond func(screen string) bool) string {
	x.tb.Helper()
	var s string
	deadline := time.Now().Add(screenTimeout)
	for {
		s = x.screen(name)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			x.tb.Fatalf("waited %s for %s; the screen:\n%s", screenTimeout, what, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitLine waits for a line that is exactly line (trailing blanks aside).
func (x *tmuxServer) waitLine(name, line string) string {
	x.tb.Helper()
	return x.wait(name, fmt.Sprintf("a line %q", line), func(s string) bool { return hasLine(s, line) })
}

// waitText waits for text anywhere on the screen.
func (x *tmuxServer) waitText(name, text string) string {
	x.tb.Helper()
	return x.wait(name, fmt.Sprintf("%q", text), func(s string) bool { return strings.Contains(s, text) })
}

// logScreen logs a screen with -v, to show what the test saw.
func (x *tmuxServer) logScreen(name, s string) {
	if testing.Verbose() {
		x.tb.Logf("screen of %s:\n%s", name, strings.TrimRight(s, "\n"))
	}
}

func hasLine(screen, line string) bool {
	return slices.ContainsFunc(strings.Split(screen, "\n"), func(l string) bool { return strings.TrimRight(l, " ") == line })
}

var sessionLine = regexp.MustCompile(`orchestrator: session (t-[0-9a-f]{16})`)

// baseLease starts an in-process orchestrator and acquires a lease on
// berth/base for conversation conv.
func baseLease(t *testing.T, conv string) (*orch, *orchv1.AcquireResponse) {
	t.Helper()
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	return o, o.mustAcquire(t, conv, baseImage, "900s")
}

// TestShellInTmux drives the real `orchestrator shell` binary inside tmux
// against a Docker sandbox, through the orchestrator's proxy with the
// lease's token, the way a person uses it: an interactive python3 REPL
// (output, Ctrl-C, the exit code), a full-screen program (less), a resize
// of the window, and detaching and re-attaching with the earlier output.
func TestShellInTmux(t *testing.T) {
	o, l := baseLease(t, "c-shell-tmux")
	id, tok := l.GetLease().GetId(), l.GetToken()
	x := newTmux(t, "BERTH_ADDR=http://"+o.addr, "BERTH_TOKEN="+tok)
	shell := orchBin + " shell"

	t.Run("python", func(t *testing.T) {
		x.tb = t
		x.session("py", 120, 40)
		x.typeLine("py", shell+" "+id+" -- python3 -q; echo rc=$?")
		x.waitLine("py", ">>>") // capture-pane drops trailing blanks
		if s := x.screen("py"); !sessionLine.MatchString(s) || !strings.Contains(s, "re-attach with --attach t-") {
			t.Errorf("no session line before the REPL:\n%s", s)
		}
		x.typeLine("py", "print(6*7)")
		x.waitLine("py", "42")
		// A busy loop, interrupted by Ctrl-C typed on the local terminal.
		x.typeLine("py", `exec("print('spinning')\nwhile True: pass")`)
		x.waitLine("py", "spinning")
		x.keys("py", "C-c")
		x.waitLine("py", "KeyboardInterrupt")
		x.typeLine("py", "print('alive', 7*6)")
		x.waitLine("py", "alive 42")
		// The REPL's exit code is the CLI's.
		x.typeLine("py", "exit(3)")
		x.waitLine("py", "rc=3")
		// The local terminal is restored: the host shell reads lines again
		// (in raw mode Enter would not end one).
		x.typeLine("py", "echo restored-$((6*7))")
		x.logScreen("py", x.waitLine("py", "restored-42"))
	})

	t.Run("less", func(t *testing.T) {
		x.tb = t
		x.session("less", 120, 40)
		x.typeLine("less", shell+" --sh "+id+` -- 'seq -f "line %03g" 200 > /tmp/lines.txt && less /tmp/lines.txt'; echo rc=$?`)
		s := x.waitLine("less", "line 039")
		if !hasLine(s, "line 001") || strings.Contains(s, "line 041") {
			t.Errorf("first screen of less:\n%s", s)
		}
		x.keys("less", "G")
		s = x.wait("less", "the end of the file", func(s string) bool { return hasLine(s, "line 200") && strings.Contains(s, "(END)") })
		x.logScreen("less", s)
		if strings.Contains(s, "line 001") {
			t.Errorf("after G the first line is still shown:\n%s", s)
		}
		x.keys("less", "q")
		x.waitLine("less", "rc=0")
	})

	t.Run("resize and re-attach", func(t *testing.T) {
		x.tb = t
		x.session("sh", 120, 40)
		x.typeLine("sh", shell+" "+id+" -- sh; echo rc=$?")
		s := x.waitText("sh", "re-attach with --attach t-")
		sid := sessionLine.FindStringSubmatch(s)[1]
		if !strings.Contains(s, "; detach with ctrl-p ctrl-q)") {
			t.Errorf("the session line does not name the detach keys:\n%s", s)
		}
		x.typeLine("sh", "stty size")
		x.waitLine("sh", "40 120")
		// The CLI learns of the resize by a signal, the keys come through
		// the pane: on a loaded machine "stty size" may overtake the
		// resize, so it is typed again until the new size shows.
		x.must("resize-window", "-t", "sh", "-x", "100", "-y", "30")
		x.retype("sh", "stty size", "30 100")
		x.typeLine("sh", "echo marker-$((40+2))")
		x.waitLine("sh", "marker-42")

		// Detach with ctrl-p ctrl-q: the CLI exits 0, the session runs on.
		x.keys("sh", "C-p", "C-q")
		x.waitText("sh", "detached from session "+sid)
		x.waitLine("sh", "rc=0")
		x.typeLine("sh", "clear")
		x.wait("sh", "a clear screen", func(s string) bool { return !strings.Contains(s, "marker-42") })
		x.must("clear-history", "-t", "sh")
		// Re-attach: the earlier output is replayed.
		x.typeLine("sh", shell+" --attach "+sid+" "+id+"; echo rc=$?")
		x.waitLine("sh", "marker-42")

		// Kill the client (its window goes: SIGHUP), re-attach from a
		// window of another size: the session takes the new size.
		x.must("kill-session", "-t", "sh")
		x.session("sh2", 90, 35)
		x.typeLine("sh2", shell+" --attach "+sid+" "+id+"; echo rc=$?")
		x.waitLine("sh2", "marker-42")
		x.typeLine("sh2", "stty size")
		x.waitLine("sh2", "35 90")
		x.typeLine("sh2", "exit 4")
		x.logScreen("sh2", x.waitLine("sh2", "rc=4"))
	})
}

// TestTerminalBrowserToken opens a terminal WebSocket through the real
// proxy the way a browser must: no Authorization header, the lease's token
// offered as the subprotocol "berth.token.TOKEN" beside berth.terminal.v1;
// and a foreign page's Origin is refused.
func TestTerminalBrowserToken(t *testing.T) {
	o, l := baseLease(t, "c-terminal-browser")
	id, tok := l.GetLease().GetId(), l.GetToken()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := "ws://" + o.addr + sandboxPath(id, "/v1/terminals/ws?argv=cat")
	protocols := []string{"berth.terminal.v1", "berth.token." + tok}

	for _, origin := range []string{"", "http://" + o.addr} {
		h := http.Header{}
		if origin != "" {
			h.Set("Origin", origin)
		}
		c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: protocols, HTTPHeader: h})
		if err != nil {
			t.Fatalf("origin %q: dial: %v (%v)", origin, err, resp)
		}
		if c.Subprotocol() != "berth.terminal.v1" {
			t.Errorf("origin %q: subprotocol %q, want berth.terminal.v1", origin, c.Subprotocol())
		}
		w := &termWS{tb: t, c: c}
		if typ, data, err := c.Read(ctx); err != nil || typ != websocket.MessageText || !strings.Contains(string(data), `"type":"session"`) {
			t.Fatalf("origin %q: first message %v %q %v", origin, typ, data, err)
		}
		w.send(ctx, "typed\r")
		w.waitFor(ctx, "typed", 0)
		_ = c.Close(websocket.StatusNormalClosure, "done")
	}

	for _, tc := range []struct {
		name      string
		origin    string
		protocols []string
		want      int
	}{
		{"foreign origin", "https://evil.example", protocols, http.StatusForbidden},
		{"wrong token", "", []string{"berth.terminal.v1", "berth.token.nope"}, http.StatusUnauthorized},
		{"no token", "", []string{"berth.terminal.v1"}, http.StatusUnauthorized},
	} {
		h := http.Header{}
		if tc.origin != "" {
			h.Set("Origin", tc.origin)
		}
		_, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: tc.protocols, HTTPHeader: h})
		if err == nil || resp == nil || resp.StatusCode != tc.want {
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			t.Errorf("%s: HTTP %d (%v), want %d", tc.name, code, err, tc.want)
		}
	}
}

// TestShellKeystrokeLatency measures the round trip of one keystroke
// through `orchestrator shell`: the real binary runs on a pseudo-terminal
// of this host (raw mode, as under a person's terminal emulator) with a
// `cat` session in a Docker sandbox, through the orchestrator's proxy; a
// byte written to the host terminal goes through the CLI, the gRPC stream,
// the proxy and the agent to the sandbox's terminal, whose echo comes back
// the same way to the host terminal. For comparison it measures the gRPC
// stream through the proxy alone (this process as the client, no CLI, no
// host terminal). It logs p50 and p99 over BERTH_TERMINAL_KEYS (default
// 200) keystrokes; run with -v to see them.
func TestShellKeystrokeLatency(t *testing.T) {
	o, l := baseLease(t, "c-shell-latency")
	id, tok := l.GetLease().GetId(), l.GetToken()
	keys := 200
	if v, err := strconv.Atoi(os.Getenv("BERTH_TERMINAL_KEYS")); err == nil && v > 0 {
		keys = v
	}

	cmd := exec.Command(orchBin, "shell", "--detach-keys", "", id, "--", "cat")
	cmd.Env = append(hermeticEnv(), "BERTH_ADDR=http://"+o.addr, "BERTH_TOKEN="+tok, "TERM=xterm-256color")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = ptmx.Close()
		_ = cmd.Process.Kill()
		<-exited
	})
	echo := newEchoes(t, func(b []byte) (int, error) { return ptmx.Read(b) })
	echo.wait(")\r\n", echo.wait("orchestrator: session t-", 0))
	write := func(s string) {
		if _, err := ptmx.Write([]byte(s)); err != nil {
			t.Fatalf("write %q: %v", s, err)
		}
	}
	lat := echo.measure(keys, write)
	t.Logf("keystroke round trip through orchestrator shell (host pty, CLI, proxy, agent, sandbox pty and back) over %d keys: p50 %v p99 %v max %v",
		keys, percentile(lat, 50), percentile(lat, 99), slices.Max(lat))
	write("\x04") // the line so far goes to cat
	write("\x04") // at the start of a line: cat ends, so does the CLI
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("the CLI after cat ended: %v", waitErr)
		}
	case <-time.After(screenTimeout):
		t.Errorf("the CLI did not exit after cat ended")
	}

	// The gRPC stream alone, through the proxy and straight to the agent.
	direct, err := grpc.NewClient(l.GetLease().GetEndpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, path := range []struct {
		name string
		conn *grpc.ClientConn
		ctx  context.Context
	}{
		{"through the proxy", o.grpcConn(t), leaseCtx(ctx, id, tok)},
		{"straight to the agent", direct, withToken(ctx, o.agentToken(id))},
	} {
		lat := grpcEchoes(t, path.ctx, path.conn, keys)
		t.Logf("keystroke round trip over the gRPC stream %s (no CLI, no host pty) over %d keys: p50 %v p99 %v max %v",
			path.name, keys, percentile(lat, 50), percentile(lat, 99), slices.Max(lat))
	}
}

// grpcEchoes opens a cat session over conn's TerminalService and measures
// keys round trips.
func grpcEchoes(t *testing.T, ctx context.Context, conn *grpc.ClientConn, keys int) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // detaches; the sandbox goes with the test
	stream, err := agentv1.NewTerminalServiceClient(conn).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Open{Open: &agentv1.TerminalOpen{Argv: []string{"cat"}}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetSession() == nil {
		t.Fatalf("first message %v %v", m, err)
	}
	echo := newEchoes(t, func(b []byte) (int, error) {
		m, err := stream.Recv()
		return copy(b, m.GetOutput()), err
	})
	return echo.measure(keys, func(s string) {
		if err := stream.Send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Input{Input: []byte(s)}}); err != nil {
			t.Fatalf("send %q: %v", s, err)
		}
	})
}

// echoes collects a terminal's output read by a goroutine.
type echoes struct {
	tb     testing.TB
	chunks chan []byte
	out    []byte
}

func newEchoes(tb testing.TB, read func([]byte) (int, error)) *echoes {
	e := &echoes{tb: tb, chunks: make(chan []byte, 1024)}
	go func() {
		defer close(e.chunks)
		for {
			b := make([]byte, 64<<10)
			n, err := read(b)
			if n > 0 {
				e.chunks <- b[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	return e
}

// wait reads until the output after from holds want; it returns the end of
// want in the output.
func (e *echoes) wait(want string, from int) int {
	e.tb.Helper()
	timeout := time.After(screenTimeout)
	for {
		if i := bytes.Index(e.out[from:], []byte(want)); i >= 0 {
			return from + i + len(want)
		}
		select {
		case b, ok := <-e.chunks:
			if !ok {
				e.tb.Fatalf("the terminal closed while waiting for %q; output %q", want, e.out)
			}
			e.out = append(e.out, b...)
		case <-timeout:
			e.tb.Fatalf("waiting for %q; output %q", want, e.out)
		}
	}
}

// measure types keys letters with write, one at a time, each after the
// previous one's echo, and returns the round trips. The sandbox's terminal
// must echo (cat on a terminal does).
func (e *echoes) measure(keys int, write func(string)) []time.Duration {
	e.tb.Helper()
	n := len(e.out)
	write("w") // warm up, and make sure the terminal echoes
	n = e.wait("w", n)
	lat := make([]time.Duration, 0, keys)
	for i := range keys {
		b := string(rune('a' + i%26))
		t0 := time.Now()
		write(b)
		n = e.wait(b, n)
		lat = append(lat, time.Since(t0))
		if i%64 == 63 {
			// Keep the sandbox's line short: Ctrl-U erases it, echoed as
			// backspaces and spaces, never a letter.
			write("\x15")
			time.Sleep(20 * time.Millisecond)
		}
	}
	return lat
}
