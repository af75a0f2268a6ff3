package terminal

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/agent/users"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Expected strings are computed by the shell ($((6*7))), so the terminal's
// echo of the typed line never matches them.

func TestRingKeepsTheTail(t *testing.T) {
	t.Parallel()
	r := newRing(8)
	var all []byte
	for _, p := range []string{"ab", "cdef", "ghijk", "", "lmnopqrstuvwxyz", "1", "23", "456789"} {
		r.write([]byte(p))
		all = append(all, p...)
		want := all
		if len(want) > 8 {
			want = want[len(want)-8:]
		}
		if got := string(r.bytes()); got != string(want) {
			t.Fatalf("after %q: %q, want %q", p, got, want)
		}
	}
}

func TestEchoAndExitCode(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}})
	sc := watch(t, s.Attach(true))
	typeIn(t, s, "echo hello-$((6*7)); tty; echo term=$TERM\n")
	n := sc.waitFor(t, "hello-42", 0)
	n = sc.waitFor(t, "/dev/pts/", n)
	sc.waitFor(t, "term="+DefaultTerm, n)
	typeIn(t, s, "exit 7\n")
	if err := sc.ended(t); !isEOF(err) {
		t.Fatalf("attachment ended with %v, want EOF", err)
	}
	if e := waitDone(t, s); e.Code != 7 || e.Signal != "" {
		t.Fatalf("exit %+v, want code 7", e)
	}
	in := s.Info()
	if in.Running || in.Exit == nil || in.Exit.Code != 7 || in.ExitedAt.IsZero() {
		t.Fatalf("info after exit: %+v", in)
	}
	if _, err := s.Write([]byte("x")); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("write after exit: %v, want FailedPrecondition", err)
	}

	// A signal that ends the program is reported as such.
	s2 := mustOpen(t, m, Spec{Command: "kill -TERM $$"})
	if e := waitDone(t, s2); e.Code != -1 || e.Signal != "SIGTERM" {
		t.Fatalf("exit %+v, want -1 SIGTERM", e)
	}
}

func TestResizeSeenByStty(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}, Rows: 30, Cols: 100})
	sc := watch(t, s.Attach(true))
	typeIn(t, s, "echo size-$((1+0)) $(stty size)\n")
	n := sc.waitFor(t, "size-1 30 100", 0)
	if err := s.Resize(40, 132); err != nil {
		t.Fatal(err)
	}
	typeIn(t, s, "echo size-$((1+1)) $(stty size)\n")
	sc.waitFor(t, "size-2 40 132", n)
	if in := s.Info(); in.Rows != 40 || in.Cols != 132 {
		t.Errorf("info size %dx%d", in.Rows, in.Cols)
	}
	for _, rc := range [][2]int{{0, 80}, {24, 0}, {MaxSize + 1, 80}, {-1, 80}} {
		if err := s.Resize(rc[0], rc[1]); !errdefs.IsInvalidArgument(err) {
			t.Errorf("resize %v: %v, want InvalidArgument", rc, err)
		}
	}
	if _, err := m.Open(Spec{Argv: []string{"/bin/sh"}, Cols: MaxSize + 1}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "cols") {
		t.Errorf("open with too many columns: %v", err)
	}
}

// TestResizeSendsSIGWINCH: a full-screen program learns the new size.
func TestResizeSendsSIGWINCH(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	s := mustOpen(t, m, Spec{Command: `trap 'echo winch-$((2*21)) $(stty size)' WINCH; echo ready-$((3*3)); while :; do sleep 0.05; done`})
	sc := watch(t, s.Attach(true))
	sc.waitFor(t, "ready-9", 0)
	if err := s.Resize(50, 70); err != nil {
		t.Fatal(err)
	}
	sc.waitFor(t, "winch-42 50 70", 0)
}

func TestCtrlCInterruptsSleep(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}})
	sc := watch(t, s.Attach(true))
	typeIn(t, s, "echo start-$((5*5))\n")
	n := sc.waitFor(t, "start-25", 0)
	typeIn(t, s, "sleep 30\n")
	time.Sleep(300 * time.Millisecond) // sleep is running in the foreground
	t0 := time.Now()
	typeIn(t, s, "\x03")
	typeIn(t, s, "echo status-$?\n")
	n = sc.waitFor(t, "status-130", n) // 128 + SIGINT
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("Ctrl-C took %s", d)
	}
	// Signal (as the gRPC and WebSocket signal messages do) reaches the
	// foreground group the same way.
	typeIn(t, s, "sleep 30\n")
	time.Sleep(300 * time.Millisecond)
	if err := s.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	typeIn(t, s, "echo again-$?\n")
	sc.waitFor(t, "again-130", n)
	if in := s.Info(); !in.Running {
		t.Error("the shell itself should survive Ctrl-C")
	}
}

func TestDetachAndReattachReplaysScrollback(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}})
	a := s.Attach(true)
	sc := watch(t, a)
	typeIn(t, s, "echo first-$((10+1))\n")
	sc.waitFor(t, "first-11", 0)
	a.Detach()
	if err := sc.ended(t); !errors.Is(err, errDetached) {
		t.Fatalf("detached attachment ended with %v", err)
	}
	// Nobody attached: the session runs on and its output is kept.
	typeIn(t, s, "echo second-$((10+2))\n")
	time.Sleep(300 * time.Millisecond)
	if in := s.Info(); !in.Running || in.Clients != 0 {
		t.Fatalf("after detach: %+v", in)
	}
	b, err := m.Attach(s.ID(), true)
	if err != nil {
		t.Fatal(err)
	}
	replay := string(b.Replay())
	if !strings.Contains(replay, "first-11") || !strings.Contains(replay, "second-12") {
		t.Fatalf("replay misses output: %q", replay)
	}
	sc2 := watch(t, b)
	typeIn(t, s, "echo third-$((10+3))\n")
	sc2.waitFor(t, "third-13", len(replay))
	// Without replay only new output arrives.
	c, err := m.Attach(s.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Replay()) != 0 {
		t.Errorf("replay without replay: %q", c.Replay())
	}
	c.Detach()
}

func TestScrollbackIsBounded(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{Scrollback: 1024})
	s := mustOpen(t, m, Spec{Command: "seq 1 5000; echo end-$((7*7))"})
	waitDone(t, s)
	a, err := m.Attach(s.ID(), true)
	if err != nil {
		t.Fatal(err)
	}
	r := string(a.Replay())
	if len(r) != 1024 || !strings.HasSuffix(strings.TrimRight(r, "\r\n"), "end-49") || !strings.Contains(r, "4999\r\n5000\r\n") {
		t.Fatalf("replay of %d bytes: ...%q", len(r), r[max(0, len(r)-60):])
	}
	// An ended session still attaches: the replay, then EOF.
	if _, err := a.Next(context.Background()); !isEOF(err) {
		t.Fatalf("Next on an ended session: %v", err)
	}
}

func TestTwoClientsSeeTheSameOutput(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}})
	a, b := watch(t, s.Attach(true)), watch(t, s.Attach(true))
	if n := s.Info().Clients; n != 2 {
		t.Errorf("clients %d", n)
	}
	typeIn(t, s, "echo both-$((20+2))\n")
	a.waitFor(t, "both-22", 0)
	b.waitFor(t, "both-22", 0)
	typeIn(t, s, "exit\n")
	for _, sc := range []*screen{a, b} {
		if err := sc.ended(t); !isEOF(err) {
			t.Errorf("ended with %v", err)
		}
	}
}

// TestSlowClientIsDisconnected: a client that does not read is dropped once
// it is ClientBuffer behind; the terminal's reader, the session and other
// clients go on.
func TestSlowClientIsDisconnected(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{ClientBuffer: 8 << 10})
	s := mustOpen(t, m, Spec{Command: "read go; seq 1 100000; echo done-$((8*8))"})
	slow := s.Attach(false) // never read until the end
	typeIn(t, s, "go\n")
	// The terminal's reader is not held up: the program finishes and its
	// output ends up in the scrollback.
	waitDone(t, s)
	if r := string(s.Attach(true).Replay()); !strings.Contains(r, "100000\r\ndone-64") {
		t.Errorf("scrollback ends %q", tail(r))
	}
	// The slow client gets what was queued, then ErrSlowClient.
	var got int
	for {
		b, err := slow.Next(context.Background())
		if err != nil {
			if !errors.Is(err, ErrSlowClient) || !errdefs.IsUnavailable(err) {
				t.Fatalf("slow client ended with %v", err)
			}
			break
		}
		got += len(b)
	}
	if got > 8<<10 {
		t.Errorf("slow client had %d bytes queued, more than its buffer", got)
	}
}

func TestSessionLimit(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{MaxSessions: 2})
	var ss []*Session
	for range 2 {
		s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}})
		ss = append(ss, s)
	}
	if _, err := m.Open(Spec{Argv: []string{"/bin/sh"}}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("third session: %v, want ResourceExhausted", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.Kill(ctx, ss[0].ID(), ""); err != nil {
		t.Fatal(err)
	}
	if e, _ := ss[0].Exit(); e.Signal != "SIGHUP" {
		t.Errorf("killed shell: %+v, want SIGHUP", e)
	}
	if _, err := m.Open(Spec{Argv: []string{"/bin/sh"}}); err != nil {
		t.Fatalf("after a kill: %v", err)
	}
	// The ended one is still listed.
	if l := m.List(); len(l) != 3 || l[0].ID != ss[0].ID() || l[0].Running {
		t.Errorf("list: %+v", l)
	}
}

// TestKillAndLeftovers: Kill escalates to SIGKILL for a program that
// ignores SIGHUP; processes left in the session when its program exits are
// killed; a signal-only Kill just signals.
func TestKillAndLeftovers(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{KillGrace: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	s := mustOpen(t, m, Spec{Command: `trap '' HUP; echo ready-$((4*4)); while :; do sleep 0.05; done`})
	sc := watch(t, s.Attach(true))
	sc.waitFor(t, "ready-16", 0)
	if err := m.Kill(ctx, s.ID(), "USR1"); err != nil {
		t.Fatal(err)
	}
	if e := waitDone(t, s); e.Signal != "SIGUSR1" {
		t.Fatalf("after USR1: %+v", e)
	}
	if err := m.Kill(ctx, s.ID(), "TERM"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("signal to an ended session: %v", err)
	}
	if err := m.Kill(ctx, s.ID(), ""); err != nil {
		t.Errorf("kill of an ended session: %v", err)
	}

	s = mustOpen(t, m, Spec{Command: `trap '' HUP; echo ready-$((4*5)); while :; do sleep 0.05; done`})
	sc = watch(t, s.Attach(true))
	sc.waitFor(t, "ready-20", 0)
	t0 := time.Now()
	if err := m.Kill(ctx, s.ID(), ""); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Exit(); e.Signal != "SIGKILL" || time.Since(t0) < 250*time.Millisecond {
		t.Errorf("HUP-ignoring program: %+v after %s, want SIGKILL after the grace", e, time.Since(t0))
	}

	// A background job outlives the shell that started it only until the
	// session ends.
	s = mustOpen(t, m, Spec{Command: `sleep 300 & echo bg=$!; sleep 0.2`})
	sc = watch(t, s.Attach(true))
	waitDone(t, s)
	out := sc.String()
	i := strings.Index(out, "bg=")
	pid, err := strconv.Atoi(strings.Fields(out[i+3:])[0])
	if i < 0 || err != nil {
		t.Fatalf("no pid in %q", out)
	}
	// SIGKILL was sent before the exit was published; a process busy in
	// the kernel (exec under load) dies when it gets back.
	for deadline := time.Now().Add(5 * time.Second); alive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("background sleep %d still alive after its session ended", pid)
		}
	}

	if err := m.Kill(ctx, "t-nope", ""); !errdefs.IsNotFound(err) {
		t.Errorf("unknown session: %v", err)
	}
}

func TestEndedSessionsAreReaped(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{EndedRetention: 200 * time.Millisecond})
	s := mustOpen(t, m, Spec{Command: "true"})
	waitDone(t, s)
	if _, err := m.Get(s.ID()); err != nil {
		t.Fatalf("just ended: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := m.Get(s.ID()); errdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ended session still there after its retention")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCloseEndsSessions(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}})
	sc := watch(t, s.Attach(true))
	m.Close()
	if err := sc.ended(t); !isEOF(err) {
		t.Fatalf("client after Close: %v", err)
	}
	if _, err := m.Open(Spec{Argv: []string{"/bin/sh"}}); !errdefs.IsUnavailable(err) {
		t.Fatalf("open after Close: %v", err)
	}
}

// TestCommandPolicy: the process runner's policy applies (cwd, env, a
// missing program), and without a command the user's login shell runs.
func TestCommandPolicy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bash, err := exec.LookPath("bash")
	if err != nil {
		testenv.SkipOrFail(t, "bash not installed")
	}
	passwd := filepath.Join(dir, "passwd")
	line := "me:x:" + strconv.Itoa(os.Geteuid()) + ":" + strconv.Itoa(os.Getegid()) + "::/:" + bash + "\n"
	if err := os.WriteFile(passwd, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	m := newManager(t, Config{Passwd: passwd})
	s := mustOpen(t, m, Spec{Cwd: dir, Env: map[string]string{"X": "x-value"}, Term: "vt100"})
	if in := s.Info(); len(in.Argv) != 1 || in.Argv[0] != bash || in.Term != "vt100" || in.Cwd != dir {
		t.Errorf("login shell session: %+v", in)
	}
	sc := watch(t, s.Attach(true))
	typeIn(t, s, "echo \"$((1+1))-$PWD-$X-$TERM\"; exit\n")
	sc.waitFor(t, "2-"+dir+"-x-value-vt100", 0)
	waitDone(t, s)

	if _, err := m.Open(Spec{Argv: []string{"no-such-program-xyz"}}); !errdefs.IsFailedPrecondition(err) || errdefs.Reason(err) != process.ReasonCommandNotFound {
		t.Errorf("missing program: %v (reason %q)", err, errdefs.Reason(err))
	}
	// Found and executable, but its interpreter is missing: the start
	// fails as exec's does, with the same reason (so `exec -t` exits 127).
	badInterp := filepath.Join(dir, "bad-interp")
	testenv.WriteExecutable(t, badInterp, []byte("#!/no/such/interpreter\n"))
	if _, err := m.Open(Spec{Argv: []string{badInterp}}); !errdefs.IsFailedPrecondition(err) || errdefs.Reason(err) != process.ReasonCommandNotFound {
		t.Errorf("missing interpreter: %v (reason %q)", err, errdefs.Reason(err))
	}
	if _, err := m.Open(Spec{Argv: []string{"sh"}, Cwd: "relative"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative cwd: %v", err)
	}
	if _, err := m.Open(Spec{Argv: []string{"sh"}, Term: "bad term\n"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad TERM: %v", err)
	}
	if _, err := m.Open(Spec{Argv: []string{"sh"}, Command: "true"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("argv and command: %v", err)
	}
}

// TestSessionUser runs a session as another user, as the agent in a
// sandbox does; it needs root.
func TestSessionUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "running sessions as other users needs root")
	}
	t.Parallel()
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\n"), 0o644)
	os.WriteFile(group, []byte("root:x:0:\nsandbox:x:1000:\n"), 0o644)
	def, err := users.Lookup("sandbox", passwd, group)
	if err != nil {
		t.Fatal(err)
	}
	r := process.NewRunner(process.Config{WorkDir: "/", Users: &users.Resolver{Default: def, Passwd: passwd, Group: group}, Logger: discard()})
	t.Cleanup(r.Close)
	m := newManager(t, Config{Commands: r, Passwd: passwd})
	s := mustOpen(t, m, Spec{})
	if in := s.Info(); in.User != "sandbox" {
		t.Errorf("user %q", in.User)
	}
	sc := watch(t, s.Attach(true))
	typeIn(t, s, "echo id-$(id -u)-$USER; stat -c owner-%u $(tty)\n")
	n := sc.waitFor(t, "id-1000-sandbox", 0)
	sc.waitFor(t, "owner-1000", n)
	typeIn(t, s, "exit\n")
	waitDone(t, s)
}

// TestKillHangsUpUnderNohup runs the kill check in a copy of this test
// binary started under nohup (SIGHUP ignored, which exec passes on): the
// session's shell must still end on SIGHUP, not on the grace's SIGKILL.
func TestKillHangsUpUnderNohup(t *testing.T) {
	if os.Getenv("BERTH_TERMINAL_NOHUP_CHILD") == "1" {
		m := newManager(t, Config{KillGrace: time.Minute})
		s := mustOpen(t, m, Spec{Argv: []string{"/bin/sh"}})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.Kill(ctx, s.ID(), ""); err != nil {
			t.Fatal(err)
		}
		if e, _ := s.Exit(); e.Signal != "SIGHUP" {
			t.Fatalf("killed shell: %+v, want SIGHUP", e)
		}
		return
	}
	nohup, err := exec.LookPath("nohup")
	if err != nil {
		t.Skip("no nohup")
	}
	cmd := exec.Command(nohup, os.Args[0], "-test.run=^TestKillHangsUpUnderNohup$", "-test.count=1")
	cmd.Env = append(os.Environ(), "BERTH_TERMINAL_NOHUP_CHILD=1")
	cmd.Dir = t.TempDir() // nohup.out, if any, lands here
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("under nohup: %v\n%s", err, out)
	}
}
