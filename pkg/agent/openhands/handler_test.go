package openhands

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/git"
	"github.com/berth-dev/berth/pkg/agent/mask"
	"github.com/berth-dev/berth/pkg/agent/process"
)

func newTestServer(t *testing.T, secrets map[string]string) (*httptest.Server, string) {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	runner := process.NewRunner(process.Config{WorkDir: dir, Masker: mask.New(secrets), Logger: log})
	h := New(Config{Runner: runner, Files: files.New(files.Config{Logger: log}), Git: git.New(git.Config{WorkDir: dir, Logger: log}), WorkDir: dir, Logger: log})
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); h.Close(); runner.Close() })
	return srv, dir
}

func getJSON(t *testing.T, u string, want int, out any) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("GET %s: %d %s (want %d)", u, res.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %v: %s", u, err, b)
		}
	}
}

func postJSON(t *testing.T, u string, body any, want int, out any) {
	t.Helper()
	j, _ := json.Marshal(body)
	res, err := http.Post(u, "application/json", bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("POST %s: %d %s (want %d)", u, res.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("POST %s: %v: %s", u, err, b)
		}
	}
}

type testOutput struct {
	ID       string  `json:"id"`
	Order    int     `json:"order"`
	ExitCode *int    `json:"exit_code"`
	Stdout   *string `json:"stdout"`
	Stderr   *string `json:"stderr"`
}

// runPolled starts command and polls like RemoteWorkspace until the exit
// code arrives; it fails on a repeated id or a non-increasing order.
func runPolled(t *testing.T, base, command string, timeout int) (stdout, stderr string, exit, events int) {
	t.Helper()
	var cmd struct {
		ID string `json:"id"`
	}
	postJSON(t, base+"/api/bash/start_bash_command", map[string]any{"command": command, "timeout": timeout}, http.StatusOK, &cmd)
	last := -1
	seen := map[string]bool{}
	deadline := time.Now().Add(time.Duration(timeout+10) * time.Second)
	for time.Now().Before(deadline) {
		q := url.Values{"kind__eq": {"BashOutput"}, "sort_order": {"TIMESTAMP"}, "limit": {"100"}, "command_id__eq": {cmd.ID}}
		if last >= 0 {
			q.Set("order__gt", fmt.Sprint(last))
		}
		var page struct {
			Items []testOutput `json:"items"`
		}
		getJSON(t, base+"/api/bash/bash_events/search?"+q.Encode(), http.StatusOK, &page)
		for _, ev := range page.Items {
			if seen[ev.ID] || ev.Order <= last {
				t.Fatalf("event %s order %d after order %d (seen: %t)", ev.ID, ev.Order, last, seen[ev.ID])
			}
			seen[ev.ID] = true
			last = ev.Order
			events++
			if ev.Stdout != nil {
				stdout += *ev.Stdout
			}
			if ev.Stderr != nil {
				stderr += *ev.Stderr
			}
			if ev.ExitCode != nil {
				return stdout, stderr, *ev.ExitCode, events
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%q: no exit code", command)
	return
}

func TestBashPolling(t *testing.T) {
	srv, _ := newTestServer(t, map[string]string{"TOK": "sekrit-value"})
	out, errs, code, _ := runPolled(t, srv.URL, `echo hi; echo sekrit-value; echo e >&2; exit 4`, 30)
	if out != "hi\n<secret:TOK>\n" || errs != "e\n" || code != 4 {
		t.Errorf("got %q %q %d", out, errs, code)
	}
	// Large output with multi-byte characters in chunks that end on
	// character boundaries.
	out, _, code, events := runPolled(t, srv.URL, `i=0; while [ $i -lt 120000 ]; do printf 'héllo wörld '; i=$((i+1)); done`, 60)
	if code != 0 || out != strings.Repeat("héllo wörld ", 120000) || events < 3 {
		t.Errorf("large output: exit %d, %d bytes in %d events", code, len(out), events)
	}
	_, errs, code, _ = runPolled(t, srv.URL, `sleep 20`, 1)
	if code != -1 || !strings.Contains(errs, "Command timed out after 1 seconds") {
		t.Errorf("timeout: exit %d stderr %q", code, errs)
	}
	_, _, code, _ = runPolled(t, srv.URL, `kill -TERM $$`, 10)
	if code != -15 {
		t.Errorf("killed by SIGTERM: exit %d, want -15 (the agent-server's)", code)
	}
}

// TestBackgroundChildOutlivesCommand: as on the agent-server, a detached
// child (`nohup sleep 30 >/dev/null 2>&1 &`) keeps running after its
// command ended, while a timed-out command's group is still stopped.
func TestBackgroundChildOutlivesCommand(t *testing.T) {
	srv, dir := newTestServer(t, nil)
	pidFile := filepath.Join(dir, "child.pid")
	_, _, code, _ := runPolled(t, srv.URL, `nohup sleep 30 >/dev/null 2>&1 & echo $! > `+pidFile, 10)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	// The command's end was seen; the child must still be alive now.
	if !running(pid) {
		t.Fatalf("the background child %d is gone after its command ended", pid)
	}
	// A command that times out still takes its whole group with it.
	_, _, code, _ = runPolled(t, srv.URL, `sleep 60 & echo $! > `+pidFile+`; wait`, 1)
	if code != -1 {
		t.Fatalf("timeout: exit %d", code)
	}
	b, _ = os.ReadFile(pidFile)
	pid2, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid2 <= 0 {
		t.Fatalf("pid file %q", b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for running(pid2) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid2, syscall.SIGKILL)
			t.Fatalf("the timed-out command's child %d is still running", pid2)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGitChangesAsTheSDK: a staged rename is the old path DELETED and the
// new one ADDED, and a nested repository's files are listed (ADDED
// inner/n.txt, not inner), as the agent-server's git helpers answer; on a
// real repository with the real git.
func TestGitChangesAsTheSDK(t *testing.T) {
	srv, dir := newTestServer(t, nil)
	repo := filepath.Join(dir, "repo")
	_, errs, code, _ := runPolled(t, srv.URL, `set -e; git init -q `+repo+`; cd `+repo+`
git config user.email t@example.com; git config user.name t
printf 'c\n' > c.txt; git add .; git commit -qm init; git mv c.txt moved.txt
mkdir -p inner/deep && git -C inner init -q && printf 'n\n' > inner/n.txt && printf 'd\n' > inner/deep/d.txt`, 30)
	if code != 0 {
		t.Fatalf("setup: exit %d: %s", code, errs)
	}
	var changes []gitChange
	getJSON(t, srv.URL+"/api/git/changes?path="+url.QueryEscape(repo), http.StatusOK, &changes)
	got := map[string]string{}
	for _, c := range changes {
		got[c.Path] = c.Status
	}
	want := map[string]string{"c.txt": "DELETED", "moved.txt": "ADDED", "inner/n.txt": "ADDED", "inner/deep/d.txt": "ADDED"}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(changes) != len(want) {
		t.Errorf("changes %v, want %v", changes, want)
	}
}

// running reports whether pid is a live process: it exists and is not a
// zombie (a killed child waiting to be reaped).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func TestFilesAndErrors(t *testing.T) {
	srv, dir := newTestServer(t, nil)
	getJSON(t, srv.URL+"/health", http.StatusOK, nil)
	content := []byte{0, 1, 2, 0xff, 0xfe, '\n', 'x'}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("other", "ignored")
	fw, _ := mw.CreateFormFile("file", "f.bin")
	_, _ = fw.Write(content)
	_ = mw.Close()
	dst := filepath.Join(dir, "a", "b", "f.bin")
	res, err := http.Post(srv.URL+"/api/conversations/abc/file/upload?path="+url.QueryEscape(dst), mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != `{"file_size":7,"success":true}`+"\n" {
		t.Fatalf("upload: %d %s", res.StatusCode, b)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, content) {
		t.Fatalf("uploaded %q", got)
	}
	for p, want := range map[string]int{dst: 200, "rel": 400, dir: 400, filepath.Join(dir, "nope"): 404} {
		res, err := http.Get(srv.URL + "/api/file/download?path=" + url.QueryEscape(p))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want || (want == 200 && !bytes.Equal(b, content)) {
			t.Errorf("download %s: %d %q (want %d)", p, res.StatusCode, b, want)
		}
	}
	getJSON(t, srv.URL+"/api/nothing", http.StatusNotFound, nil)
	getJSON(t, srv.URL+"/api/bash/bash_events/search?sort_order=SIDEWAYS", http.StatusBadRequest, nil)
	var changes []any
	getJSON(t, srv.URL+"/api/git/changes?path="+url.QueryEscape(dir), http.StatusOK, &changes)
	if changes == nil || len(changes) != 0 {
		t.Errorf("changes of a non-repository: %v", changes)
	}
}

func TestCompleteUTF8(t *testing.T) {
	b := []byte("aé")
	for n, want := range map[int]int{0: 0, 1: 1, 2: 1, 3: 3} {
		if got := completeUTF8(b[:n]); got != want {
			t.Errorf("completeUTF8(%q) = %d, want %d", b[:n], got, want)
		}
	}
}

func TestStoreEvictsFinishedCommands(t *testing.T) {
	s := newStore()
	var first *command
	for i := range MaxCommands + 5 {
		c := s.add("true", "/", 1)
		if i == 0 {
			first = c
			continue // stays running
		}
		exit := 0
		s.output(c, "x", "", &exit)
	}
	if len(s.order) != MaxCommands || s.cmds[first.start.ID] == nil {
		t.Errorf("%d commands kept; the running one kept: %t", len(s.order), s.cmds[first.start.ID] != nil)
	}
}

// TestExecuteAnswersAllOutput: execute_bash_command answers the last
// BashOutput, so output written before a pause longer than FlushInterval
// must still be in it (the agent-server only splits output above its chunk
// size). A timed flush used to leave the answer without the first line.
func TestExecuteAnswersAllOutput(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	var last testOutput
	cmd := fmt.Sprintf("echo one; sleep %.2f; echo two", (3 * FlushInterval).Seconds())
	postJSON(t, srv.URL+"/api/bash/execute_bash_command", map[string]any{"command": cmd}, http.StatusOK, &last)
	if last.ExitCode == nil || *last.ExitCode != 0 || last.Stdout == nil || *last.Stdout != "one\ntwo\n" {
		t.Fatalf("execute_bash_command: %+v (stdout %v)", last, last.Stdout)
	}
}

func TestExecuteBatchAndClear(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	var last testOutput
	postJSON(t, srv.URL+"/api/bash/execute_bash_command", map[string]any{"command": "echo done"}, http.StatusOK, &last)
	if last.ExitCode == nil || *last.ExitCode != 0 || last.Stdout == nil || *last.Stdout != "done\n" {
		t.Fatalf("execute_bash_command: %+v", last)
	}
	var batch []*testOutput
	getJSON(t, srv.URL+"/api/bash/bash_events/?event_ids="+last.ID+"&event_ids="+strings.Repeat("1", 32), http.StatusOK, &batch)
	if len(batch) != 2 || batch[0] == nil || batch[0].ID != last.ID || batch[1] != nil {
		t.Errorf("batch get: %+v", batch)
	}
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/api/bash/bash_events", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(b) != `{"cleared_count":2}`+"\n" {
		t.Errorf("clear: %s", b)
	}
	var page struct {
		Items []any `json:"items"`
	}
	getJSON(t, srv.URL+"/api/bash/bash_events/search", http.StatusOK, &page)
	if len(page.Items) != 0 {
		t.Errorf("events after clear: %v", page.Items)
	}
}
