package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/proto/e2b/envd/filesystem"
	"github.com/berth-dev/berth/proto/e2b/envd/filesystem/filesystemconnect"
	"github.com/berth-dev/berth/proto/e2b/envd/process"
	"github.com/berth-dev/berth/proto/e2b/envd/process/processconnect"
)

// e2bImage is the image of the base template (images/build.sh e2b).
const e2bImage = "berth/e2b:latest"

const (
	e2bKeyA = "e2e-e2b-team-a-0123456789abcdef"
	e2bKeyB = "e2e-e2b-team-b-0123456789abcdef"
)

// e2bREST makes one REST call with testdata/e2b_rest.py (Python's standard
// library, as E2B's Python SDK's JSON) and returns the status, the
// X-Next-Token header and the decoded body.
func e2bREST(t *testing.T, method, url, key string, body any) (int, string, any) {
	t.Helper()
	args := []string{"testdata/e2b_rest.py", method, url, key}
	if body != nil {
		b, _ := json.Marshal(body)
		args = append(args, string(b))
	}
	out, err := exec.Command("python3", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("python3 %v: %v\n%s", args, err, out)
	}
	var res struct {
		Status    int    `json:"status"`
		NextToken string `json:"next_token"`
		Body      any    `json:"body"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("python3 printed %q: %v", out, err)
	}
	return res.Status, res.NextToken, res.Body
}

// envdRun runs argv in sandbox id through envd's process.Process/Start on
// the E2B listener (E2b-Sandbox-Id routing), sending token as
// X-Access-Token when set; it returns stdout, stderr and the exit code.
func envdRun(ctx context.Context, base, id, token string, argv ...string) (stdout, stderr string, code int, err error) {
	return envdRunAs(ctx, base, id, token, "", argv...)
}

// envdRunAs is envdRun as user (Authorization: Basic USER:, as E2B's SDKs
// send it; "" for none).
func envdRunAs(ctx context.Context, base, id, token, user string, argv ...string) (stdout, stderr string, code int, err error) {
	c := processconnect.NewProcessClient(http.DefaultClient, base)
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: argv[0], Args: argv[1:]}})
	if user != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	req.Header().Set("E2b-Sandbox-Id", id)
	req.Header().Set("E2b-Sandbox-Port", "49983")
	if token != "" {
		req.Header().Set("X-Access-Token", token)
	}
	st, err := c.Start(ctx, req)
	if err != nil {
		return "", "", 0, err
	}
	defer st.Close()
	var out, errOut strings.Builder
	code = -1
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			errOut.Write(d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			code = int(e.GetExitCode())
		}
	}
	return out.String(), errOut.String(), code, st.Err()
}

func asList(t *testing.T, body any) []map[string]any {
	t.Helper()
	raw, ok := body.([]any)
	if !ok {
		t.Fatalf("not a list: %v", body)
	}
	var out []map[string]any
	for _, v := range raw {
		out = append(out, v.(map[string]any))
	}
	return out
}

// TestE2B drives a sandbox through the E2B listener of a real orchestrator
// on Docker: created by REST from Python's standard library (secure, with
// metadata), a command run through envd's Connect Start stream with its
// envdAccessToken (and refused without it, or with another sandbox's),
// listed (another owner's key sees nothing), paused (listed as paused;
// envd traffic resumes it), paused again and resumed by /connect (201),
// and killed, after which its traffic is E2B's 502.
func TestE2B(t *testing.T) {
	requireImage(t, e2bImage)
	dir, _ := newDataDir(t)
	addr, e2bAddr := freeAddr(t), freeAddr(t)
	startProc(t, dir, addr, "BERTH_CLIENT_TOKENS=team-a:"+e2bKeyA+",team-b:"+e2bKeyB, "BERTH_E2B_LISTEN="+e2bAddr)
	base := "http://" + e2bAddr
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	st, _, body := e2bREST(t, "POST", base+"/sandboxes", e2bKeyA, map[string]any{
		"templateID": "base", "timeout": 300, "secure": true, "metadata": map[string]string{"suite": "e2e"},
		"envVars": map[string]string{"GREETING": "hello from e2b"},
	})
	sb, _ := body.(map[string]any)
	if st != http.StatusCreated || sb["sandboxID"] == nil || sb["envdAccessToken"] == nil || sb["envdVersion"] == "" {
		t.Fatalf("create: %d %v", st, body)
	}
	id, tok := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	t.Cleanup(func() { e2bREST(t, "DELETE", base+"/sandboxes/"+id, e2bKeyA, nil) })
	st, _, plain := e2bREST(t, "POST", base+"/sandboxes", e2bKeyA, map[string]any{"templateID": "base", "secure": true})
	if st != http.StatusCreated {
		t.Fatalf("create the second: %d %v", st, plain)
	}
	otherID, otherTok := plain.(map[string]any)["sandboxID"].(string), plain.(map[string]any)["envdAccessToken"].(string)
	t.Cleanup(func() { e2bREST(t, "DELETE", base+"/sandboxes/"+otherID, e2bKeyA, nil) })

	out, errOut, code, err := envdRun(ctx, base, id, tok, "/bin/sh", "-c", `echo "$GREETING"; echo oops >&2; exit 3`)
	if err != nil || out != "hello from e2b\n" || errOut != "oops\n" || code != 3 {
		t.Fatalf("envd Start: out %q err %q code %d: %v", out, errOut, code, err)
	}
	// The base template has E2B's conventions: E2B's user `user` (what the
	// SDKs name by default) is uid 1000 with home /home/user, the working
	// directory; python is python3.
	out, errOut, code, err = envdRunAs(ctx, base, id, tok, "user", "/bin/sh", "-c", `echo "$(id -un) $(id -u) $HOME $(pwd)"; python -c "print(6*7)"`)
	if err != nil || out != "user 1000 /home/user /home/user\n42\n" || code != 0 {
		t.Fatalf("as user: out %q err %q code %d: %v", out, errOut, code, err)
	}
	for name, bad := range map[string]string{"no": "", "another sandbox's": otherTok, "a made-up": "x" + tok} {
		_, _, _, err := envdRun(ctx, base, id, bad, "/bin/true")
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("%s access token: %v, want unauthenticated", name, err)
		}
	}

	// Lists: the owner's key sees both, with the metadata filter the one;
	// another owner's key sees nothing and cannot get it.
	st, _, body = e2bREST(t, "GET", base+"/v2/sandboxes?metadata="+url.QueryEscape("suite=e2e"), e2bKeyA, nil)
	if l := asList(t, body); st != 200 || len(l) != 1 || l[0]["sandboxID"] != id || l[0]["state"] != "running" {
		t.Fatalf("list A: %d %v", st, body)
	}
	if st, _, body = e2bREST(t, "GET", base+"/v2/sandboxes", e2bKeyB, nil); st != 200 || len(asList(t, body)) != 0 {
		t.Fatalf("list B: %d %v", st, body)
	}
	if st, _, body = e2bREST(t, "GET", base+"/sandboxes/"+id, e2bKeyB, nil); st != 404 {
		t.Fatalf("get as B: %d %v", st, body)
	}

	// Pause; envd traffic resumes the sandbox first.
	if st, _, body = e2bREST(t, "POST", base+"/sandboxes/"+id+"/pause", e2bKeyA, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d %v", st, body)
	}
	st, _, body = e2bREST(t, "GET", base+"/v2/sandboxes?state=paused", e2bKeyA, nil)
	if l := asList(t, body); st != 200 || len(l) != 1 || l[0]["sandboxID"] != id || l[0]["state"] != "paused" {
		t.Fatalf("paused list: %d %v", st, body)
	}
	if out, _, code, err := envdRun(ctx, base, id, tok, "/bin/echo", "awake"); err != nil || out != "awake\n" || code != 0 {
		t.Fatalf("envd on a paused sandbox: %q %d %v", out, code, err)
	}

	// Pause again; /connect resumes it (201), then finds it running (200).
	if st, _, body = e2bREST(t, "POST", base+"/sandboxes/"+id+"/pause", e2bKeyA, nil); st != http.StatusNoContent {
		t.Fatalf("pause again: %d %v", st, body)
	}
	st, _, body = e2bREST(t, "POST", base+"/sandboxes/"+id+"/connect", e2bKeyA, map[string]any{"timeout": 60})
	if m, _ := body.(map[string]any); st != http.StatusCreated || m["envdAccessToken"] != tok {
		t.Fatalf("connect to paused: %d %v", st, body)
	}
	if st, _, body = e2bREST(t, "POST", base+"/sandboxes/"+id+"/connect", e2bKeyA, map[string]any{"timeout": 60}); st != http.StatusOK {
		t.Fatalf("connect to running: %d %v", st, body)
	}
	if out, _, _, err := envdRun(ctx, base, id, tok, "/bin/echo", "again"); err != nil || out != "again\n" {
		t.Fatalf("envd after connect: %q %v", out, err)
	}

	// Kill: gone from the API, and its traffic is E2B's 502.
	if st, _, body = e2bREST(t, "DELETE", base+"/sandboxes/"+id, e2bKeyA, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d %v", st, body)
	}
	if st, _, _ = e2bREST(t, "GET", base+"/sandboxes/"+id, e2bKeyA, nil); st != 404 {
		t.Fatalf("get after kill: %d", st)
	}
	_, _, _, err = envdRun(ctx, base, id, tok, "/bin/true")
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		t.Fatalf("envd after kill: %v, want unavailable (502)", err)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var nf map[string]string
	_ = json.NewDecoder(res.Body).Decode(&nf)
	if res.StatusCode != http.StatusBadGateway || nf["message"] != "The sandbox was not found" || nf["sandboxId"] != id {
		t.Fatalf("traffic after kill: %d %v", res.StatusCode, nf)
	}
}

// e2bHTTP makes one request of sandbox id's envd through the E2B listener.
func e2bHTTP(ctx context.Context, t *testing.T, base, id, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	if body != "" {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestE2BFiles: a sandbox that is not secure (envd needs no token) has a
// directory watched through envd's WatchDir stream while a file is
// uploaded and read back through /files and listed by ListDir, all on
// the E2B listener; then /timeout ends it a few seconds later.
func TestE2BFiles(t *testing.T) {
	requireImage(t, e2bImage)
	dir, _ := newDataDir(t)
	addr, e2bAddr := freeAddr(t), freeAddr(t)
	startProc(t, dir, addr, "BERTH_CLIENT_TOKENS=team-a:"+e2bKeyA, "BERTH_E2B_LISTEN="+e2bAddr)
	base := "http://" + e2bAddr
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	st, _, body := e2bREST(t, "POST", base+"/sandboxes", e2bKeyA, map[string]any{"templateID": "base", "timeout": 300})
	sb, _ := body.(map[string]any)
	if st != http.StatusCreated || sb["envdAccessToken"] != nil {
		t.Fatalf("create: %d %v", st, body)
	}
	id := sb["sandboxID"].(string)
	t.Cleanup(func() { e2bREST(t, "DELETE", base+"/sandboxes/"+id, e2bKeyA, nil) })

	fs := filesystemconnect.NewFilesystemClient(http.DefaultClient, base)
	route := func(h http.Header) {
		h.Set("E2b-Sandbox-Id", id)
		h.Set("E2b-Sandbox-Port", "49983")
	}
	mk := connect.NewRequest(&filesystem.MakeDirRequest{Path: "/tmp/w"})
	route(mk.Header())
	if _, err := fs.MakeDir(ctx, mk); err != nil {
		t.Fatalf("MakeDir: %v", err)
	}
	wreq := connect.NewRequest(&filesystem.WatchDirRequest{Path: "/tmp/w"})
	route(wreq.Header())
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watch, err := fs.WatchDir(wctx, wreq)
	if err != nil {
		t.Fatalf("WatchDir: %v", err)
	}
	defer watch.Close()
	if !watch.Receive() || watch.Msg().GetStart() == nil {
		t.Fatalf("WatchDir's first event: %v %v", watch.Msg(), watch.Err())
	}

	if st, b := e2bHTTP(ctx, t, base, id, "POST", "/files?path=/tmp/w/a.txt", "hello e2b"); st != http.StatusOK {
		t.Fatalf("upload: %d %s", st, b)
	}
	for {
		if !watch.Receive() {
			t.Fatalf("watch ended before a.txt's event: %v", watch.Err())
		}
		if ev := watch.Msg().GetFilesystem(); ev != nil && ev.GetName() == "a.txt" {
			break
		}
	}
	if st, b := e2bHTTP(ctx, t, base, id, "GET", "/files?path=/tmp/w/a.txt", ""); st != http.StatusOK || b != "hello e2b" {
		t.Fatalf("download: %d %q", st, b)
	}
	ls := connect.NewRequest(&filesystem.ListDirRequest{Path: "/tmp/w", Depth: 1})
	route(ls.Header())
	lres, err := fs.ListDir(ctx, ls)
	if err != nil || len(lres.Msg.GetEntries()) != 1 || lres.Msg.GetEntries()[0].GetName() != "a.txt" || lres.Msg.GetEntries()[0].GetSize() != 9 {
		t.Fatalf("ListDir: %v %v", lres, err)
	}
	wcancel()

	// /timeout shortens the deadline: the sandbox ends within seconds.
	if st, _, body := e2bREST(t, "POST", base+"/sandboxes/"+id+"/timeout", e2bKeyA, map[string]any{"timeout": 2}); st != http.StatusNoContent {
		t.Fatalf("timeout: %d %v", st, body)
	}
	if !eventually(60*time.Second, 250*time.Millisecond, func() bool {
		st, _, _ := e2bREST(t, "GET", base+"/sandboxes/"+id, e2bKeyA, nil)
		return st == http.StatusNotFound
	}) {
		t.Fatal("the sandbox outlived its 2 s timeout by a minute")
	}
	if st, b := e2bHTTP(ctx, t, base, id, "GET", "/files?path=/tmp/w/a.txt", ""); st != http.StatusBadGateway || !strings.Contains(b, "The sandbox was not found") {
		t.Fatalf("traffic after expiry: %d %s", st, b)
	}
}
