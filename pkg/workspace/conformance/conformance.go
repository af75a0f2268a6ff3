// Package conformance is the test suite every workspace.Workspace
// implementation passes, so that an agent loop behaves the same whichever it
// is given. Call Run from a test with a function that returns a fresh
// workspace:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t *testing.T) workspace.Workspace {
//			ws, err := workspace.NewLocal(t.TempDir())
//			if err != nil {
//				t.Fatal(err)
//			}
//			return ws
//		})
//	}
//
// Every subtest gets its own workspace, which it may fill with files, and
// closes it at its end (a Close that the factory registers too is harmless:
// Close is idempotent). The workspace's Root must be an empty (or at least
// uncluttered) directory: the suite creates files and a git repository in
// it. The git subtest is skipped when the workspace has no git binary.
//
// The suite needs /bin/sh and the usual POSIX tools (cat, head, tr, sleep,
// pwd, printf, touch, mkdir, mv, rm, chmod) in the workspace. The Watch
// subtests expect the events of a watch within 10 s, and leave and cancel
// more watches in a row than a sandbox runs at once (16).
package conformance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/workspace"
)

// Factory returns a fresh workspace for one subtest.
type Factory func(t *testing.T) workspace.Workspace

// Run runs the whole suite against the workspaces newWorkspace returns.
func Run(t *testing.T, newWorkspace Factory) {
	tests := []testCase{
		{"Root", testRoot},
		{"ExecExitCodesAndStreams", testExecExit},
		{"ExecSignal", testExecSignal},
		{"ExecStdin", testExecStdin},
		{"ExecTimeoutKillsGroup", testExecTimeout},
		{"ExecContextCancel", testExecContextCancel},
		{"ExecCwdEnv", testExecCwdEnv},
		{"ExecBoundedOutput", testExecBoundedOutput},
		{"ExecStreamOrder", testExecStreamOrder},
		{"ExecStreamCallbackErrorStops", testExecStreamCallbackError},
		{"UploadDownloadRoundTrip", testRoundTrip},
		{"UploadReplaces", testUploadReplaces},
		{"UploadMissingDir", testUploadMissingDir},
		{"UploadFailedSourceLeavesNothing", testUploadFailedSource},
		{"RelativePaths", testRelativePaths},
		{"StatList", testStatList},
		{"Git", testGit},
		{"ErrorCategories", testErrors},
		{"Close", testClose},
	}
	runCases(t, newWorkspace, append(append(append(tests, archiveCases...), watchCases...), pauseCases...))
}

// testCase is one subtest of the suite.
type testCase struct {
	name string
	fn   func(t *testing.T, ws workspace.Workspace)
}

// runCases runs each case on a fresh workspace.
func runCases(t *testing.T, newWorkspace Factory, cases []testCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := newWorkspace(t)
			t.Cleanup(func() { _ = ws.Close() })
			tc.fn(t, ws)
		})
	}
}

// ctxFor returns a context bounded for one subtest.
func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustExec(t *testing.T, ws workspace.Workspace, cmd workspace.Command) workspace.Result {
	t.Helper()
	res, err := ws.Exec(ctxFor(t), cmd)
	if err != nil {
		t.Fatalf("Exec(%q%q): %v", cmd.Argv, cmd.Shell, err)
	}
	return res
}

// sh runs a shell line that must succeed and returns its stdout.
func sh(t *testing.T, ws workspace.Workspace, line string) string {
	t.Helper()
	res := mustExec(t, ws, workspace.Command{Shell: line})
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d, stdout %q, stderr %q", line, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func upload(t *testing.T, ws workspace.Workspace, dst, content string) {
	t.Helper()
	if err := ws.Upload(ctxFor(t), strings.NewReader(content), dst); err != nil {
		t.Fatalf("Upload(%s): %v", dst, err)
	}
}

func download(t *testing.T, ws workspace.Workspace, src string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := ws.Download(ctxFor(t), src, &buf); err != nil {
		t.Fatalf("Download(%s): %v", src, err)
	}
	return buf.Bytes()
}

func wantCategory(t *testing.T, what string, err, category error) {
	t.Helper()
	if !errors.Is(err, category) {
		t.Fatalf("%s: error %v, want category %q", what, err, category)
	}
}

func testRoot(t *testing.T, ws workspace.Workspace) {
	root := ws.Root()
	if !path.IsAbs(root) || path.Clean(root) != root {
		t.Fatalf("Root() = %q, want an absolute clean path", root)
	}
	fi, err := ws.Stat(ctxFor(t), root)
	if err != nil {
		t.Fatalf("Stat(Root): %v", err)
	}
	if fi.Type != workspace.TypeDir || !fi.IsDir() || fi.Path != root {
		t.Fatalf("Stat(Root) = %+v, want the directory %s", fi, root)
	}
	if fi2, err := ws.Stat(ctxFor(t), ""); err != nil || fi2.Path != root {
		t.Fatalf("Stat(\"\") = %+v, %v; want Root", fi2, err)
	}
	if got := strings.TrimSpace(sh(t, ws, "pwd -P")); got != strings.TrimSpace(sh(t, ws, "cd "+shellQuote(root)+" && pwd -P")) {
		t.Fatalf("default cwd is %q, want Root %q", got, root)
	}
}

func testExecExit(t *testing.T, ws workspace.Workspace) {
	res := mustExec(t, ws, workspace.Command{Shell: "echo out; echo err >&2; exit 3"})
	if res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" || res.Signal != "" || res.TimedOut {
		t.Fatalf("result %+v, want exit 3, stdout \"out\\n\", stderr \"err\\n\"", res)
	}
	if res.Duration <= 0 || res.Pid <= 0 {
		t.Fatalf("result %+v: want a positive duration and pid", res)
	}
	res = mustExec(t, ws, workspace.Command{Argv: []string{"sh", "-c", "printf '%s|%s' \"$0\" \"$1\"", "a b", "c"}})
	if res.ExitCode != 0 || res.Stdout != "a b|c" {
		t.Fatalf("argv: result %+v, want exit 0 and stdout \"a b|c\"", res)
	}
	if res := mustExec(t, ws, workspace.Command{Argv: []string{"false"}}); res.ExitCode != 1 {
		t.Fatalf("false: exit %d, want 1", res.ExitCode)
	}
	if res := mustExec(t, ws, workspace.Command{Shell: "exit 255"}); res.ExitCode != 255 {
		t.Fatalf("exit 255: exit %d", res.ExitCode)
	}
}

func testExecSignal(t *testing.T, ws workspace.Workspace) {
	res := mustExec(t, ws, workspace.Command{Shell: "echo before; kill -KILL $$"})
	if res.ExitCode != -1 || res.Signal != "SIGKILL" || res.Stdout != "before\n" {
		t.Fatalf("result %+v, want exit -1, signal SIGKILL and the output before", res)
	}
}

func testExecStdin(t *testing.T, ws workspace.Workspace) {
	in := []byte("hello\x00world\nbinary\xff\n")
	res := mustExec(t, ws, workspace.Command{Argv: []string{"wc", "-c"}, Stdin: in})
	if strings.TrimSpace(res.Stdout) != fmt.Sprint(len(in)) {
		t.Fatalf("wc -c of stdin = %q, want %d", res.Stdout, len(in))
	}
	res = mustExec(t, ws, workspace.Command{Argv: []string{"cat"}, Stdin: []byte("line 1\nline 2\n")})
	if res.Stdout != "line 1\nline 2\n" {
		t.Fatalf("cat stdin = %q", res.Stdout)
	}
	// No stdin: /dev/null, so cat ends at once.
	res = mustExec(t, ws, workspace.Command{Argv: []string{"cat"}, Timeout: 10 * time.Second})
	if res.ExitCode != 0 || res.Stdout != "" || res.TimedOut {
		t.Fatalf("cat without stdin: %+v", res)
	}
}

func testExecTimeout(t *testing.T, ws workspace.Workspace) {
	// The background child would create "stray" after 3 s if it survived
	// the timeout: wide by design, so a kill the load delays by more than
	// the timeout still comes before it. The test waits for the child to
	// be gone (strayGone), not for the 3 s.
	start := time.Now()
	res := mustExec(t, ws, workspace.Command{
		Shell:   "(sleep 3; touch stray) & echo $! > stray.pid; echo started; sleep 30",
		Timeout: 300 * time.Millisecond,
	})
	elapsed := time.Since(start)
	if !res.TimedOut {
		t.Fatalf("result %+v, want TimedOut", res)
	}
	if res.ExitCode == 0 {
		t.Fatalf("a timed-out command exited 0: %+v", res)
	}
	if !strings.Contains(res.Stdout, "started") {
		t.Fatalf("partial output lost: %+v", res)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("a 300ms timeout took %s", elapsed)
	}
	strayGone(t, ws, start.Add(3500*time.Millisecond))
	_, err := ws.Stat(ctxFor(t), "stray")
	wantCategory(t, "Stat(stray) after the timeout (a process of the group survived)", err, errdefs.ErrNotFound)
}

// strayGoneTimeout bounds strayGone's wait for a killed process to go
// (through a proxy and a container, on a loaded machine).
const strayGoneTimeout = 10 * time.Second

// strayGone waits until the stray background child of a command that was
// stopped (its shell wrote the child's pid to stray.pid before the
// output the test waited for) no longer runs: gone, or a zombie. After
// that the child can no longer create "stray", so the caller's Stat is
// final; it fails t when the child still runs strayGoneTimeout later (a
// process of the group survived). When the shell did not get as far as
// writing stray.pid (the stop came first), it sleeps until notBefore
// instead: a little after the child would have created "stray".
func strayGone(t *testing.T, ws workspace.Workspace, notBefore time.Time) {
	t.Helper()
	// kill -0 also finds a zombie (a child whose parent died with the
	// group and that nothing reaped yet): /proc tells those apart where
	// it exists.
	res := mustExec(t, ws, workspace.Command{
		Shell: `p=$(cat stray.pid 2>/dev/null) && [ -n "$p" ] || exit 3
while kill -0 "$p" 2>/dev/null; do
	case $(cat "/proc/$p/stat" 2>/dev/null) in *") Z "*) exit 0 ;; esac
	sleep 0.02
done`,
		Timeout: strayGoneTimeout,
	})
	switch {
	case res.TimedOut:
		t.Fatalf("the stray child (pid %q) still runs %v after its command was stopped (a process of the group survived)",
			strings.TrimSpace(string(download(t, ws, "stray.pid"))), strayGoneTimeout)
	case res.ExitCode == 3:
		time.Sleep(time.Until(notBefore))
	case res.ExitCode != 0:
		t.Fatalf("waiting for the stray child to go: %+v", res)
	}
}

func testExecContextCancel(t *testing.T, ws workspace.Workspace) {
	ctx, cancel := context.WithTimeout(ctxFor(t), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ws.Exec(ctx, workspace.Command{Shell: "(sleep 1; touch stray) & echo $! > stray.pid; sleep 30"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec with an expiring context: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("cancelled Exec took %s", d)
	}
	strayGone(t, ws, time.Now().Add(1800*time.Millisecond))
	_, err = ws.Stat(ctxFor(t), "stray")
	wantCategory(t, "Stat(stray) after the cancellation (a process of the group survived)", err, errdefs.ErrNotFound)
}

func testExecCwdEnv(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "mkdir -p sub/deeper")
	res := mustExec(t, ws, workspace.Command{Shell: "pwd", Cwd: "sub"})
	if strings.TrimSpace(res.Stdout) != path.Join(ws.Root(), "sub") {
		t.Fatalf("pwd with cwd \"sub\" = %q, want %s", res.Stdout, path.Join(ws.Root(), "sub"))
	}
	abs := path.Join(ws.Root(), "sub", "deeper")
	res = mustExec(t, ws, workspace.Command{Argv: []string{"pwd"}, Cwd: abs})
	if strings.TrimSpace(res.Stdout) != abs {
		t.Fatalf("pwd with cwd %s = %q", abs, res.Stdout)
	}
	res = mustExec(t, ws, workspace.Command{
		Shell: `printf '%s|%s' "$BERTH_CONFORMANCE" "$OTHER"`,
		Env:   map[string]string{"BERTH_CONFORMANCE": "a value with spaces", "OTHER": "x=y"},
	})
	if res.Stdout != "a value with spaces|x=y" {
		t.Fatalf("env: stdout %q", res.Stdout)
	}
	// Env overrides the base environment rather than adding a duplicate.
	res = mustExec(t, ws, workspace.Command{Shell: `printf %s "$HOME"`, Env: map[string]string{"HOME": "/nowhere"}})
	if res.Stdout != "/nowhere" {
		t.Fatalf("overridden HOME = %q", res.Stdout)
	}
	_, err := ws.Exec(ctxFor(t), workspace.Command{Shell: "true", Cwd: "no-such-dir"})
	wantCategory(t, "Exec with a missing cwd", err, errdefs.ErrFailedPrecondition)
}

func testExecBoundedOutput(t *testing.T, ws workspace.Workspace) {
	const n = 3 << 20 // beyond the default 1 MiB limit
	res := mustExec(t, ws, workspace.Command{Shell: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a; printf END; echo small >&2", n)})
	if !res.StdoutTruncated || res.StdoutDropped <= 0 {
		t.Fatalf("3 MiB of stdout: truncated=%v dropped=%d, want truncated", res.StdoutTruncated, res.StdoutDropped)
	}
	if res.StderrTruncated || res.Stderr != "small\n" {
		t.Fatalf("stderr: truncated=%v %q, want \"small\\n\" untouched", res.StderrTruncated, res.Stderr)
	}
	if len(res.Stdout) > (1<<20)+200 {
		t.Fatalf("kept %d bytes of stdout, want about 1 MiB", len(res.Stdout))
	}
	if !strings.HasPrefix(res.Stdout, "aaaa") || !strings.HasSuffix(res.Stdout, "aEND") || !strings.Contains(res.Stdout, "truncated") {
		t.Fatalf("stdout should keep head and tail around a marker; head %q tail %q", res.Stdout[:20], res.Stdout[len(res.Stdout)-20:])
	}
	head, tail := cutMarker(t, res.Stdout)
	kept := int64(strings.Count(head, "a") + strings.Count(tail, "a"))
	if kept+res.StdoutDropped != n {
		t.Fatalf("kept %d + dropped %d bytes of a's, want %d", kept, res.StdoutDropped, n)
	}
	// An explicit limit.
	res = mustExec(t, ws, workspace.Command{Shell: "head -c 10000 /dev/zero | tr '\\0' b", OutputLimit: 1000})
	head, tail = cutMarker(t, res.Stdout)
	if !res.StdoutTruncated || res.StdoutDropped != 9000 || head+tail != strings.Repeat("b", 1000) {
		t.Fatalf("limit 1000: truncated=%v dropped=%d kept %q + %q", res.StdoutTruncated, res.StdoutDropped, head, tail)
	}
	// Within the limit nothing is cut.
	res = mustExec(t, ws, workspace.Command{Shell: "head -c 1000 /dev/zero | tr '\\0' c", OutputLimit: 1000})
	if res.StdoutTruncated || len(res.Stdout) != 1000 {
		t.Fatalf("1000 bytes with limit 1000: truncated=%v len=%d", res.StdoutTruncated, len(res.Stdout))
	}
}

func testExecStreamOrder(t *testing.T, ws workspace.Workspace) {
	var (
		mu      sync.Mutex
		events  []workspace.Event
		streams = map[workspace.EventKind]*bytes.Buffer{workspace.EventStdout: {}, workspace.EventStderr: {}}
		partial = map[workspace.EventKind]string{}
		seq     []string // complete output lines in arrival order
	)
	res, err := ws.ExecStream(ctxFor(t), workspace.Command{
		Shell: "for i in 1 2 3 4 5; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done; printf '\\377raw'; exit 7",
	}, func(ev workspace.Event) error {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
		if buf := streams[ev.Kind]; buf != nil {
			buf.Write(ev.Data)
			lines := strings.Split(partial[ev.Kind]+string(ev.Data), "\n")
			partial[ev.Kind] = lines[len(lines)-1]
			seq = append(seq, lines[:len(lines)-1]...)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ExecStream: %v", err)
	}
	if res.ExitCode != 7 || res.Stdout != "" || res.Stderr != "" {
		t.Fatalf("result %+v, want exit 7 and no output in the result", res)
	}
	if len(events) < 3 || events[0].Kind != workspace.EventStarted || events[0].Pid <= 0 {
		t.Fatalf("events %+v, want started (with a pid) first", events)
	}
	last := events[len(events)-1]
	if last.Kind != workspace.EventExited || last.Exit == nil || last.Exit.ExitCode != 7 {
		t.Fatalf("last event %+v, want exited with code 7", last)
	}
	for _, ev := range events[1 : len(events)-1] {
		if ev.Kind != workspace.EventStdout && ev.Kind != workspace.EventStderr {
			t.Fatalf("unexpected %s event in the middle", ev.Kind)
		}
	}
	wantOut := "out1\nout2\nout3\nout4\nout5\n\xffraw"
	if got := streams[workspace.EventStdout].String(); got != wantOut {
		t.Fatalf("streamed stdout %q, want %q (raw bytes)", got, wantOut)
	}
	if got := streams[workspace.EventStderr].String(); got != "err1\nerr2\nerr3\nerr4\nerr5\n" {
		t.Fatalf("streamed stderr %q", got)
	}
	// stdout and stderr are two pipes read apart: their lines keep their
	// order within each stream (above), and across them they arrive as
	// written, not one stream after the other; the exact interleaving
	// depends on the scheduler, so only lines 0.7 s or more apart are
	// compared.
	at := func(line string) int { return slices.Index(seq, line) }
	for _, p := range [][2]string{{"out1", "err4"}, {"err1", "out5"}, {"out2", "err5"}} {
		if at(p[0]) < 0 || at(p[1]) < 0 || at(p[0]) > at(p[1]) {
			t.Fatalf("output order %q: %s arrived after %s, written 0.7 s later (streams not interleaved)", seq, p[0], p[1])
		}
	}
}

// cutMarker splits truncated output around its truncation marker.
func cutMarker(t *testing.T, s string) (head, tail string) {
	t.Helper()
	i := strings.Index(s, "\n…[berth: ")
	j := strings.Index(s, " bytes truncated]…\n")
	if i < 0 || j < i {
		t.Fatalf("no truncation marker in %d bytes of output", len(s))
	}
	return s[:i], s[j+len(" bytes truncated]…\n"):]
}

var errStop = errors.New("consumer stopped")

func testExecStreamCallbackError(t *testing.T, ws workspace.Workspace) {
	start := time.Now()
	_, err := ws.ExecStream(ctxFor(t), workspace.Command{Shell: "(sleep 1; touch stray) & echo $! > stray.pid; while :; do echo tick; sleep 0.05; done"},
		func(ev workspace.Event) error {
			if ev.Kind == workspace.EventStdout {
				return errStop
			}
			return nil
		})
	if !errors.Is(err, errStop) {
		t.Fatalf("ExecStream: %v, want the callback's error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("stopping took %s", d)
	}
	strayGone(t, ws, time.Now().Add(1800*time.Millisecond))
	_, err = ws.Stat(ctxFor(t), "stray")
	wantCategory(t, "Stat(stray) after the consumer stopped (a process of the group survived)", err, errdefs.ErrNotFound)
}

// onlyReader hides every method but Read (so the upload cannot seek).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func testRoundTrip(t *testing.T, ws workspace.Workspace) {
	data := make([]byte, 8<<20)
	_, _ = rand.NewChaCha8([32]byte{1, 2}).Read(data) // random bytes, the same each run
	sum := sha256.Sum256(data)
	for _, tc := range []struct {
		name string
		src  io.Reader
	}{
		{"seekable.bin", bytes.NewReader(data)},
		{"stream.bin", onlyReader{bytes.NewReader(data)}},
	} {
		if err := ws.Upload(ctxFor(t), tc.src, tc.name); err != nil {
			t.Fatalf("Upload(%s): %v", tc.name, err)
		}
		got := download(t, ws, tc.name)
		if len(got) != len(data) || sha256.Sum256(got) != sum {
			t.Fatalf("%s: downloaded %d bytes with another sha256, want %d identical bytes", tc.name, len(got), len(data))
		}
		fi, err := ws.Stat(ctxFor(t), tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Type != workspace.TypeFile || fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o644 || fi.Name != tc.name ||
			fi.Path != path.Join(ws.Root(), tc.name) || fi.ModTime.IsZero() {
			t.Fatalf("Stat(%s) = %+v", tc.name, fi)
		}
		// The workspace's own tools see the same bytes.
		if out := strings.Fields(sh(t, ws, "sha256sum "+tc.name+" 2>/dev/null || echo no-sha256sum")); out[0] != fmt.Sprintf("%x", sum) && out[0] != "no-sha256sum" {
			t.Fatalf("sha256sum in the workspace: %q", out)
		}
	}
	// Empty files round-trip too.
	upload(t, ws, "empty", "")
	if got := download(t, ws, "empty"); len(got) != 0 {
		t.Fatalf("empty file downloaded as %d bytes", len(got))
	}
}

func testUploadReplaces(t *testing.T, ws workspace.Workspace) {
	upload(t, ws, "f.txt", "first version, longer")
	upload(t, ws, "f.txt", "second")
	if got := string(download(t, ws, "f.txt")); got != "second" {
		t.Fatalf("after replacing: %q", got)
	}
	assertNoTempFiles(t, ws, "")
}

func testUploadMissingDir(t *testing.T, ws workspace.Workspace) {
	err := ws.Upload(ctxFor(t), bytes.NewReader(bytes.Repeat([]byte("x"), 64<<10)), "missing-dir/f.txt")
	wantCategory(t, "Upload into a missing directory", err, errdefs.ErrNotFound)
	_, err = ws.Stat(ctxFor(t), "missing-dir")
	wantCategory(t, "Stat(missing-dir) after the failed upload", err, errdefs.ErrNotFound)
	err = ws.Upload(ctxFor(t), onlyReader{strings.NewReader("x")}, "missing-dir/sub/f.txt")
	wantCategory(t, "streamed Upload into a missing directory", err, errdefs.ErrNotFound)
	assertNoTempFiles(t, ws, "")
}

var errBoom = errors.New("source broke")

// failingReader yields n bytes and then fails.
type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errBoom
	}
	k := min(len(p), f.n)
	for i := range p[:k] {
		p[i] = 'z'
	}
	f.n -= k
	return k, nil
}

func testUploadFailedSource(t *testing.T, ws workspace.Workspace) {
	upload(t, ws, "keep.txt", "old content")
	for _, dst := range []string{"new.txt", "keep.txt"} {
		err := ws.Upload(ctxFor(t), &failingReader{n: 1 << 20}, dst)
		if !errors.Is(err, errBoom) {
			t.Fatalf("Upload(%s) from a failing source: %v, want the source's error", dst, err)
		}
	}
	_, err := ws.Stat(ctxFor(t), "new.txt")
	wantCategory(t, "Stat(new.txt) after a failed upload", err, errdefs.ErrNotFound)
	if got := string(download(t, ws, "keep.txt")); got != "old content" {
		t.Fatalf("a failed upload changed the existing file: %q", got)
	}
	// A cancelled upload leaves nothing either.
	ctx, cancel := context.WithCancel(ctxFor(t))
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write(bytes.Repeat([]byte("y"), 256<<10))
		cancel()
		_ = pw.CloseWithError(context.Canceled)
	}()
	if err := ws.Upload(ctx, pr, "cancelled.txt"); err == nil {
		t.Fatal("a cancelled upload succeeded")
	}
	_, err = ws.Stat(ctxFor(t), "cancelled.txt")
	wantCategory(t, "Stat(cancelled.txt) after a cancelled upload", err, errdefs.ErrNotFound)
	assertNoTempFiles(t, ws, "")
}

// assertNoTempFiles waits (a remote agent may notice a broken upload a
// little after the client) until dir holds no temporary upload file.
func assertNoTempFiles(t *testing.T, ws workspace.Workspace, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		entries, err := ws.List(ctxFor(t), dir, 1)
		if err != nil {
			t.Fatalf("List(%q): %v", dir, err)
		}
		var temps []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name, ".berth-upload-") {
				temps = append(temps, e.Name)
			}
		}
		if len(temps) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("temporary upload files left behind: %q", temps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func testRelativePaths(t *testing.T, ws workspace.Workspace) {
	root := ws.Root()
	sh(t, ws, "mkdir -p d1/d2")
	upload(t, ws, "d1/d2/main.go", "package main\n")
	fi, err := ws.Stat(ctxFor(t), "d1/d2/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if want := path.Join(root, "d1/d2/main.go"); fi.Path != want {
		t.Fatalf("Stat(relative).Path = %q, want %q", fi.Path, want)
	}
	// The same file by absolute path, by a path with dots, and from a
	// command run in Root.
	for _, p := range []string{path.Join(root, "d1/d2/main.go"), "./d1/../d1/d2/main.go"} {
		if got := string(download(t, ws, p)); got != "package main\n" {
			t.Fatalf("Download(%s) = %q", p, got)
		}
	}
	if got := sh(t, ws, "cat d1/d2/main.go"); got != "package main\n" {
		t.Fatalf("cat in Root = %q", got)
	}
	// Relative directories for List, and for cwd.
	entries, err := ws.List(ctxFor(t), "d1", 1)
	if err != nil || len(entries) != 1 || entries[0].Path != path.Join(root, "d1/d2") {
		t.Fatalf("List(d1) = %+v, %v", entries, err)
	}
	if got := sh(t, ws, "ls"); !strings.Contains(got, "d1") {
		t.Fatalf("ls in Root = %q", got)
	}
	res := mustExec(t, ws, workspace.Command{Argv: []string{"cat", "main.go"}, Cwd: "d1/d2"})
	if res.Stdout != "package main\n" {
		t.Fatalf("cat with a relative cwd = %+v", res)
	}
}

func names(entries []workspace.FileInfo, root string) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = strings.TrimPrefix(e.Path, root+"/")
	}
	return out
}

func testStatList(t *testing.T, ws workspace.Workspace) {
	root := ws.Root()
	sh(t, ws, "mkdir -p dir/sub && ln -s a.txt link")
	upload(t, ws, "a.txt", "aaa")
	upload(t, ws, "dir/b.txt", "bb")
	upload(t, ws, "dir/sub/c.txt", "c")
	sh(t, ws, "chmod 0755 dir/b.txt")

	entries, err := ws.List(ctxFor(t), "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(entries, root), []string{"a.txt", "dir", "link"}; !slices.Equal(got, want) {
		t.Fatalf("List(Root, 1) = %q, want %q", got, want)
	}
	if entries, err = ws.List(ctxFor(t), root, 0); err != nil || len(entries) != 3 {
		t.Fatalf("List(Root, 0) = %d entries, %v; want depth 1", len(entries), err)
	}
	entries, err = ws.List(ctxFor(t), "", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(entries, root), []string{"a.txt", "dir", "dir/b.txt", "dir/sub", "dir/sub/c.txt", "link"}; !slices.Equal(got, want) {
		t.Fatalf("List(Root, 3) = %q, want %q", got, want)
	}
	byName := map[string]workspace.FileInfo{}
	for _, e := range entries {
		byName[strings.TrimPrefix(e.Path, root+"/")] = e
	}
	if e := byName["dir"]; e.Type != workspace.TypeDir || e.Name != "dir" {
		t.Fatalf("dir: %+v", e)
	}
	if e := byName["dir/b.txt"]; e.Type != workspace.TypeFile || e.Size != 2 || e.Mode.Perm() != 0o755 || e.Name != "b.txt" {
		t.Fatalf("dir/b.txt: %+v", e)
	}
	if e := byName["link"]; e.Type != workspace.TypeSymlink || e.SymlinkTarget != "a.txt" {
		t.Fatalf("link: %+v", e)
	}
	if entries, err = ws.List(ctxFor(t), "dir", 1); err != nil {
		t.Fatal(err)
	}
	if got, want := names(entries, root), []string{"dir/b.txt", "dir/sub"}; !slices.Equal(got, want) {
		t.Fatalf("List(dir, 1) = %q, want %q", got, want)
	}
	fi, err := ws.Stat(ctxFor(t), "link")
	if err != nil || fi.Type != workspace.TypeSymlink {
		t.Fatalf("Stat(link) = %+v, %v; want the symlink itself", fi, err)
	}
	if got := string(download(t, ws, "link")); got != "aaa" {
		t.Fatalf("Download(link) = %q, want the target's content", got)
	}
	_, err = ws.Stat(ctxFor(t), "nope")
	wantCategory(t, "Stat(nope)", err, errdefs.ErrNotFound)
	_, err = ws.List(ctxFor(t), "nope", 1)
	wantCategory(t, "List(nope)", err, errdefs.ErrNotFound)
	_, err = ws.List(ctxFor(t), "a.txt", 1)
	wantCategory(t, "List(a file)", err, errdefs.ErrFailedPrecondition)
	_, err = ws.List(ctxFor(t), "", -1)
	wantCategory(t, "List with a negative depth", err, errdefs.ErrInvalidArgument)
}

func testGit(t *testing.T, ws workspace.Workspace) {
	if res, err := ws.Exec(ctxFor(t), workspace.Command{Argv: []string{"git", "--version"}}); err != nil || res.ExitCode != 0 {
		testenv.SkipOrFailf(t, "no git in this workspace: %v %+v", err, res)
	}
	const git = "git -c user.name=t -c user.email=t@t -c commit.gpgsign=false -c init.defaultBranch=main"
	sh(t, ws, "mkdir repo")
	upload(t, ws, "repo/a.txt", "one\n")
	upload(t, ws, "repo/b.txt", "bee\n")
	upload(t, ws, "repo/d.txt", "doomed\n")
	if err := ws.Upload(ctxFor(t), bytes.NewReader([]byte("bin\x00ary\x01")), "repo/bin.dat"); err != nil {
		t.Fatal(err)
	}
	res := mustExec(t, ws, workspace.Command{Shell: git + " init -q && " + git + " add -A && " + git + " commit -q -m initial", Cwd: "repo"})
	if res.ExitCode != 0 {
		t.Fatalf("git init/commit: %+v", res)
	}
	changes, err := ws.GitChanges(ctxFor(t), "repo")
	if err != nil || len(changes) != 0 {
		t.Fatalf("GitChanges of a clean repo = %+v, %v", changes, err)
	}

	// Modify, rename, delete, add (staged) and create (untracked).
	upload(t, ws, "repo/a.txt", "one\ntwo\n")
	if err := ws.Upload(ctxFor(t), bytes.NewReader([]byte("bin\x00ary\x02")), "repo/bin.dat"); err != nil {
		t.Fatal(err)
	}
	upload(t, ws, "repo/staged.txt", "staged\n")
	upload(t, ws, "repo/new.txt", "new\n")
	res = mustExec(t, ws, workspace.Command{Shell: git + " mv b.txt c.txt && rm d.txt && " + git + " add staged.txt", Cwd: path.Join(ws.Root(), "repo")})
	if res.ExitCode != 0 {
		t.Fatalf("git mv/rm/add: %+v", res)
	}

	changes, err = ws.GitChanges(ctxFor(t), "repo")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]workspace.GitChange{}
	for _, c := range changes {
		got[c.Path] = c
	}
	want := map[string]workspace.ChangeKind{
		"a.txt": workspace.ChangeModified, "bin.dat": workspace.ChangeModified, "c.txt": workspace.ChangeRenamed,
		"d.txt": workspace.ChangeDeleted, "staged.txt": workspace.ChangeAdded, "new.txt": workspace.ChangeUntracked,
	}
	if len(got) != len(want) {
		t.Fatalf("GitChanges = %+v, want %v", changes, want)
	}
	for p, k := range want {
		if got[p].Kind != k {
			t.Fatalf("GitChanges[%s] = %+v, want kind %s (all: %+v)", p, got[p], k, changes)
		}
	}
	if c := got["c.txt"]; c.OldPath != "b.txt" || !c.Staged {
		t.Fatalf("rename: %+v, want old path b.txt, staged", c)
	}
	if c := got["a.txt"]; c.Staged || !c.Unstaged {
		t.Fatalf("modified a.txt: %+v, want unstaged only", c)
	}
	if c := got["new.txt"]; !c.Unstaged {
		t.Fatalf("untracked: %+v", c)
	}

	// Absolute repo paths work the same.
	if abs, err := ws.GitChanges(ctxFor(t), path.Join(ws.Root(), "repo")); err != nil || len(abs) != len(changes) {
		t.Fatalf("GitChanges(absolute) = %+v, %v", abs, err)
	}

	d, err := ws.GitDiff(ctxFor(t), "repo", "a.txt")
	if err != nil {
		t.Fatal(err)
	}
	if d.Path != "a.txt" || d.Kind != workspace.ChangeModified || d.Original != "one\n" || d.Modified != "one\ntwo\n" || d.Binary {
		t.Fatalf("GitDiff(a.txt) = %+v", d)
	}
	if d, err = ws.GitDiff(ctxFor(t), "repo", "c.txt"); err != nil || d.Kind != workspace.ChangeRenamed || d.OldPath != "b.txt" ||
		d.Original != "bee\n" || d.Modified != "bee\n" {
		t.Fatalf("GitDiff(c.txt) = %+v, %v", d, err)
	}
	if d, err = ws.GitDiff(ctxFor(t), "repo", "d.txt"); err != nil || d.Kind != workspace.ChangeDeleted || d.Original != "doomed\n" || d.Modified != "" {
		t.Fatalf("GitDiff(d.txt) = %+v, %v", d, err)
	}
	if d, err = ws.GitDiff(ctxFor(t), "repo", "new.txt"); err != nil || d.Kind != workspace.ChangeUntracked || d.Original != "" || d.Modified != "new\n" {
		t.Fatalf("GitDiff(new.txt) = %+v, %v", d, err)
	}
	if d, err = ws.GitDiff(ctxFor(t), "repo", "bin.dat"); err != nil || !d.Binary || d.Original != "" || d.Modified != "" {
		t.Fatalf("GitDiff(bin.dat) = %+v, %v; want binary", d, err)
	}
	_, err = ws.GitDiff(ctxFor(t), "repo", "never-existed.txt")
	wantCategory(t, "GitDiff of an unknown file", err, errdefs.ErrNotFound)

	d, err = ws.GitDiff(ctxFor(t), "repo", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"+two", "rename from b.txt", "rename to c.txt", "-doomed", "+new", "+staged", "Binary files"} {
		if !strings.Contains(d.Unified, s) {
			t.Fatalf("unified diff lacks %q:\n%s", s, d.Unified)
		}
	}
	if d.Original != "" || d.Modified != "" {
		t.Fatalf("a unified diff also carries file texts: %+v", d)
	}

	_, err = ws.GitChanges(ctxFor(t), "") // Root is no repository
	wantCategory(t, "GitChanges outside a repository", err, errdefs.ErrFailedPrecondition)
	_, err = ws.GitChanges(ctxFor(t), "no-such-repo")
	wantCategory(t, "GitChanges of a missing directory", err, errdefs.ErrNotFound)
}

func testErrors(t *testing.T, ws workspace.Workspace) {
	ctx := ctxFor(t)
	err := ws.Download(ctx, "does-not-exist", io.Discard)
	wantCategory(t, "Download of a missing file", err, errdefs.ErrNotFound)
	var buf bytes.Buffer
	_ = ws.Download(ctx, "does-not-exist", &buf)
	if buf.Len() != 0 {
		t.Fatalf("a failed download wrote %d bytes", buf.Len())
	}
	err = ws.Download(ctx, "", io.Discard)
	wantCategory(t, "Download of an empty path", err, errdefs.ErrInvalidArgument)
	err = ws.Download(ctx, ".", io.Discard)
	wantCategory(t, "Download of a directory", err, errdefs.ErrFailedPrecondition)
	err = ws.Upload(ctx, strings.NewReader("x"), "")
	wantCategory(t, "Upload to an empty path", err, errdefs.ErrInvalidArgument)
	sh(t, ws, "mkdir adir")
	err = ws.Upload(ctx, strings.NewReader("x"), "adir")
	wantCategory(t, "Upload onto a directory", err, errdefs.ErrFailedPrecondition)

	_, err = ws.Exec(ctx, workspace.Command{})
	wantCategory(t, "Exec of an empty command", err, errdefs.ErrInvalidArgument)
	_, err = ws.ExecStream(ctx, workspace.Command{}, func(workspace.Event) error { return nil })
	wantCategory(t, "ExecStream of an empty command", err, errdefs.ErrInvalidArgument)
	_, err = ws.Exec(ctx, workspace.Command{Argv: []string{"true"}, Shell: "true"})
	wantCategory(t, "Exec with both argv and shell", err, errdefs.ErrInvalidArgument)
	_, err = ws.Exec(ctx, workspace.Command{Shell: "true", Timeout: -time.Second})
	wantCategory(t, "Exec with a negative timeout", err, errdefs.ErrInvalidArgument)
	_, err = ws.Exec(ctx, workspace.Command{Argv: []string{"/no/such/program"}})
	wantCategory(t, "Exec of a missing program", err, errdefs.ErrFailedPrecondition)
	_, err = ws.Exec(ctx, workspace.Command{Argv: []string{"no-such-program-in-path"}})
	wantCategory(t, "Exec of a program not in PATH", err, errdefs.ErrFailedPrecondition)
}

func testClose(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "true")
	if err := ws.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := ws.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := ws.Exec(ctxFor(t), workspace.Command{Shell: "true"})
	if !errors.Is(err, workspace.ErrClosed) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Exec after Close: %v, want ErrClosed (unavailable)", err)
	}
	_, err = ws.Stat(ctxFor(t), "")
	if !errors.Is(err, workspace.ErrClosed) {
		t.Fatalf("Stat after Close: %v, want ErrClosed", err)
	}
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
