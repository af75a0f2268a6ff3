package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

const testToken = "s3cret-token"

// testAgent is a real agent server on a loopback port.
type testAgent struct {
	addr    string
	base    string
	workDir string
	conn    *grpc.ClientConn
}

func startAgent(t *testing.T) *testAgent { return startAgentB(t) }

// startAgentB starts an agent for a test or a benchmark.
func startAgentB(t testing.TB) *testAgent {
	t.Helper()
	work := t.TempDir()
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: work, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	addr := testserve.Serve(t, srv.Serve)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &testAgent{addr: addr, base: "http://" + addr, workDir: work, conn: conn}
}

func authed(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// do sends a REST request with the token and returns status and body.
func (a *testAgent) do(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, a.base+path, r)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func TestAuthGRPC(t *testing.T) {
	a := startAgent(t)
	info := agentv1.NewInfoServiceClient(a.conn)
	ctx := context.Background()
	for name, c := range map[string]context.Context{
		"none":  ctx,
		"wrong": authed(ctx, "nope"),
		"basic": metadata.AppendToOutgoingContext(ctx, "authorization", "Basic "+testToken),
	} {
		_, err := info.GetInfo(c, &agentv1.GetInfoRequest{})
		if st := status.Convert(err); st.Code() != codes.Unauthenticated ||
			st.Message() != "missing or invalid bearer token (send 'authorization: Bearer TOKEN')" {
			t.Errorf("%s token: %v %q, want Unauthenticated", name, st.Code(), st.Message())
		}
	}
	got, err := info.GetInfo(authed(ctx, testToken), &agentv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got.WorkspaceDir != a.workDir || got.Pid != int32(os.Getpid()) {
		t.Errorf("info = %v", got)
	}
	// Health needs no token.
	h, err := healthpb.NewHealthClient(a.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", h, err)
	}
	// Reflection works with the token (grpcurl -H 'authorization: Bearer …').
	rc, err := reflectionpb.NewServerReflectionClient(a.conn).ServerReflectionInfo(authed(ctx, testToken))
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "berth.agent.v1.ProcessService") {
		t.Errorf("reflection services = %v", names)
	}
}

func TestAuthREST(t *testing.T) {
	a := startAgent(t)
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/healthz", "", 200},
		{"/v1/info", "", 401},
		{"/v1/info", "Bearer wrong", 401},
		{"/v1/info", "Bearer " + testToken, 200},
		{"/v1/info", "bearer " + testToken, 200},
		{"/v1/files" + a.workDir + "/x", "", 401},
	} {
		req, _ := http.NewRequest("GET", a.base+tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s with %q: %d %s, want %d", tc.path, tc.auth, resp.StatusCode, body, tc.want)
		}
		if tc.want == 401 {
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Code != int(codes.Unauthenticated) ||
				e.Message != "missing or invalid bearer token (send 'Authorization: Bearer TOKEN')" {
				t.Errorf("401 body = %s", body)
			}
		}
	}
}

func TestRESTExec(t *testing.T) {
	a := startAgent(t)
	code, body := a.do(t, "POST", "/v1/exec", map[string]any{"command": "echo out; echo err >&2; exit 3"})
	if code != 200 {
		t.Fatalf("exec: %d %s", code, body)
	}
	var res map[string]any
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	if res["exitCode"] != float64(3) || res["stdout"] != "out\n" || res["stderr"] != "err\n" || res["timedOut"] != false {
		t.Errorf("exec result = %s", body)
	}

	// A zero exit code is present in the JSON, not omitted.
	_, body = a.do(t, "POST", "/v1/exec", map[string]any{"argv": []string{"pwd"}, "env": map[string]string{"X": "1"}})
	if !bytes.Contains(body, []byte(`"exitCode":0`)) || !bytes.Contains(body, []byte(a.workDir)) {
		t.Errorf("pwd result = %s", body)
	}

	// Timeout with the duration in JSON form.
	_, body = a.do(t, "POST", "/v1/exec", map[string]any{"command": "echo start; sleep 30", "timeout": "0.3s", "killGrace": "0.1s"})
	if !bytes.Contains(body, []byte(`"timedOut":true`)) || !bytes.Contains(body, []byte(`"stdout":"start\n"`)) {
		t.Errorf("timeout result = %s", body)
	}

	// Stdin as text.
	_, body = a.do(t, "POST", "/v1/exec", map[string]any{"argv": []string{"cat"}, "stdin": "piped"})
	if !bytes.Contains(body, []byte(`"stdout":"piped"`)) {
		t.Errorf("stdin result = %s", body)
	}
}

func TestRESTBadInput(t *testing.T) {
	a := startAgent(t)
	for _, tc := range []struct {
		path  string
		body  string
		field string
	}{
		{"/v1/exec", `{}`, "argv"},
		{"/v1/exec", `{"argv":["x"],"command":"y"}`, "argv"},
		{"/v1/exec", `{"command":"true","cwd":"relative/dir"}`, "cwd"},
		{"/v1/exec", `{"command":"true","bogus":1}`, "bogus"},
		{"/v1/exec", `{"argv":["a\u0000b"]}`, "argv[0]"},
		{"/v1/exec", `{"command":"true","timeout":"-1s"}`, "timeout"},
		{"/v1/fs:mkdir", `{"path":"rel"}`, "path"},
	} {
		code, body := a.do(t, "POST", tc.path, tc.body)
		if code != 400 || !bytes.Contains(body, []byte(tc.field)) || !bytes.Contains(body, []byte(`"code":3`)) {
			t.Errorf("POST %s %s: %d %s, want 400 naming %q", tc.path, tc.body, code, body, tc.field)
		}
	}
	code, body := a.do(t, "GET", "/v1/fs:stat?path=/definitely/not/here", nil)
	if code != 404 {
		t.Errorf("stat missing: %d %s", code, body)
	}
}

func TestRESTExecStream(t *testing.T) {
	a := startAgent(t)
	req, _ := http.NewRequest("POST", a.base+"/v1/exec:stream", strings.NewReader(`{"command":"echo one; sleep 0.2; echo two >&2; exit 4"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var kinds []string
	var out strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var line struct {
			Result map[string]json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		for k, v := range line.Result {
			kinds = append(kinds, k)
			if k == "exited" {
				out.Write(v)
			}
		}
	}
	got := strings.Join(kinds, ",")
	if got != "started,stdout,stderr,exited" {
		t.Errorf("event order = %s", got)
	}
	if !strings.Contains(out.String(), `"exitCode":4`) {
		t.Errorf("exited = %s", out.String())
	}
}

func TestRESTBackgroundProcess(t *testing.T) {
	a := startAgent(t)
	code, body := a.do(t, "POST", "/v1/processes", map[string]any{"argv": []string{"cat"}})
	if code != 200 {
		t.Fatalf("start: %d %s", code, body)
	}
	var p struct {
		ID string `json:"id"`
	}
	json.Unmarshal(body, &p)
	if p.ID == "" {
		t.Fatalf("no id in %s", body)
	}
	code, body = a.do(t, "POST", "/v1/processes/"+p.ID+":stdin", map[string]any{"text": "hello\n", "close": true})
	if code != 200 {
		t.Fatalf("stdin: %d %s", code, body)
	}
	_, body = a.do(t, "GET", "/v1/processes/"+p.ID+"/logs", nil)
	if !bytes.Contains(body, []byte(`"stdout":"aGVsbG8K"`)) || !bytes.Contains(body, []byte(`"exited"`)) {
		t.Errorf("logs = %s", body)
	}
	_, body = a.do(t, "GET", "/v1/processes", nil)
	if !bytes.Contains(body, []byte(p.ID)) || !bytes.Contains(body, []byte("PROCESS_STATE_EXITED")) {
		t.Errorf("list = %s", body)
	}
	code, _ = a.do(t, "GET", "/v1/processes/p-nope", nil)
	if code != 404 {
		t.Errorf("unknown process: %d", code)
	}
}

func TestRESTFilesAndGit(t *testing.T) {
	a := startAgent(t)
	dir := filepath.Join(a.workDir, "repo")
	code, body := a.do(t, "PUT", "/v1/files"+dir+"/hello.txt?parents=true", "hello world\n")
	if code/100 != 2 {
		t.Fatalf("put: %d %s", code, body)
	}
	code, body = a.do(t, "GET", "/v1/files"+dir+"/hello.txt", nil)
	if code != 200 || string(body) != "hello world\n" {
		t.Fatalf("get: %d %q", code, body)
	}
	code, body = a.do(t, "GET", "/v1/fs:list?path="+dir+"&depth=2", nil)
	if code != 200 || !bytes.Contains(body, []byte("hello.txt")) {
		t.Fatalf("list: %d %s", code, body)
	}
	git := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-C", dir}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	git("init", "-q", "-b", "main")
	git("add", ".")
	git("commit", "-q", "-m", "init")
	a.do(t, "PUT", "/v1/files"+dir+"/hello.txt", "hello berth\n")
	code, body = a.do(t, "GET", "/v1/git/status?repo="+dir, nil)
	if code != 200 || !bytes.Contains(body, []byte("CHANGE_KIND_MODIFIED")) || !bytes.Contains(body, []byte(`"branch":"main"`)) {
		t.Fatalf("status: %d %s", code, body)
	}
	code, body = a.do(t, "GET", "/v1/git/diff?repo="+dir, nil)
	if code != 200 || !bytes.Contains(body, []byte(`+hello berth`)) {
		t.Fatalf("diff: %d %s", code, body)
	}
	code, body = a.do(t, "POST", "/v1/fs:move", map[string]any{"source": dir + "/hello.txt", "destination": dir + "/moved.txt"})
	if code != 200 {
		t.Fatalf("move: %d %s", code, body)
	}
	code, body = a.do(t, "POST", "/v1/fs:remove", map[string]any{"path": dir + "/moved.txt"})
	if code != 200 {
		t.Fatalf("remove: %d %s", code, body)
	}
	if _, err := os.Stat(dir + "/moved.txt"); !os.IsNotExist(err) {
		t.Fatalf("moved.txt still there: %v", err)
	}
	code, body = a.do(t, "GET", "/v1/git/status?repo="+a.workDir, nil)
	if code != 400 || !bytes.Contains(body, []byte("not a git repository")) {
		t.Errorf("status of non-repo: %d %s", code, body)
	}
}

func TestGRPCExecOverSharedPort(t *testing.T) {
	a := startAgent(t)
	ctx := authed(context.Background(), testToken)
	res, err := agentv1.NewProcessServiceClient(a.conn).Exec(ctx, &agentv1.ExecRequest{Argv: []string{"sh", "-c", "printf abc"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "abc" {
		t.Fatalf("exec = %v", res)
	}
	_, err = agentv1.NewProcessServiceClient(a.conn).Exec(ctx, &agentv1.ExecRequest{})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "argv") {
		t.Fatalf("empty exec err = %v", err)
	}
}

func TestNewRequiresToken(t *testing.T) {
	if _, err := agent.New(agent.Config{WorkDir: t.TempDir()}); err == nil {
		t.Fatal("New without token or NoAuth succeeded")
	}
}

func TestCommandsAreOOMKilledBeforeTheAgent(t *testing.T) {
	a := startAgent(t)
	_, body := a.do(t, "POST", "/v1/exec", map[string]any{"command": "sleep 0.1; cat /proc/self/oom_score_adj"})
	if !bytes.Contains(body, []byte(`"stdout":"500\n"`)) {
		t.Fatalf("oom_score_adj of a command = %s, want 500", body)
	}
}

// TestRESTExecRunsTheInterceptors: REST's Exec is called in-process
// (direct.go), still through the gRPC server's interceptors: the exec is
// timed in the metrics, and a failure keeps its gRPC code there.
func TestRESTExecRunsTheInterceptors(t *testing.T) {
	a := startAgent(t)
	if code, body := a.do(t, "POST", "/v1/exec", map[string]any{"argv": []string{"true"}}); code != 200 {
		t.Fatalf("exec: %d %s", code, body)
	}
	if code, body := a.do(t, "POST", "/v1/exec", map[string]any{"argv": []string{"true"}, "cwd": "/no/such/dir"}); code != 400 {
		t.Fatalf("exec in a missing cwd: %d %s, want 400", code, body)
	}
	code, body := a.do(t, "GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("metrics: %d %s", code, body)
	}
	for _, want := range []string{`code="OK"`, `code="FailedPrecondition"`} {
		found := false
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "berth_agent_exec_duration_seconds_count{") && strings.Contains(line, want) && strings.Contains(line, `"exec"`) && strings.HasSuffix(line, " 1") {
				found = true
			}
		}
		if !found {
			t.Errorf("no exec counted with %s in the metrics:\n%s", want, body)
		}
	}
}
