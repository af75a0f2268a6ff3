package process

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestExecExitCodes(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		name   string
		spec   Spec
		code   int
		signal string
	}{
		{"true", Spec{Argv: []string{"true"}}, 0, ""},
		{"false", Spec{Argv: []string{"/bin/false"}}, 1, ""},
		{"exit 3", Spec{Command: "exit 3"}, 3, ""},
		{"killed", Spec{Command: "kill -KILL $$"}, -1, "SIGKILL"},
		{"shell not found", Spec{Command: "no-such-program-xyz"}, 127, ""},
	} {
		res, err := r.Exec(ctx, tc.spec)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if res.ExitCode != tc.code || res.Signal != tc.signal || res.TimedOut {
			t.Errorf("%s: exit %d signal %q timedOut %v, want %d %q", tc.name, res.ExitCode, res.Signal, res.TimedOut, tc.code, tc.signal)
		}
		if res.Pid <= 0 || res.Duration <= 0 {
			t.Errorf("%s: pid %d duration %v", tc.name, res.Pid, res.Duration)
		}
	}
}

func TestExecStreamsStdinEnvCwd(t *testing.T) {
	t.Parallel()
	work := t.TempDir()
	r := newRunner(t, Config{WorkDir: work})
	ctx := ctxTimeout(t, 30*time.Second)

	res, err := r.Exec(ctx, Spec{Command: "echo out; echo err >&2; echo more"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "out\nmore\n" || string(res.Stderr) != "err\n" || res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}

	res, err = r.Exec(ctx, Spec{Argv: []string{"cat"}, Stdin: []byte("hello\x00world")})
	if err != nil || string(res.Stdout) != "hello\x00world" {
		t.Errorf("cat: %q %v", res.Stdout, err)
	}
	res, err = r.Exec(ctx, Spec{Argv: []string{"cat"}}) // no stdin: /dev/null
	if err != nil || len(res.Stdout) != 0 || res.ExitCode != 0 {
		t.Errorf("cat without stdin: %q %v", res.Stdout, err)
	}

	// The base environment is inherited.
	r = newRunner(t, Config{WorkDir: work, Environ: func() ([]string, error) { return append(os.Environ(), "BERTH_TEST_BASE=base"), nil }})
	res, err = r.Exec(ctx, Spec{Command: `echo "$BERTH_TEST_BASE $HOME_X $PATH_SET"`, Env: map[string]string{"HOME_X": "x", "PATH_SET": "y"}})
	if err != nil || string(res.Stdout) != "base x y\n" {
		t.Errorf("env: %q %v", res.Stdout, err)
	}
	res, err = r.Exec(ctx, Spec{Command: `echo "$BERTH_TEST_BASE"`, Env: map[string]string{"BERTH_TEST_BASE": "over"}})
	if err != nil || string(res.Stdout) != "over\n" {
		t.Errorf("env override: %q %v", res.Stdout, err)
	}

	res, err = r.Exec(ctx, Spec{Argv: []string{"pwd"}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != work {
		t.Errorf("default cwd: %q %v, want %s", res.Stdout, err, work)
	}
	res, err = r.Exec(ctx, Spec{Argv: []string{"pwd"}, Cwd: "/tmp"})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "/tmp" {
		t.Errorf("cwd: %q %v", res.Stdout, err)
	}

	// A relative program with a slash is relative to cwd; PATH from Env is
	// used for the lookup.
	bin := filepath.Join(work, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.WriteExecutable(t, filepath.Join(bin, "berth-hello"), []byte("#!/bin/sh\necho hi \"$@\"\n"))
	res, err = r.Exec(ctx, Spec{Argv: []string{"berth-hello", "a b"}, Env: map[string]string{"PATH": bin + ":/usr/bin:/bin"}})
	if err != nil || string(res.Stdout) != "hi a b\n" {
		t.Errorf("PATH lookup: %q %v", res.Stdout, err)
	}
	res, err = r.Exec(ctx, Spec{Argv: []string{"./bin/berth-hello"}})
	if err != nil || string(res.Stdout) != "hi\n" {
		t.Errorf("relative program: %q %v", res.Stdout, err)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	start := time.Now()
	res, err := r.Exec(ctx, Spec{Command: "echo before; sleep 100 & sleep 100", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < time.Second || el > 5*time.Second {
		t.Errorf("took %v", el)
	}
	if !res.TimedOut || res.ExitCode != -1 || res.Signal != "SIGTERM" {
		t.Errorf("result %+v", res.ExitStatus)
	}
	if string(res.Stdout) != "before\n" {
		t.Errorf("partial output %q", res.Stdout)
	}
	requireGroupGone(t, res.Pid)
}

func TestExecTimeoutEscalatesToKill(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{DefaultTimeout: 300 * time.Millisecond})
	ctx := ctxTimeout(t, 30*time.Second)
	start := time.Now()
	// Everything in the group ignores SIGTERM.
	res, err := r.Exec(ctx, Spec{Command: `trap "" TERM; sleep 100 & sleep 100`, KillGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 600*time.Millisecond || el > 5*time.Second {
		t.Errorf("took %v", el)
	}
	if !res.TimedOut || res.Signal != "SIGKILL" {
		t.Errorf("result %+v", res.ExitStatus)
	}
	requireGroupGone(t, res.Pid)
}

func TestExecLeaderExitKillsStrays(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	start := time.Now()
	// The background sleep keeps stdout open; it is killed when sh exits.
	res, err := r.Exec(ctx, Spec{Command: "sleep 100 & echo done"})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %v", el)
	}
	if res.ExitCode != 0 || string(res.Stdout) != "done\n" || res.TimedOut {
		t.Errorf("result %+v %q", res.ExitStatus, res.Stdout)
	}
	requireGroupGone(t, res.Pid)
}

func TestExecEscapedProcessDoesNotHang(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	start := time.Now()
	// setsid leaves the group; the escaped sleep holds stdout open.
	res, err := r.Exec(ctx, Spec{Command: "setsid sleep 30 & echo $!"})
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); err == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	} else {
		t.Errorf("stdout %q", res.Stdout)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("took %v", el)
	}
}

func TestExecCancelReturnsPartialOutput(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	res, err := r.Exec(ctx, Spec{Command: "echo partial; echo e >&2; sleep 100 & sleep 100"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("took %v", el)
	}
	if string(res.Stdout) != "partial\n" || string(res.Stderr) != "e\n" || res.TimedOut || res.ExitCode != -1 {
		t.Errorf("result %+v %q %q", res.ExitStatus, res.Stdout, res.Stderr)
	}
	requireGroupGone(t, res.Pid)

	if _, err := r.Exec(ctx, Spec{Argv: []string{"true"}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Exec with a done ctx: %v", err)
	}
}

func TestExecTruncation(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	res, err := r.Exec(ctx, Spec{
		Command:     `printf HEAD; head -c 100000 /dev/zero | tr '\0' x; printf TAIL; printf short >&2`,
		OutputLimit: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	total := int64(4 + 100000 + 4)
	if !res.StdoutTruncated || res.StdoutDropped != total-1000 {
		t.Errorf("truncated %v dropped %d, want %d", res.StdoutTruncated, res.StdoutDropped, total-1000)
	}
	marker := TruncationMarker(total - 1000)
	want := "HEAD" + strings.Repeat("x", 496) + marker + strings.Repeat("x", 496) + "TAIL"
	if string(res.Stdout) != want {
		t.Errorf("stdout = %q...%q (len %d), want len %d", res.Stdout[:20], res.Stdout[len(res.Stdout)-20:], len(res.Stdout), len(want))
	}
	if !strings.Contains(string(res.Stdout), "[berth: 99008 bytes truncated]") {
		t.Errorf("marker missing")
	}
	if res.StderrTruncated || string(res.Stderr) != "short" {
		t.Errorf("stderr %q", res.Stderr)
	}
}

func TestExecMemoryBounded(t *testing.T) { // not parallel: measures allocations
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	const size = 64 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := r.Exec(ctx, Spec{Argv: []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}, OutputLimit: 64 << 10})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if res.StdoutDropped != size-64<<10 || len(res.Stdout) != 64<<10+len(TruncationMarker(res.StdoutDropped)) {
		t.Errorf("dropped %d len %d", res.StdoutDropped, len(res.Stdout))
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("allocated %d bytes for %d bytes of output", alloc, size)
	}
}

func TestStreamOrderAndPromptness(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	c := newCollector()
	res, err := r.Stream(ctx, Spec{Command: "echo a; echo e >&2; sleep 1; echo b"}, c.emit)
	if err != nil {
		t.Fatal(err)
	}
	evs := c.snapshot()
	if len(evs) < 5 || evs[0].Kind != EventStarted || evs[0].Pid != res.Pid || evs[len(evs)-1].Kind != EventExited {
		t.Fatalf("events %v", evs)
	}
	if ex := evs[len(evs)-1].Exit; ex.ExitCode != 0 || ex.Duration < 900*time.Millisecond {
		t.Errorf("exit %+v", ex)
	}
	if res.Stdout != nil || res.ExitCode != 0 {
		t.Errorf("result %+v", res)
	}
	if out, errOut := joinOutput(evs, EventStdout), joinOutput(evs, EventStderr); out != "a\nb\n" || errOut != "e\n" {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
	// "a" was delivered as soon as it was written, well before "b".
	var tA, tB time.Time
	c.mu.Lock()
	for i, ev := range c.events {
		if ev.Kind == EventStdout && bytes.HasPrefix(ev.Data, []byte("a")) {
			tA = c.at[i]
		}
		if ev.Kind == EventStdout && bytes.Contains(ev.Data, []byte("b")) {
			tB = c.at[i]
		}
	}
	tStart := c.at[0]
	c.mu.Unlock()
	if tA.IsZero() || tB.IsZero() || tA.Sub(tStart) > 500*time.Millisecond || tB.Sub(tA) < 800*time.Millisecond {
		t.Errorf("a at %v, b at %v after start", tA.Sub(tStart), tB.Sub(tStart))
	}
}

func TestStreamEmitErrorKillsGroup(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	errGone := errors.New("client gone")
	start := time.Now()
	var pid int
	res, err := r.Stream(ctx, Spec{Command: "echo x; sleep 100 & sleep 100"}, func(ev Event) error {
		if ev.Kind == EventStarted {
			pid = ev.Pid
			return nil
		}
		return errGone
	})
	if !errors.Is(err, errGone) {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("took %v", el)
	}
	if res.Pid != pid || res.ExitCode != -1 {
		t.Errorf("result %+v", res)
	}
	requireGroupGone(t, pid)
}

func TestStreamLargeOutputNotTruncated(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	var n int64
	var maxChunk int
	_, err := r.Stream(ctx, Spec{Argv: []string{"head", "-c", "3000000", "/dev/zero"}, OutputLimit: 10}, func(ev Event) error {
		if ev.Kind == EventStdout {
			n += int64(len(ev.Data))
			maxChunk = max(maxChunk, len(ev.Data))
		}
		return nil
	})
	if err != nil || n != 3000000 || maxChunk > readBufSize {
		t.Errorf("streamed %d bytes, max chunk %d, err %v", n, maxChunk, err)
	}
}

func TestBackgroundReplayAfterExit(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	in, err := r.Start(ctx, Spec{Command: "echo one; sleep 0.1; echo two >&2; sleep 0.1; echo three; exit 4", Cwd: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(in.ID, "p-") || in.Pid <= 0 || in.State != StateRunning || in.Cwd != "/tmp" || in.Command == "" || in.StartedAt.IsZero() {
		t.Errorf("info %+v", in)
	}
	ex := waitExited(t, r, in.ID)
	if ex.Exit == nil || ex.Exit.ExitCode != 4 || ex.ExitedAt.Before(ex.StartedAt) || !ex.StdinClosed {
		t.Errorf("exited info %+v", ex)
	}
	for _, follow := range []bool{false, true} {
		c := newCollector()
		if err := r.Logs(ctx, in.ID, follow, c.emit); err != nil {
			t.Fatal(err)
		}
		evs := c.snapshot()
		if evs[0].Kind != EventStarted || evs[0].ProcessID != in.ID || evs[0].Pid != in.Pid {
			t.Errorf("first event %+v", evs[0])
		}
		if last := evs[len(evs)-1]; last.Kind != EventExited || last.Exit.ExitCode != 4 {
			t.Errorf("last event %+v", last)
		}
		if out, errOut := c.output(EventStdout), c.output(EventStderr); out != "one\nthree\n" || errOut != "two\n" {
			t.Errorf("stdout %q stderr %q", out, errOut)
		}
		// Stream kinds keep their order.
		var kinds []EventKind
		for _, ev := range evs[1 : len(evs)-1] {
			kinds = append(kinds, ev.Kind)
		}
		if len(kinds) != 3 || kinds[0] != EventStdout || kinds[1] != EventStderr || kinds[2] != EventStdout {
			t.Errorf("kinds %v", kinds)
		}
	}
}

func TestBackgroundStdinFollowAndReattach(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	in, err := r.Start(ctx, Spec{Argv: []string{"cat"}, Stdin: []byte("first\n")})
	if err != nil {
		t.Fatal(err)
	}
	follower := newCollector()
	followDone := make(chan error, 1)
	go func() { followDone <- r.Logs(ctx, in.ID, true, follower.emit) }()
	follower.waitFor(t, "first", func(evs []Event) bool { return joinOutput(evs, EventStdout) == "first\n" })

	n, err := r.WriteStdin(ctx, in.ID, []byte("second\n"), false)
	if err != nil || n != 7 {
		t.Fatalf("WriteStdin: %d %v", n, err)
	}
	follower.waitFor(t, "second", func(evs []Event) bool { return joinOutput(evs, EventStdout) == "first\nsecond\n" })

	// Re-attach while running: replay without follow.
	replay := newCollector()
	if err := r.Logs(ctx, in.ID, false, replay.emit); err != nil {
		t.Fatal(err)
	}
	if got := replay.output(EventStdout); got != "first\nsecond\n" {
		t.Errorf("replay %q", got)
	}
	if evs := replay.snapshot(); evs[len(evs)-1].Kind == EventExited {
		t.Errorf("replay of a running process ends with Exited")
	}
	// A second follower while running, cancelled by its ctx.
	fctx, fcancel := context.WithCancel(ctx)
	second := newCollector()
	secondDone := make(chan error, 1)
	go func() { secondDone <- r.Logs(fctx, in.ID, true, second.emit) }()
	second.waitFor(t, "replay", func(evs []Event) bool { return joinOutput(evs, EventStdout) == "first\nsecond\n" })
	fcancel()
	if err := <-secondDone; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled follower: %v", err)
	}

	if _, err := r.WriteStdin(ctx, in.ID, []byte("last\n"), true); err != nil {
		t.Fatal(err)
	}
	if err := <-followDone; err != nil {
		t.Fatal(err)
	}
	evs := follower.snapshot()
	if last := evs[len(evs)-1]; last.Kind != EventExited || last.Exit.ExitCode != 0 {
		t.Errorf("last event %+v", last)
	}
	if got := follower.output(EventStdout); got != "first\nsecond\nlast\n" {
		t.Errorf("followed %q", got)
	}
	info := waitExited(t, r, in.ID)
	if !info.StdinClosed {
		t.Errorf("info %+v", info)
	}
	_, err = r.WriteStdin(ctx, in.ID, []byte("x"), false)
	wantCategory(t, err, errdefs.ErrFailedPrecondition, in.ID)
	requireGroupGone(t, in.Pid)
}

func TestWriteStdinClosedAndBlocked(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	in, err := r.Start(ctx, Spec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	// sleep never reads: a large write blocks until its ctx ends.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	n, err := r.WriteStdin(wctx, in.ID, make([]byte, 1<<20), false)
	if !errors.Is(err, context.DeadlineExceeded) || n >= 1<<20 {
		t.Errorf("blocked write: %d %v", n, err)
	}
	if _, err := r.WriteStdin(ctx, in.ID, nil, true); err != nil {
		t.Fatal(err)
	}
	_, err = r.WriteStdin(ctx, in.ID, []byte("x"), false)
	wantCategory(t, err, errdefs.ErrFailedPrecondition, "closed")
	_, err = r.WriteStdin(ctx, in.ID, make([]byte, validate.MaxStdin+1), false)
	wantCategory(t, err, errdefs.ErrInvalidArgument, "data")
	if err := r.Signal(in.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	waitExited(t, r, in.ID)

	// An initial stdin that is not read holds up later writes, not the caller.
	in, err = r.Start(ctx, Spec{Argv: []string{"sleep", "100"}, Stdin: make([]byte, 1<<20)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if n, err := r.WriteStdin(wctx, in.ID, []byte("x"), false); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("write behind a blocked initial stdin: %d %v", n, err)
	}
	if err := r.Signal(in.ID, ""); err != nil {
		t.Fatal(err)
	}
	if in := waitExited(t, r, in.ID); in.Exit.Signal != "SIGTERM" {
		t.Errorf("default signal: %+v", in.Exit)
	}

	// Exec with stdin the command does not read does not hang.
	res, err := r.Exec(ctx, Spec{Argv: []string{"true"}, Stdin: make([]byte, 1<<20)})
	if err != nil || res.ExitCode != 0 {
		t.Errorf("unread stdin: %+v %v", res, err)
	}
}

func TestBackgroundReplayGap(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{ReplayBuffer: 1000})
	ctx := ctxTimeout(t, 30*time.Second)
	in, err := r.Start(ctx, Spec{Command: `head -c 5000 /dev/zero; printf END`})
	if err != nil {
		t.Fatal(err)
	}
	waitExited(t, r, in.ID)
	c := newCollector()
	if err := r.Logs(ctx, in.ID, false, c.emit); err != nil {
		t.Fatal(err)
	}
	evs := c.snapshot()
	if evs[1].Kind != EventGap || evs[1].Dropped != 4003 {
		t.Errorf("second event %+v", evs[1])
	}
	if out := c.output(EventStdout); len(out) != 1000 || !strings.HasSuffix(out, "END") {
		t.Errorf("replayed %d bytes", len(out))
	}
}

func TestBackgroundTimeoutAndSignal(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{DefaultTimeout: time.Millisecond}) // not for background processes
	ctx := ctxTimeout(t, 30*time.Second)

	timed, err := r.Start(ctx, Spec{Command: "sleep 100 & sleep 100", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sig, err := r.Start(ctx, Spec{Command: "sleep 100 & sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	in := waitExited(t, r, timed.ID)
	if !in.Exit.TimedOut || in.Exit.Signal != "SIGTERM" {
		t.Errorf("timed out: %+v", in.Exit)
	}
	requireGroupGone(t, timed.Pid)

	time.Sleep(50 * time.Millisecond)
	if in, _ := r.Get(sig.ID); in.State != StateRunning {
		t.Fatalf("default timeout applied to a background process: %+v", in)
	}
	wantCategory(t, r.Signal(sig.ID, "SIGNOPE"), errdefs.ErrInvalidArgument, "signal")
	if err := r.Signal(sig.ID, "usr1"); err != nil {
		t.Fatal(err)
	}
	in = waitExited(t, r, sig.ID)
	if in.Exit.Signal != "SIGUSR1" || in.Exit.ExitCode != -1 || in.Exit.TimedOut {
		t.Errorf("signalled: %+v", in.Exit)
	}
	requireGroupGone(t, sig.Pid)
	wantCategory(t, r.Signal(sig.ID, "TERM"), errdefs.ErrFailedPrecondition, sig.ID)
	wantCategory(t, r.Signal("p-nope", "TERM"), errdefs.ErrNotFound, "p-nope")
}

func TestParseSignal(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]syscall.Signal{
		"": syscall.SIGTERM, "TERM": syscall.SIGTERM, "SIGTERM": syscall.SIGTERM, "sigkill": syscall.SIGKILL,
		"9": syscall.SIGKILL, "Hup": syscall.SIGHUP, "34": syscall.Signal(34),
	} {
		if got, err := ParseSignal(in); err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"0", "65", "-1", "FOO", "SIG"} {
		_, err := ParseSignal(in)
		wantCategory(t, err, errdefs.ErrInvalidArgument, "signal")
	}
	if SignalName(syscall.SIGKILL) != "SIGKILL" || SignalName(syscall.Signal(40)) != "SIG40" {
		t.Errorf("SignalName")
	}
}

func TestListGetRetention(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{ExitedRetention: 300 * time.Millisecond, MaxRetained: 2})
	ctx := ctxTimeout(t, 30*time.Second)
	var ids []string
	for i := range 3 {
		in, err := r.Start(ctx, Spec{Argv: []string{"sh", "-c", "exit " + strconv.Itoa(i)}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.ID)
		waitExited(t, r, in.ID)
	}
	running, err := r.Start(ctx, Spec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	// MaxRetained 2: the oldest exited process was forgotten.
	list := r.List()
	if len(list) != 3 || list[0].ID != ids[1] || list[1].ID != ids[2] || list[2].ID != running.ID || list[2].State != StateRunning {
		t.Fatalf("list %+v", list)
	}
	if list[1].Exit == nil || list[1].Exit.ExitCode != 2 {
		t.Errorf("exit %+v", list[1].Exit)
	}
	_, err = r.Get(ids[0])
	wantCategory(t, err, errdefs.ErrNotFound, ids[0])
	_, err = r.Get("")
	wantCategory(t, err, errdefs.ErrInvalidArgument, "id")
	err = r.Logs(ctx, ids[0], false, func(Event) error { return nil })
	wantCategory(t, err, errdefs.ErrNotFound, ids[0])

	// After ExitedRetention the exited ones are gone; the running one stays.
	deadline := time.Now().Add(5 * time.Second)
	for len(r.List()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("list %+v", r.List())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.Signal(running.ID, "9"); err != nil {
		t.Fatal(err)
	}
	waitExited(t, r, running.ID)
}

func TestResourceExhausted(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{MaxProcesses: 2})
	ctx := ctxTimeout(t, 30*time.Second)
	a, err := r.Start(ctx, Spec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	streamStarted := make(chan struct{})
	streamDone := make(chan error, 1)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go func() {
		_, err := r.Stream(sctx, Spec{Argv: []string{"sleep", "100"}}, func(ev Event) error {
			if ev.Kind == EventStarted {
				close(streamStarted)
			}
			return nil
		})
		streamDone <- err
	}()
	<-streamStarted

	_, err = r.Exec(ctx, Spec{Argv: []string{"true"}})
	wantCategory(t, err, errdefs.ErrResourceExhausted, "limit is 2")
	_, err = r.Start(ctx, Spec{Argv: []string{"true"}})
	wantCategory(t, err, errdefs.ErrResourceExhausted, "")
	_, err = r.Stream(ctx, Spec{Argv: []string{"true"}}, func(Event) error { return nil })
	wantCategory(t, err, errdefs.ErrResourceExhausted, "")

	scancel()
	if err := <-streamDone; !errors.Is(err, context.Canceled) {
		t.Errorf("stream: %v", err)
	}
	if res, err := r.Exec(ctx, Spec{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("after a slot was freed: %v", err)
	}
	if err := r.Signal(a.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	waitExited(t, r, a.ID)
}

func TestValidation(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		spec     Spec
		sentinel error
		field    string
	}{
		{Spec{}, errdefs.ErrInvalidArgument, "argv"},
		{Spec{Argv: []string{"true"}, Command: "true"}, errdefs.ErrInvalidArgument, "argv"},
		{Spec{Argv: []string{""}}, errdefs.ErrInvalidArgument, "argv[0]"},
		{Spec{Argv: []string{"echo", "a\x00b"}}, errdefs.ErrInvalidArgument, "argv[1]"},
		{Spec{Command: "  "}, errdefs.ErrInvalidArgument, "command"},
		{Spec{Argv: []string{"true"}, Cwd: "relative"}, errdefs.ErrInvalidArgument, "cwd"},
		{Spec{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}}, errdefs.ErrInvalidArgument, "env"},
		{Spec{Argv: []string{"true"}, Stdin: make([]byte, validate.MaxStdin+1)}, errdefs.ErrInvalidArgument, "stdin"},
		{Spec{Argv: []string{"true"}, Timeout: -time.Second}, errdefs.ErrInvalidArgument, "timeout"},
		{Spec{Argv: []string{"true"}, KillGrace: -1}, errdefs.ErrInvalidArgument, "kill_grace"},
		{Spec{Argv: []string{"true"}, OutputLimit: -1}, errdefs.ErrInvalidArgument, "output_limit"},
		{Spec{Argv: []string{"no-such-program-xyz"}}, errdefs.ErrFailedPrecondition, "argv[0]"},
		{Spec{Argv: []string{"/no/such/program"}}, errdefs.ErrFailedPrecondition, "argv[0]"},
		{Spec{Argv: []string{"/etc/hostname"}}, errdefs.ErrFailedPrecondition, "argv[0]"},
		{Spec{Argv: []string{"/tmp"}}, errdefs.ErrFailedPrecondition, "argv[0]"},
		{Spec{Argv: []string{"true"}, Cwd: "/no/such/dir"}, errdefs.ErrFailedPrecondition, "cwd"},
		{Spec{Argv: []string{"true"}, Cwd: "/etc/hostname"}, errdefs.ErrFailedPrecondition, "cwd"},
	} {
		_, err := r.Exec(ctx, tc.spec)
		wantCategory(t, err, tc.sentinel, tc.field)
		_, err = r.Start(ctx, tc.spec)
		wantCategory(t, err, tc.sentinel, tc.field)
		_, err = r.Stream(ctx, tc.spec, func(Event) error { t.Error("emit called"); return nil })
		wantCategory(t, err, tc.sentinel, tc.field)
	}
	noShell := newRunner(t, Config{Shell: "/no/such/sh"})
	_, err := noShell.Exec(ctx, Spec{Command: "true"})
	wantCategory(t, err, errdefs.ErrFailedPrecondition, "command")
	if len(r.List()) != 0 {
		t.Errorf("failed starts are listed: %+v", r.List())
	}
}

// A command that cannot start says why, for clients that exit as a shell
// does: 127 for a missing program, 126 for one that cannot be executed.
func TestStartFailureReasons(t *testing.T) {
	t.Parallel()
	r := newRunner(t, Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noExec := write("no-exec.sh", "#!/bin/sh\necho hi\n", 0o644)
	badFormat := write("bad-format", "\x00\x01\x02 not a program\n", 0o755)
	badInterp := write("bad-interp.sh", "#!/no/such/interpreter\n", 0o755)
	for _, tc := range []struct {
		spec   Spec
		reason string
	}{
		{Spec{Argv: []string{"no-such-program-xyz"}}, ReasonCommandNotFound},
		{Spec{Argv: []string{"/no/such/program"}}, ReasonCommandNotFound},
		{Spec{Argv: []string{"./missing"}, Cwd: dir}, ReasonCommandNotFound},
		{Spec{Argv: []string{"no-such-program-xyz"}, Env: map[string]string{"PATH": dir}}, ReasonCommandNotFound},
		{Spec{Argv: []string{badInterp}}, ReasonCommandNotFound}, // as bash: ENOENT from execve
		{Spec{Argv: []string{noExec}}, ReasonCommandNotExecutable},
		{Spec{Argv: []string{"no-exec.sh"}, Env: map[string]string{"PATH": dir}}, ReasonCommandNotExecutable},
		{Spec{Argv: []string{"/tmp"}}, ReasonCommandNotExecutable},
		{Spec{Argv: []string{noExec + "/x"}}, ReasonCommandNotExecutable}, // ENOTDIR
		{Spec{Argv: []string{badFormat}}, ReasonCommandNotExecutable},     // ENOEXEC
	} {
		for name, run := range map[string]func() error{
			"Exec":   func() error { _, err := r.Exec(ctx, tc.spec); return err },
			"Stream": func() error { _, err := r.Stream(ctx, tc.spec, func(Event) error { return nil }); return err },
			"Start":  func() error { _, err := r.Start(ctx, tc.spec); return err },
		} {
			err := run()
			if got := errdefs.Reason(err); got != tc.reason || !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%s %v: reason %q (%v), want %s", name, tc.spec.Argv, got, err, tc.reason)
			}
		}
	}
	noShell := newRunner(t, Config{Shell: "/no/such/sh"})
	if _, err := noShell.Exec(ctx, Spec{Command: "true"}); errdefs.Reason(err) != ReasonCommandNotFound {
		t.Errorf("missing shell: %v (reason %q)", err, errdefs.Reason(err))
	}
	if _, err := r.Exec(ctx, Spec{Argv: []string{"true"}, Cwd: "/no/such/dir"}); errdefs.Reason(err) != "" {
		t.Errorf("a missing cwd has reason %q", errdefs.Reason(err))
	}
}

func TestCloseKillsEverything(t *testing.T) {
	t.Parallel()
	r := NewRunner(Config{})
	ctx := ctxTimeout(t, 30*time.Second)
	bg, err := r.Start(ctx, Spec{Command: "sleep 100 & sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	execDone := make(chan Result, 1)
	go func() {
		res, _ := r.Exec(ctx, Spec{Command: "sleep 100 & sleep 100"})
		execDone <- res
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		n := r.running
		r.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commands running", n)
		}
	}
	start := time.Now()
	r.Close()
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("Close took %v", el)
	}
	res := <-execDone
	requireGroupGone(t, bg.Pid)
	requireGroupGone(t, res.Pid)
	_, err = r.Exec(ctx, Spec{Argv: []string{"true"}})
	wantCategory(t, err, errdefs.ErrUnavailable, "")
	r.Close()
}
