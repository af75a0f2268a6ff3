package ohruntime_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/orchestrator/ohruntime"
	"github.com/berth-dev/berth/pkg/runtime"
)

const (
	keyA  = orchtest.ClientAToken
	keyB  = orchtest.ClientBToken
	keyOp = orchtest.OperatorToken
)

// rt is a test orchestrator seen through its runtime API.
type rt struct {
	*orchtest.Server
}

func start(t *testing.T, mutate func(*orchestrator.Config)) rt {
	return rt{orchtest.Start(t, mutate)}
}

type answer struct {
	code int
	body string
	m    map[string]any
}

// do calls the runtime API (path below /openhands/runtime) with key as
// X-API-Key ("" for none).
func (s rt) do(t *testing.T, key, method, path, body string) answer {
	t.Helper()
	return s.raw(t, method, s.Base+strings.TrimSuffix(ohruntime.Prefix, "/")+path, body, map[string]string{ohruntime.KeyHeader: key})
}

func (s rt) raw(t *testing.T, method, url, body string, headers map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	a := answer{code: res.StatusCode, body: string(b)}
	_ = json.Unmarshal(b, &a.m)
	return a
}

// startSession starts session sid as key and checks the answer's shape.
func (s rt) startSession(t *testing.T, key, sid string) answer {
	t.Helper()
	a := s.do(t, key, "POST", "/start", `{"image":"berth/base","command":[],"working_dir":"/","environment":{"GREETING":"hello"},"session_id":"`+sid+`"}`)
	if a.code != 200 {
		t.Fatalf("start %s: %d %s", sid, a.code, a.body)
	}
	id, _ := a.m["runtime_id"].(string)
	if id == "" || a.m["url"] != s.Base+"/v1/sandboxes/"+id || a.m["session_api_key"] == "" ||
		a.m["status"] != "running" || a.m["pod_status"] != "ready" {
		t.Fatalf("start %s: %s", sid, a.body)
	}
	return a
}

func str(a answer, k string) string { s, _ := a.m[k].(string); return s }

// Every route wants X-API-Key with the operator or a client token: none,
// a wrong one, a lease token and a bearer header instead are 401, before
// the body is looked at.
func TestAuth(t *testing.T) {
	s := start(t, nil)
	a := s.startSession(t, keyA, "auth")
	leaseTok := str(a, "session_api_key")
	routes := [][2]string{{"POST", "/start"}, {"GET", "/sessions/auth"}, {"POST", "/pause"}, {"POST", "/resume"}, {"POST", "/stop"}, {"GET", "/image_exists?image=berth/base"}}
	body := `{"session_id":"auth","runtime_id":"` + str(a, "runtime_id") + `"}`
	for _, r := range routes {
		for _, key := range []string{"", "wrong-token-0123456789", leaseTok} {
			if got := s.do(t, key, r[0], r[1], body); got.code != 401 || !strings.Contains(got.body, "X-API-Key") {
				t.Errorf("%s %s with key %q: %d %s", r[0], r[1], key, got.code, got.body)
			}
		}
		if got := s.raw(t, r[0], s.Base+"/openhands/runtime"+r[1], body, map[string]string{"Authorization": "Bearer " + keyA}); got.code != 401 {
			t.Errorf("%s %s with a bearer header: %d %s", r[0], r[1], got.code, got.body)
		}
	}
	// Nothing was paused or stopped by the refused calls.
	if got := s.do(t, keyA, "GET", "/sessions/auth", ""); got.code != 200 || got.m["status"] != "running" {
		t.Fatalf("after refused calls: %d %s", got.code, got.body)
	}
}

// Start is idempotent by session: the same runtime, url and key again; the
// url and key drive the lease's OpenHands surface through the proxy, with
// the environment set.
func TestStartIdempotentAndUsable(t *testing.T) {
	s := start(t, nil)
	a := s.startSession(t, keyA, "conv-1")
	b := s.startSession(t, keyA, "conv-1")
	if str(a, "runtime_id") != str(b, "runtime_id") || str(a, "session_api_key") != str(b, "session_api_key") {
		t.Fatalf("second start: %s, first %s", b.body, a.body)
	}
	url := str(a, "url")
	if h := s.raw(t, "GET", url+"/health", "", nil); h.code != 200 {
		t.Fatalf("health without a key: %d %s", h.code, h.body)
	}
	run := s.raw(t, "POST", url+"/api/bash/execute_bash_command", `{"command":"echo hello","timeout":10}`,
		map[string]string{"X-Session-API-Key": str(a, "session_api_key")})
	if run.code != 200 || run.m["stdout"] != "hello\n" || run.m["exit_code"] != float64(0) {
		t.Fatalf("command through the runtime url: %d %s", run.code, run.body)
	}
	g := s.do(t, keyA, "GET", "/sessions/conv-1", "")
	if g.code != 200 || str(g, "runtime_id") != str(a, "runtime_id") || g.m["url"] != url || g.m["session_api_key"] != a.m["session_api_key"] ||
		g.m["status"] != "running" || g.m["pod_status"] != "ready" || g.m["restart_count"] != float64(0) {
		t.Fatalf("session: %d %s", g.code, g.body)
	}
	if g := s.do(t, keyA, "GET", "/sessions/nope", ""); g.code != 404 {
		t.Fatalf("unknown session: %d %s", g.code, g.body)
	}
}

// Another owner's session is unknown, its runtime_id not found for every
// operation, and its own start of the same session id is its own runtime.
// The operator's sessions are its own too, but it may operate any runtime.
func TestOwnerScoping(t *testing.T) {
	s := start(t, nil)
	a := s.startSession(t, keyA, "shared-name")
	id := str(a, "runtime_id")
	if g := s.do(t, keyB, "GET", "/sessions/shared-name", ""); g.code != 404 {
		t.Fatalf("B reads A's session: %d %s", g.code, g.body)
	}
	for _, op := range []string{"/pause", "/resume", "/stop"} {
		if g := s.do(t, keyB, "POST", op, `{"runtime_id":"`+id+`"}`); g.code != 404 {
			t.Fatalf("B %s A's runtime: %d %s", op, g.code, g.body)
		}
	}
	b := s.startSession(t, keyB, "shared-name")
	if str(b, "runtime_id") == id || str(b, "session_api_key") == str(a, "session_api_key") {
		t.Fatalf("B's start of the same session id got A's runtime: %s", b.body)
	}
	if g := s.do(t, keyOp, "GET", "/sessions/shared-name", ""); g.code != 404 {
		t.Fatalf("the operator reads the clients' session as its own: %d %s", g.code, g.body)
	}
	o := s.startSession(t, keyOp, "shared-name")
	if g := s.do(t, keyOp, "GET", "/sessions/shared-name", ""); g.code != 200 || str(g, "runtime_id") != str(o, "runtime_id") {
		t.Fatalf("the operator's own session: %d %s", g.code, g.body)
	}
	if g := s.do(t, keyOp, "POST", "/stop", `{"runtime_id":"`+id+`"}`); g.code != 200 || g.m["status"] != "stopped" {
		t.Fatalf("the operator stops A's runtime: %d %s", g.code, g.body)
	}
	if g := s.do(t, keyA, "GET", "/sessions/shared-name", ""); g.code != 200 || g.m["status"] != "stopped" {
		t.Fatalf("A's session after the operator's stop: %d %s", g.code, g.body)
	}
}

// Pause (hibernate), resume and stop, each seen in the session; a stopped
// session starts again as a new runtime.
func TestLifecycle(t *testing.T) {
	s := start(t, nil)
	a := s.startSession(t, keyA, "life")
	body := `{"runtime_id":"` + str(a, "runtime_id") + `"}`
	steps := []struct{ path, status, pod string }{
		{"/pause", "paused", "pending"},
		{"/resume", "running", "ready"},
		{"/stop", "stopped", "not found"},
	}
	for _, st := range steps {
		g := s.do(t, keyA, "POST", st.path, body)
		if g.code != 200 || g.m["status"] != st.status || g.m["pod_status"] != st.pod || g.m["runtime_id"] != a.m["runtime_id"] {
			t.Fatalf("%s: %d %s", st.path, g.code, g.body)
		}
		g = s.do(t, keyA, "GET", "/sessions/life", "")
		if g.code != 200 || g.m["status"] != st.status || g.m["pod_status"] != st.pod {
			t.Fatalf("session after %s: %d %s", st.path, g.code, g.body)
		}
		if st.status == "stopped" && g.m["session_api_key"] != nil {
			t.Fatalf("a stopped session shows its key: %s", g.body)
		}
	}
	l, err := s.Srv.Manager().Get(t.Context(), str(a, "runtime_id"))
	if err != nil || !strings.Contains(l.Reason, "OpenHands runtime API") {
		t.Fatalf("released lease: %+v %v", l, err)
	}
	if b := s.startSession(t, keyA, "life"); str(b, "runtime_id") == str(a, "runtime_id") {
		t.Fatalf("start after stop reused the released runtime: %s", b.body)
	}
}

// The pause mode is configurable: freeze on the in-process runtime (which
// cannot freeze) is its FAILED_PRECONDITION.
func TestPauseModeConfigured(t *testing.T) {
	s := start(t, func(c *orchestrator.Config) { c.OpenHandsPauseMode = "freeze" })
	a := s.startSession(t, keyA, "frozen")
	if g := s.do(t, keyA, "POST", "/pause", `{"runtime_id":"`+str(a, "runtime_id")+`"}`); g.code != 400 || !strings.Contains(g.body, "cannot freeze") {
		t.Fatalf("freeze on inproc: %d %s", g.code, g.body)
	}
}

// Bad input is a 4xx naming the field.
func TestBadInput(t *testing.T) {
	s := start(t, func(c *orchestrator.Config) { c.Admission.AllowedImages, c.AllowRootUser = []string{"berth/"}, false })
	cases := []struct {
		path, body string
		code       int
		field      string
	}{
		{"/start", `{"image":"berth/base"}`, 400, "session_id"},
		{"/start", `not json`, 400, "body"},
		{"/start", ``, 400, "body"},
		{"/start", `{"session_id":"x","run_as_user":"10001"}`, 400, "run_as_user"},
		{"/start", `{"session_id":"x","run_as_user":-1}`, 400, "run_as_user"},
		{"/start", `{"session_id":"x","fs_group":10001}`, 400, "fs_group"},
		{"/start", `{"session_id":"x","environment":["A=1"]}`, 400, "environment"},
		{"/start", `{"session_id":"x","environment":{"BERTH_X":"1"}}`, 400, "env"},
		{"/start", `{"session_id":"x","image_pull_policy":"Sometimes"}`, 400, "image_pull_policy"},
		{"/start", `{"session_id":"x","resource_factor":3}`, 400, "resource_factor"},
		{"/start", `{"session_id":"x","working_dir":"rel"}`, 400, "working_dir"},
		{"/start", `{"session_id":"x","image":"debian:12"}`, 403, "image"},
		{"/start", `{"session_id":"x","image":"Not A Ref"}`, 400, "image"},
		{"/start", `{"session_id":"x","run_as_user":0}`, 403, "user"},
		{"/start", `{"session_id":"x","command":7}`, 400, "command"},
		{"/start", `{"session_id":"x","command":["","a"]}`, 400, "command"},
		{"/pause", `{}`, 400, "runtime_id"},
		{"/resume", `{"runtime_id":7}`, 400, "runtime_id"},
		{"/stop", `{"runtime_id":"l-nope"}`, 404, "l-nope"},
		{"/image_exists", ``, 400, "image"},
		{"/image_exists?image=debian:12", ``, 403, "image"},
		{"/image_exists?image=berth/base", ``, 501, "image_exists"},
	}
	for _, c := range cases {
		method := "POST"
		if strings.HasPrefix(c.path, "/image_exists") {
			method = "GET"
		}
		g := s.do(t, keyA, method, c.path, c.body)
		if g.code != c.code || !strings.Contains(str(g, "message"), c.field) {
			t.Errorf("%s %s: %d %s, want %d naming %s", c.path, c.body, g.code, g.body, c.code, c.field)
		}
	}
	// None of the refused starts made a lease.
	if g := s.do(t, keyA, "GET", "/sessions/x", ""); g.code != 404 {
		t.Fatalf("a refused start left a session: %d %s", g.code, g.body)
	}
	// An empty command, string or list, and the fields berth ignores are
	// accepted.
	g := s.do(t, keyA, "POST", "/start", `{"session_id":"ok","image":"berth/base","command":"","run_as_user":1000,"fs_group":1000,`+
		`"image_pull_policy":"Always","runtime_class":"sysbox-runc","resource_factor":2,"working_dir":"/"}`)
	if g.code != 200 {
		t.Fatalf("start with ignored fields: %d %s", g.code, g.body)
	}
	l, err := s.Srv.Manager().Get(t.Context(), str(g, "runtime_id"))
	if err != nil || l.User != "1000:1000" || l.Owner != "team-a" || l.ConversationID != "ok" {
		t.Fatalf("lease of the start: %+v %v", l, err)
	}
	// resource_factor scales the default CPUs and memory (1, 512 MiB), up
	// to the maximum (4 CPUs).
	if l.Resources.NanoCPUs != 2e9 || l.Resources.MemoryBytes != 1<<30 {
		t.Fatalf("resource_factor 2: %+v", l.Resources)
	}
	g = s.do(t, keyA, "POST", "/start", `{"session_id":"big","resource_factor":8}`)
	if l, err = s.Srv.Manager().Get(t.Context(), str(g, "runtime_id")); err != nil || l.Resources.NanoCPUs != 4e9 || l.Resources.MemoryBytes != 4<<30 {
		t.Fatalf("resource_factor 8: %d %s %+v %v", g.code, g.body, l.Resources, err)
	}
}

// A runtime whose sandbox could not be made: start answers the error, and
// the session says failed with the reason in pod_logs (what the client
// prints before it gives up).
func TestFailedRuntime(t *testing.T) {
	s := start(t, nil)
	s.Runtime.CreateHook = func(context.Context, runtime.Spec) error {
		return errdefs.Newf(errdefs.ErrUnavailable, "engine on fire")
	}
	if a := s.do(t, keyA, "POST", "/start", `{"session_id":"doomed"}`); a.code != 503 || !strings.Contains(a.body, "engine on fire") {
		t.Fatalf("start: %d %s", a.code, a.body)
	}
	g := s.do(t, keyA, "GET", "/sessions/doomed", "")
	if g.code != 200 || g.m["status"] != "stopped" || g.m["pod_status"] != "failed" || !strings.Contains(str(g, "pod_logs"), "engine on fire") {
		t.Fatalf("session of a failed start: %d %s", g.code, g.body)
	}
}

// A start beyond the owner's live leases is a 429 with Retry-After, as an
// acquire is.
func TestStartLimited(t *testing.T) {
	s := start(t, func(c *orchestrator.Config) { c.Admission.MaxLivePerOwner = 1 })
	s.startSession(t, keyA, "first")
	req, _ := http.NewRequest("POST", s.Base+"/openhands/runtime/start", strings.NewReader(`{"session_id":"second"}`))
	req.Header.Set(ohruntime.KeyHeader, keyA)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 429 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("second start: %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
}

// A start with a command makes a lease with an app: the command (a list, or
// a string run by /bin/sh -c), working_dir as its directory, the
// operator's app port, and the session key (the lease token) as its key.
func TestStartWithCommand(t *testing.T) {
	s := start(t, func(c *orchestrator.Config) { c.OpenHandsAppPort = 8123 })
	specs := make(chan runtime.Spec, 2)
	s.Runtime.CreateHook = func(_ context.Context, spec runtime.Spec) error {
		specs <- spec
		return nil
	}
	g := s.do(t, keyA, "POST", "/start", `{"session_id":"app","command":["/usr/local/bin/openhands-agent-server","--x"],"working_dir":"/srv"}`)
	if g.code != 200 {
		t.Fatalf("start: %d %s", g.code, g.body)
	}
	spec := <-specs
	if a := spec.App; a == nil || strings.Join(a.Command, " ") != "/usr/local/bin/openhands-agent-server --x" ||
		a.Port != 8123 || a.WorkDir != "/srv" || a.Key != str(g, "session_api_key") {
		t.Fatalf("app of the spec: %+v", spec.App)
	}
	l, err := s.Srv.Manager().Get(t.Context(), str(g, "runtime_id"))
	if err != nil || l.App == nil || l.App.WorkDir != "/srv" {
		t.Fatalf("lease: %+v %v", l.App, err)
	}
	g = s.do(t, keyA, "POST", "/start", `{"session_id":"app-str","command":"server --port 8000"}`)
	if spec = <-specs; g.code != 200 || spec.App == nil || strings.Join(spec.App.Command, "|") != "/bin/sh|-c|server --port 8000" || spec.App.Port != 8123 {
		t.Fatalf("string command: %d %s %+v", g.code, g.body, spec.App)
	}
}
