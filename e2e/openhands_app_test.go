package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// rtCall is one call of the OpenHands runtime API (or of a runtime's url):
// the status and the JSON answer.
func rtCall(t *testing.T, method, url string, hdr map[string]string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	if m == nil {
		m = map[string]any{"raw": string(raw)}
	}
	return res.StatusCode, m
}

// TestOpenHandsApp starts runtimes with a command through the OpenHands
// runtime API on Docker: the command (testdata/openhands_app.py, a tiny
// agent-server stand-in run by berth/base's python3) runs as the sandbox's
// user in working_dir, with the session key in its environment; the
// runtime's url routes /api/conversations and the tokenless WebSocket
// /sockets/events/{id} (key in the first frame) to it, while /health and
// /api/bash stay berth's agent's. A command that does not exist, and one
// that exits before it listens, make pod_status failed with the reason in
// pod_logs. The app runs again after a pause (hibernate) and resume. A
// tokenless socket to a runtime without a command is refused.
func TestOpenHandsApp(t *testing.T) {
	requireImage(t, baseImage)
	script, err := os.ReadFile("testdata/openhands_app.py")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr, "BERTH_CLIENT_TOKENS=team-a:"+runtimeKeyA)
	api := "http://" + addr + "/openhands/runtime"
	key := map[string]string{"X-API-Key": runtimeKeyA}

	st, rt := rtCall(t, "POST", api+"/start", key, map[string]any{
		"image": baseImage, "session_id": "app-" + randHex(4), "working_dir": "/tmp",
		"command": []string{"python3", "-c", string(script)},
	})
	if st != http.StatusOK || rt["pod_status"] != "ready" {
		t.Fatalf("start with a command: %d %v", st, rt)
	}
	url, sk := rt["url"].(string), rt["session_api_key"].(string)
	sess := map[string]string{"X-Session-API-Key": sk}

	// The app's routes, with the key berth gives it (never berth's own tokens).
	st, got := rtCall(t, "GET", url+"/api/conversations", sess, nil)
	if st != http.StatusOK || got["app"] != "test-app" || got["cwd"] != "/tmp" || got["user"] != "sandbox" ||
		got["keys_agree"] != true || got["saw_authorization"] != false {
		t.Fatalf("GET /api/conversations: %d %v", st, got)
	}
	st, got = rtCall(t, "POST", url+"/api/conversations/c1/events/search", sess, map[string]any{"q": 1})
	if st != http.StatusOK || got["path"] != "/api/conversations/c1/events/search" {
		t.Fatalf("POST /api/conversations/c1/events/search: %d %v", st, got)
	}
	if st, got = rtCall(t, "GET", url+"/api/conversations", nil, nil); st != http.StatusUnauthorized {
		t.Fatalf("GET /api/conversations without a key: %d %v (want 401 from the proxy)", st, got)
	}
	// berth's own routes stay berth's.
	if st, got = rtCall(t, "GET", url+"/health", nil, nil); st != http.StatusOK || got["status"] != "ok" {
		t.Fatalf("GET /health: %d %v", st, got)
	}
	st, got = rtCall(t, "POST", url+"/api/bash/execute_bash_command", sess, map[string]any{"command": "echo from-berth; id -un", "timeout": 30})
	if st != http.StatusOK || got["exit_code"] != float64(0) || got["stdout"] != "from-berth\nsandbox\n" {
		t.Fatalf("execute_bash_command: %d %v", st, got)
	}

	// The event socket: opened without headers, the key in the first frame.
	ws := strings.Replace(url, "http://", "ws://", 1) + "/sockets/events/conv-1"
	for _, tc := range []struct {
		key  string
		want bool
	}{{sk, true}, {"wrong-key", false}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, res, err := websocket.Dial(ctx, ws, nil)
		if err != nil {
			cancel()
			t.Fatalf("dial %s without headers: %v (%v)", ws, err, res)
		}
		msg, _ := json.Marshal(map[string]string{"session_api_key": tc.key})
		if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
			t.Fatal(err)
		}
		_, b, err := c.Read(ctx)
		cancel()
		c.CloseNow()
		var reply map[string]any
		if err != nil || json.Unmarshal(b, &reply) != nil {
			t.Fatalf("socket reply: %v %q", err, b)
		}
		if reply["ok"] != tc.want || reply["conversation"] != "conv-1" || reply["saw_key_header"] != false || reply["saw_authorization"] != false {
			t.Fatalf("socket with key %q: %v", tc.key, reply)
		}
	}

	// Paused (hibernated: the container stops) and resumed, the app runs
	// again.
	for _, op := range []string{"/pause", "/resume"} {
		if st, got := rtCall(t, "POST", api+op, key, map[string]any{"runtime_id": rt["runtime_id"]}); st != http.StatusOK {
			t.Fatalf("%s: %d %v", op, st, got)
		}
	}
	if st, got = rtCall(t, "GET", url+"/api/conversations", sess, nil); st != http.StatusOK || got["app"] != "test-app" {
		t.Fatalf("GET /api/conversations after pause and resume: %d %v", st, got)
	}

	// A runtime without a command: the same tokenless socket is refused.
	st, plain := rtCall(t, "POST", api+"/start", key, map[string]any{"image": baseImage, "session_id": "plain-" + randHex(4)})
	if st != http.StatusOK {
		t.Fatalf("start without a command: %d %v", st, plain)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c, res, err := websocket.Dial(ctx, strings.Replace(plain["url"].(string), "http://", "ws://", 1)+"/sockets/events/conv-1", nil); err == nil {
		c.CloseNow()
		t.Fatal("a tokenless socket to a runtime without an app was let through")
	} else if res == nil || res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("tokenless socket without an app: %v (%v), want 401", err, res)
	}

	// Commands that cannot start.
	for _, tc := range []struct {
		name    string
		command []string
		want    []string
	}{
		{"missing", []string{"/nonexistent/openhands-agent-server"}, []string{"/nonexistent/openhands-agent-server", "no such file or directory"}},
		{"exits", []string{"python3", "-c", "print('boom before listening'); raise SystemExit(3)"}, []string{"exited with status 3", "boom before listening"}},
	} {
		sid := "fail-" + tc.name + "-" + randHex(4)
		st, got := rtCall(t, "POST", api+"/start", key, map[string]any{"image": baseImage, "session_id": sid, "command": tc.command})
		if st == http.StatusOK {
			t.Fatalf("%s: start answered 200: %v", tc.name, got)
		}
		st, got = rtCall(t, "GET", api+"/sessions/"+sid, key, nil)
		logs, _ := got["pod_logs"].(string)
		if st != http.StatusOK || got["pod_status"] != "failed" {
			t.Fatalf("%s: session: %d %v", tc.name, st, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(logs, w) {
				t.Fatalf("%s: pod_logs lack %q:\n%s", tc.name, w, logs)
			}
		}
		t.Logf("%s: pod_logs: %s", tc.name, logs)
	}
}

// TestOpenHandsWorkingDir starts sessions without a command: working_dir
// is then the default directory of berth's own commands. A missing one is
// created for the sandbox's user; an existing system directory is used
// but never handed to that user (a tenant must not come to own /etc).
func TestOpenHandsWorkingDir(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr, "BERTH_CLIENT_TOKENS=team-a:"+runtimeKeyA)
	api := "http://" + addr + "/openhands/runtime"
	key := map[string]string{"X-API-Key": runtimeKeyA}
	run := func(workingDir, command string) string {
		t.Helper()
		st, rt := rtCall(t, "POST", api+"/start", key, map[string]any{
			"image": baseImage, "session_id": "wd-" + randHex(4), "working_dir": workingDir,
		})
		if st != http.StatusOK || rt["pod_status"] != "ready" {
			t.Fatalf("start with working_dir %s: %d %v", workingDir, st, rt)
		}
		t.Cleanup(func() { rtCall(t, "POST", api+"/stop", key, map[string]any{"runtime_id": rt["runtime_id"]}) })
		sess := map[string]string{"X-Session-API-Key": rt["session_api_key"].(string)}
		st, got := rtCall(t, "POST", rt["url"].(string)+"/api/bash/execute_bash_command", sess, map[string]any{"command": command, "timeout": 30})
		if st != http.StatusOK {
			t.Fatalf("execute_bash_command in %s: %d %v", workingDir, st, got)
		}
		out, _ := got["stdout"].(string)
		return out
	}
	if got, want := run("/srv/project", "pwd; stat -c %U .; touch made && echo wrote"), "/srv/project\nsandbox\nwrote\n"; got != want {
		t.Fatalf("a new working_dir: %q, want %q", got, want)
	}
	if got, want := run("/etc", "pwd; stat -c %U /etc; touch /etc/berth-owned 2>/dev/null && echo wrote || echo refused"), "/etc\nroot\nrefused\n"; got != want {
		t.Fatalf("working_dir /etc: %q, want %q (the sandbox's user must not own /etc)", got, want)
	}
}
