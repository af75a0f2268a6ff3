package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// ohClient replays what openhands-sdk's RemoteWorkspace sends: every call
// under host (http://ORCHESTRATOR/v1/sandboxes/LEASE, plus the optional
// /api/conversations/{id} scope) with the api_key in X-Session-API-Key.
type ohClient struct {
	host   string // no trailing slash
	prefix string // "/api" or "/api/conversations/{id}"
	key    string
	http   *http.Client
}

func (c *ohClient) do(method, path string, params url.Values, body io.Reader, contentType string) (int, http.Header, []byte, error) {
	u := c.host + path
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return 0, nil, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.key != "" {
		req.Header.Set("X-Session-API-Key", c.key)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, b, err
}

func (c *ohClient) mustJSON(tb testing.TB, method, path string, params url.Values, body any, want int, out any) []byte {
	tb.Helper()
	var rd io.Reader
	ct := ""
	if body != nil {
		j, _ := json.Marshal(body)
		rd, ct = bytes.NewReader(j), "application/json"
	}
	code, _, b, err := c.do(method, path, params, rd, ct)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	if code != want {
		tb.Fatalf("%s %s %v: HTTP %d (want %d): %s", method, path, params, code, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			tb.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return b
}

// ohOutput is a BashOutput event as the client reads it.
type ohOutput struct {
	Kind      string  `json:"kind"`
	ID        string  `json:"id"`
	Timestamp string  `json:"timestamp"`
	CommandID string  `json:"command_id"`
	Order     *int    `json:"order"`
	ExitCode  *int    `json:"exit_code"`
	Stdout    *string `json:"stdout"`
	Stderr    *string `json:"stderr"`
}

type ohPage struct {
	Items      []ohOutput `json:"items"`
	NextPageID *string    `json:"next_page_id"`
}

// ohResult is what RemoteWorkspace.execute_command returns, plus what the
// replay observed.
type ohResult struct {
	id                string
	exitCode          int
	stdout, stderr    string
	events, polls     int
	runningEventsSeen int // events without an exit code
	clientTimedOut    bool
	orders            []int
	raw               map[string]any // the BashCommand answer
}

var hexID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// execute replays RemoteWorkspace._execute_command_generator: start the
// command, then poll bash_events/search (first without order__gt, then
// with order__gt = the highest order seen) every 100ms until an event has
// an exit code or timeout passes; a repeated event id is an error.
func (c *ohClient) execute(tb testing.TB, command, cwd string, timeout float64) ohResult {
	tb.Helper()
	payload := map[string]any{"command": command, "timeout": int(timeout)}
	if cwd != "" {
		payload["cwd"] = cwd
	}
	var res ohResult
	c.mustJSON(tb, http.MethodPost, c.prefix+"/bash/start_bash_command", nil, payload, http.StatusOK, &res.raw)
	id, _ := res.raw["id"].(string)
	if !hexID.MatchString(id) {
		tb.Fatalf("start_bash_command: id %q is not a 32-hex-digit UUID: %v", id, res.raw)
	}
	res.id = id
	start := time.Now()
	lastOrder := -1
	seen := map[string]bool{}
	var stdout, stderr strings.Builder
	var exit *int
	for time.Since(start).Seconds() < timeout {
		params := url.Values{"kind__eq": {"BashOutput"}, "sort_order": {"TIMESTAMP"}, "limit": {"100"}, "command_id__eq": {id}}
		if lastOrder >= 0 {
			params.Set("order__gt", fmt.Sprint(lastOrder))
		}
		var page ohPage
		c.mustJSON(tb, http.MethodGet, c.prefix+"/bash/bash_events/search", params, nil, http.StatusOK, &page)
		res.polls++
		for _, ev := range page.Items {
			if ev.Kind != "BashOutput" {
				tb.Fatalf("kind__eq=BashOutput returned a %q event", ev.Kind)
			}
			if seen[ev.ID] {
				tb.Fatalf("duplicate event received: %s", ev.ID)
			}
			seen[ev.ID] = true
			if !hexID.MatchString(ev.ID) || ev.CommandID != id || ev.Order == nil || ev.Timestamp == "" {
				tb.Fatalf("malformed BashOutput: %+v", ev)
			}
			res.orders = append(res.orders, *ev.Order)
			lastOrder = max(lastOrder, *ev.Order)
			if ev.Stdout != nil {
				stdout.WriteString(*ev.Stdout)
			}
			if ev.Stderr != nil {
				stderr.WriteString(*ev.Stderr)
			}
			res.events++
			if ev.ExitCode != nil {
				exit = ev.ExitCode
			} else {
				res.runningEventsSeen++
			}
		}
		if exit != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if exit == nil {
		res.clientTimedOut = true
		res.exitCode = -1
		stderr.WriteString(fmt.Sprintf("Command timed out after %v seconds", timeout))
	} else {
		res.exitCode = *exit
	}
	res.stdout, res.stderr = stdout.String(), stderr.String()
	return res
}

// upload replays _file_upload_generator: multipart part "file".
func (c *ohClient) upload(tb testing.TB, dst string, content []byte) (int, []byte) {
	tb.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("file", "upload")
	if err != nil {
		tb.Fatal(err)
	}
	_, _ = fw.Write(content)
	_ = mw.Close()
	code, _, b, err := c.do(http.MethodPost, c.prefix+"/file/upload", url.Values{"path": {dst}}, &body, mw.FormDataContentType())
	if err != nil {
		tb.Fatal(err)
	}
	return code, b
}

// TestOpenHandsRemoteWorkspace serves RemoteWorkspace's calls from a real
// Docker sandbox through the real proxy: health without a token, server
// info, commands polled to completion (small, streaming, large, timed out,
// failing, masked secret), the conversation-scoped prefix, binary upload
// and download with their 400 and 404 answers, and git changes and diffs
// on a real repository.
func TestOpenHandsRemoteWorkspace(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr)
	a := newAPI(addr)
	defer a.close()

	const secret = "sk-openhands-secret-0123"
	acq := a.acquireBody(t, map[string]any{
		"conversationId": "openhands-" + randHex(4), "image": baseImage, "ttl": "600s",
		"secrets": map[string]string{"OH_SECRET": secret},
	})
	id := acq.GetLease().GetId()
	defer a.mustRelease(t, id)
	host := a.base + sandboxPath(id, "")
	c := &ohClient{host: host, prefix: "/api", key: acq.GetToken(), http: a.http}

	t.Run("health is open", func(t *testing.T) {
		anon := &ohClient{host: host, http: a.http}
		for _, m := range []string{http.MethodGet, http.MethodHead} {
			code, _, b, err := anon.do(m, "/health", nil, nil, "")
			if err != nil || code != http.StatusOK || (m == http.MethodGet && !bytes.Contains(b, []byte(`"status":"ok"`))) {
				t.Fatalf("%s /health without a token: %d %s %v", m, code, b, err)
			}
		}
		// The lease must exist; every other route still needs the token.
		other := &ohClient{host: a.base + sandboxPath("0000000000000000000000000a", ""), http: a.http}
		if code, _, b, _ := other.do(http.MethodGet, "/health", nil, nil, ""); code != http.StatusNotFound {
			t.Errorf("/health of a missing lease: %d %s", code, b)
		}
		for _, p := range []string{"/server_info", "/api/git/changes?path=/workspace", "/v1/exec"} {
			if code, _, b, _ := anon.do(http.MethodGet, p, nil, nil, ""); code != http.StatusUnauthorized {
				t.Errorf("GET %s without a token: %d %s", p, code, b)
			}
		}
		wrong := &ohClient{host: host, key: "wrong-token", http: a.http}
		if code, _, b, _ := wrong.do(http.MethodGet, "/server_info", nil, nil, ""); code != http.StatusUnauthorized {
			t.Errorf("wrong X-Session-API-Key: %d %s", code, b)
		}
	})

	t.Run("server_info", func(t *testing.T) {
		var info map[string]any
		c.mustJSON(t, http.MethodGet, "/server_info", nil, nil, http.StatusOK, &info)
		if _, ok := info["uptime"].(float64); !ok {
			t.Errorf("server_info: %v", info)
		}
		if _, ok := info["idle_time"].(float64); !ok {
			t.Errorf("server_info: %v", info)
		}
	})

	t.Run("command", func(t *testing.T) {
		r := c.execute(t, `echo hello; echo oops >&2; pwd; exit 3`, "/tmp", 30)
		if r.exitCode != 3 || r.stdout != "hello\n/tmp\n" || r.stderr != "oops\n" {
			t.Fatalf("exit %d stdout %q stderr %q", r.exitCode, r.stdout, r.stderr)
		}
		for k, want := range map[string]any{"kind": "BashCommand", "command": `echo hello; echo oops >&2; pwd; exit 3`, "cwd": "/tmp", "timeout": float64(30)} {
			if r.raw[k] != want {
				t.Errorf("BashCommand %s = %v, want %v (%v)", k, r.raw[k], want, r.raw)
			}
		}
		if ts, _ := r.raw["timestamp"].(string); ts == "" {
			t.Errorf("BashCommand without timestamp: %v", r.raw)
		}
		// The default cwd is the workspace.
		if r := c.execute(t, `pwd`, "", 30); r.stdout != "/workspace\n" || r.exitCode != 0 {
			t.Errorf("default cwd: %+v", r)
		}
		// get_command_output: the latest event, newest first.
		var page ohPage
		c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/search", url.Values{
			"kind__eq": {"BashOutput"}, "sort_order": {"TIMESTAMP_DESC"}, "limit": {"1"}, "command_id__eq": {r.id},
		}, nil, http.StatusOK, &page)
		if len(page.Items) != 1 || page.Items[0].ExitCode == nil || *page.Items[0].ExitCode != 3 {
			t.Errorf("latest output: %+v", page)
		}
		// One event by id; a hyphenated command id is the same id.
		var ev ohOutput
		c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/"+page.Items[0].ID, nil, nil, http.StatusOK, &ev)
		if ev.ID != page.Items[0].ID {
			t.Errorf("get event: %+v", ev)
		}
		hy := r.id[:8] + "-" + r.id[8:12] + "-" + r.id[12:16] + "-" + r.id[16:20] + "-" + r.id[20:]
		c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/search", url.Values{"command_id__eq": {hy}}, nil, http.StatusOK, &page)
		if len(page.Items) == 0 {
			t.Errorf("search by hyphenated id found nothing")
		}
		c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/"+strings.Repeat("0", 32), nil, nil, http.StatusNotFound, nil)
		// A command that cannot start is refused at once.
		c.mustJSON(t, http.MethodPost, "/api/bash/start_bash_command", nil, map[string]any{"command": "true", "cwd": "/no/such/dir"}, http.StatusBadRequest, nil)
		c.mustJSON(t, http.MethodPost, "/api/bash/start_bash_command", nil, map[string]any{"command": ""}, http.StatusBadRequest, nil)
		c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/search", url.Values{"limit": {"0"}}, nil, http.StatusBadRequest, nil)
	})

	t.Run("polling sees output before the exit", func(t *testing.T) {
		r := c.execute(t, `for i in 1 2 3 4; do echo line$i; sleep 0.3; done`, "", 30)
		if r.exitCode != 0 || r.stdout != "line1\nline2\nline3\nline4\n" {
			t.Fatalf("exit %d stdout %q", r.exitCode, r.stdout)
		}
		if r.runningEventsSeen == 0 || r.polls < 3 {
			t.Errorf("no output seen while the command ran (%d events over %d polls)", r.events, r.polls)
		}
		if !strictlyIncreasing(r.orders) {
			t.Errorf("orders %v are not strictly increasing", r.orders)
		}
	})

	t.Run("large output", func(t *testing.T) {
		const n = 3 << 20
		r := c.execute(t, fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; printf 'é%%.0s' $(seq 1 200000) >&2`, n), "", 60)
		if r.exitCode != 0 || len(r.stdout) != n || strings.Trim(r.stdout, "x") != "" {
			t.Fatalf("exit %d, stdout %d bytes (want %d x)", r.exitCode, len(r.stdout), n)
		}
		if r.stderr != strings.Repeat("é", 200000) {
			t.Fatalf("stderr: %d bytes, not 200000 é (a character split across chunks?)", len(r.stderr))
		}
		if r.events < 4 {
			t.Errorf("%d bytes came in %d events", n, r.events)
		}
		if !strictlyIncreasing(r.orders) {
			t.Fatalf("orders %v are not strictly increasing", r.orders)
		}
		// Pages: limit 2 with next_page_id, then the next page.
		var p1, p2 ohPage
		c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/search", url.Values{"command_id__eq": {r.id}, "limit": {"2"}}, nil, http.StatusOK, &p1)
		if len(p1.Items) != 2 || p1.NextPageID == nil {
			t.Fatalf("page 1: %d items, next %v", len(p1.Items), p1.NextPageID)
		}
		c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/search", url.Values{"command_id__eq": {r.id}, "limit": {"2"}, "page_id": {*p1.NextPageID}}, nil, http.StatusOK, &p2)
		if len(p2.Items) != 2 || p2.Items[0].ID == p1.Items[1].ID || *p2.Items[0].Order != *p1.Items[1].Order+1 {
			t.Fatalf("page 2 does not follow page 1: %+v then %+v", p1.Items, p2.Items)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		t0 := time.Now()
		r := c.execute(t, `echo started; sleep 30`, "", 2)
		// The client polls up to its own timeout; the agent stops the
		// command at the same one and reports -1.
		if r.exitCode != -1 || !strings.Contains(r.stderr, "timed out") || !strings.HasPrefix(r.stdout, "started") {
			t.Fatalf("exit %d stdout %q stderr %q", r.exitCode, r.stdout, r.stderr)
		}
		// Seen by the agent, not by the client giving up: poll on.
		var page ohPage
		if !eventually(10*time.Second, 100*time.Millisecond, func() bool {
			c.mustJSON(t, http.MethodGet, "/api/bash/bash_events/search", url.Values{
				"kind__eq": {"BashOutput"}, "sort_order": {"TIMESTAMP_DESC"}, "limit": {"1"}, "command_id__eq": {r.id},
			}, nil, http.StatusOK, &page)
			return len(page.Items) == 1 && page.Items[0].ExitCode != nil
		}) {
			t.Fatalf("the agent never ended the timed-out command: %+v", page)
		}
		if ev := page.Items[0]; *ev.ExitCode != -1 || ev.Stderr == nil || !strings.Contains(*ev.Stderr, "Command timed out after 2 seconds") {
			t.Errorf("last event of a timed-out command: exit %d stderr %v", *ev.ExitCode, ev.Stderr)
		}
		if d := time.Since(t0); d > 8*time.Second {
			t.Errorf("timed-out command took %s to end", d)
		}
	})

	t.Run("secret masked", func(t *testing.T) {
		r := c.execute(t, `echo "$OH_SECRET"`, "", 30)
		if r.stdout != "<secret:OH_SECRET>\n" || strings.Contains(r.stdout, secret) {
			t.Errorf("stdout %q", r.stdout)
		}
	})

	t.Run("conversation prefix", func(t *testing.T) {
		cc := *c
		cc.prefix = "/api/conversations/4f1c2b9a-2d3e-4f50-8a6b-7c8d9e0f1a2b"
		if r := cc.execute(t, `echo scoped`, "", 30); r.stdout != "scoped\n" || r.exitCode != 0 {
			t.Errorf("scoped command: %+v", r)
		}
		if code, b := cc.upload(t, "/workspace/scoped.txt", []byte("scoped")); code != http.StatusOK {
			t.Errorf("scoped upload: %d %s", code, b)
		}
	})

	t.Run("files", func(t *testing.T) {
		content := make([]byte, 3<<20+17)
		_, _ = rand.Read(content)
		for i := range 256 {
			content[i] = byte(i)
		}
		dst := "/workspace/oh/new/dir/blob.bin"
		code, b := c.upload(t, dst, content)
		var up struct {
			Success  bool  `json:"success"`
			FileSize int64 `json:"file_size"`
		}
		if code != http.StatusOK || json.Unmarshal(b, &up) != nil || !up.Success || up.FileSize != int64(len(content)) {
			t.Fatalf("upload: %d %s", code, b)
		}
		code, h, got, err := c.do(http.MethodGet, "/api/file/download", url.Values{"path": {dst}}, nil, "")
		if err != nil || code != http.StatusOK || !bytes.Equal(got, content) {
			t.Fatalf("download: %d, %d bytes (want %d identical), %v", code, len(got), len(content), err)
		}
		if ct := h.Get("Content-Type"); ct != "application/octet-stream" {
			t.Errorf("download Content-Type %q", ct)
		}
		// The sandbox sees the same bytes.
		if r := c.execute(t, "sha256sum "+dst+" | cut -c1-64", "", 30); len(strings.TrimSpace(r.stdout)) != 64 {
			t.Errorf("sha256sum in the sandbox: %+v", r)
		}
		for _, tc := range []struct {
			path string
			want int
		}{
			{"relative/path.txt", http.StatusBadRequest},
			{"/workspace/oh", http.StatusBadRequest}, // a directory
			{"/workspace/no-such-file", http.StatusNotFound},
			{"", http.StatusBadRequest},
		} {
			code, _, b, _ := c.do(http.MethodGet, "/api/file/download", url.Values{"path": {tc.path}}, nil, "")
			if code != tc.want || !bytes.Contains(b, []byte(`"detail"`)) {
				t.Errorf("download %q: %d %s (want %d with a detail)", tc.path, code, b, tc.want)
			}
		}
		if code, b := c.upload(t, "relative.txt", []byte("x")); code != http.StatusBadRequest {
			t.Errorf("upload to a relative path: %d %s", code, b)
		}
		if code, b := c.upload(t, "/workspace/oh", []byte("x")); code != http.StatusBadRequest {
			t.Errorf("upload onto a directory: %d %s", code, b)
		}
	})

	t.Run("git", func(t *testing.T) {
		setup := `set -e; mkdir -p /workspace/repo && cd /workspace/repo && git init -q -b main .
git config user.email t@example.com && git config user.name t
printf 'one\n' > a.txt; printf 'bee\n' > b.txt; printf 'sea\n' > c.txt
git add . && git commit -qm init
printf 'one\ntwo\n' > a.txt; rm b.txt; git mv c.txt moved.txt
printf 'new\n' > untracked.txt; printf 'staged\n' > staged.txt; git add staged.txt
mkdir inner && git -C inner init -q && printf 'n\n' > inner/n.txt`
		if r := c.execute(t, setup, "", 60); r.exitCode != 0 {
			t.Fatalf("setup: %+v", r)
		}
		var changes []struct {
			Status string `json:"status"`
			Path   string `json:"path"`
		}
		c.mustJSON(t, http.MethodGet, "/api/git/changes", url.Values{"path": {"/workspace/repo"}}, nil, http.StatusOK, &changes)
		got := map[string]string{}
		for _, ch := range changes {
			got[ch.Path] = ch.Status
		}
		// As the SDK's git helpers: a rename is the old path DELETED and the
		// new one ADDED; a nested repository's files are listed.
		want := map[string]string{"a.txt": "UPDATED", "b.txt": "DELETED", "c.txt": "DELETED", "moved.txt": "ADDED", "untracked.txt": "ADDED",
			"staged.txt": "ADDED", "inner/n.txt": "ADDED"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("changes %v, want %v", changes, want)
		}
		var diff struct {
			Modified *string `json:"modified"`
			Original *string `json:"original"`
		}
		c.mustJSON(t, http.MethodGet, "/api/git/diff", url.Values{"path": {"/workspace/repo/a.txt"}}, nil, http.StatusOK, &diff)
		if diff.Original == nil || diff.Modified == nil || *diff.Original != "one\n" || *diff.Modified != "one\ntwo\n" {
			t.Errorf("diff a.txt: %+v", diff)
		}
		c.mustJSON(t, http.MethodGet, "/api/git/diff", url.Values{"path": {"/workspace/repo/untracked.txt"}}, nil, http.StatusOK, &diff)
		if diff.Original == nil || *diff.Original != "" || diff.Modified == nil || *diff.Modified != "new\n" {
			t.Errorf("diff untracked.txt: %+v", diff)
		}
		// Not a repository: no changes, no diff.
		var none []any
		if b := c.mustJSON(t, http.MethodGet, "/api/git/changes", url.Values{"path": {"/tmp"}}, nil, http.StatusOK, &none); strings.TrimSpace(string(b)) != "[]" {
			t.Errorf("changes outside a repository: %s", b)
		}
		if b := c.mustJSON(t, http.MethodGet, "/api/git/diff", url.Values{"path": {"/workspace/oh/new/dir/blob.bin"}}, nil, http.StatusOK, nil); !bytes.Contains(b, []byte(`"modified":null`)) {
			t.Errorf("diff outside a repository: %s", b)
		}
		c.mustJSON(t, http.MethodGet, "/api/git/changes", url.Values{"path": {"repo"}}, nil, http.StatusBadRequest, nil)
	})
}

func strictlyIncreasing(xs []int) bool {
	for i := 1; i < len(xs); i++ {
		if xs[i] <= xs[i-1] {
			return false
		}
	}
	return true
}
