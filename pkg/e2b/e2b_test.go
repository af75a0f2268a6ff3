package e2b_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/e2b"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

const (
	keyA  = orchtest.ClientAToken
	keyB  = orchtest.ClientBToken
	keyOp = orchtest.OperatorToken
)

// api is a test orchestrator (in-process runtime) seen through its E2B
// handler.
type api struct {
	orch *orchtest.Server
	base string
}

func start(t *testing.T, mutate func(*orchestrator.Config)) api {
	t.Helper()
	o := orchtest.Start(t, func(c *orchestrator.Config) {
		c.E2BDomain = "e2b.localhost"
		c.E2BTemplates = map[string]string{"minimal": "berth/minimal"}
		if mutate != nil {
			mutate(c)
		}
	})
	srv := httptest.NewServer(o.Srv.E2BHandler())
	t.Cleanup(srv.Close)
	return api{orch: o, base: srv.URL}
}

type answer struct {
	code   int
	header http.Header
	body   string
	m      map[string]any
	list   []map[string]any
}

func (a api) do(t *testing.T, key, method, path, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(e2b.KeyHeader, key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	an := answer{code: res.StatusCode, header: res.Header, body: string(b)}
	if len(b) > 0 && b[0] == '[' {
		_ = json.Unmarshal(b, &an.list)
	} else {
		_ = json.Unmarshal(b, &an.m)
	}
	return an
}

// create creates a sandbox as key and checks the Sandbox answer.
func (a api) create(t *testing.T, key, body string) map[string]any {
	t.Helper()
	an := a.do(t, key, "POST", "/sandboxes", body)
	if an.code != http.StatusCreated {
		t.Fatalf("create %s: %d %s", body, an.code, an.body)
	}
	m := an.m
	id, _ := m["sandboxID"].(string)
	if id == "" || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789") != "" || m["clientID"] == "" ||
		m["envdVersion"] != e2b.EnvdVersion || m["domain"] != "e2b.localhost" || m["templateID"] == "" {
		t.Fatalf("create answered %s", an.body)
	}
	return m
}

func wantError(t *testing.T, an answer, code int, substr string) {
	t.Helper()
	if an.code != code || an.m["code"] != float64(code) || !strings.Contains(an.m["message"].(string), substr) {
		t.Fatalf("got %d %s, want %d {code, message ~ %q}", an.code, an.body, code, substr)
	}
}

// TestAuth: the API needs a client or the operator token as X-API-Key
// (not a lease token); /health needs none.
func TestAuth(t *testing.T) {
	a := start(t, nil)
	if an := a.do(t, "", "GET", "/health", ""); an.code != http.StatusNoContent {
		t.Fatalf("health: %d %s", an.code, an.body)
	}
	wantError(t, a.do(t, "", "GET", "/v2/sandboxes", ""), 401, "X-API-Key")
	wantError(t, a.do(t, "wrong", "POST", "/sandboxes", `{"templateID":"base"}`), 401, "X-API-Key")
	sb := a.create(t, keyA, `{"templateID":"base","secure":true}`)
	tok := sb["envdAccessToken"].(string)
	wantError(t, a.do(t, tok, "GET", "/v2/sandboxes", ""), 401, "X-API-Key")
	wantError(t, a.do(t, keyA, "GET", "/templates", ""), 404, "no route")
}

// TestCreate maps a NewSandbox onto a lease: template alias to image,
// metadata to labels, envVars to env, timeout to TTL, secure to an
// envdAccessToken that is the lease's token.
func TestCreate(t *testing.T) {
	a := start(t, nil)
	before := time.Now()
	sb := a.create(t, keyA, `{"templateID":"base","timeout":120,"metadata":{"user":"abc"},"envVars":{"GREETING":"hi"},"secure":true}`)
	id := sb["sandboxID"].(string)
	m := a.orch.Srv.Manager()
	if lid, ok := m.Tokens().VerifyToken(sb["envdAccessToken"].(string)); !ok || lid != id {
		t.Fatalf("envdAccessToken opens lease %q (%v), want %s", lid, ok, id)
	}
	l, err := m.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if l.Image != "berth/e2b" || l.Owner != "team-a" || l.Labels["user"] != "abc" || l.Env["GREETING"] != "hi" ||
		l.Labels[e2b.LabelSecure] != "true" {
		t.Fatalf("lease %+v", l)
	}
	if d := l.ExpiresAt.Sub(before); d < 119*time.Second || d > 125*time.Second {
		t.Fatalf("expires in %s, want 120s", d)
	}
	plain := a.create(t, keyA, `{"templateID":"minimal"}`)
	if _, ok := plain["envdAccessToken"]; ok || plain["templateID"] != "minimal" {
		t.Fatalf("not secure: %v", plain)
	}
	if l, _ := m.Get(t.Context(), plain["sandboxID"].(string)); l.Image != "berth/minimal" {
		t.Fatalf("minimal's image %q", l.Image)
	}
	wantError(t, a.do(t, keyA, "POST", "/sandboxes", `{"templateID":"nope"}`), 400, "templateID")
	wantError(t, a.do(t, keyA, "POST", "/sandboxes", `{}`), 400, "templateID")
	wantError(t, a.do(t, keyA, "POST", "/sandboxes", `{"templateID":"base","timeout":"x"}`), 400, "timeout")
	wantError(t, a.do(t, keyA, "POST", "/sandboxes", `{"templateID":"base","metadata":{"e2b.berth.dev/secure":"false"}}`), 400, "reserved")
	wantError(t, a.do(t, keyA, "POST", "/sandboxes", `{"templateID":"base","network":{"allowOut":["1.1.1.1"]}}`), 400, "network")
}

// TestAcquireMapping: allow_internet_access false is network mode none;
// autoPause makes the timeout an idle timeout that pauses.
func TestAcquireMapping(t *testing.T) {
	h := e2b.New(e2b.Config{PauseMode: "freeze"})
	ar, err := h.AcquireRequestOf(`{"templateID":"base","allow_internet_access":false,"autoPause":true,"timeout":60}`)
	if err != nil {
		t.Fatal(err)
	}
	if ar.GetNetwork().GetMode() != "none" || ar.GetIdlePolicy() != "freeze" || ar.GetIdleTimeout().AsDuration() != time.Minute || ar.GetTtl() != nil || ar.GetImage() != "berth/e2b" {
		t.Fatalf("%v", ar)
	}
	ar, err = h.AcquireRequestOf(`{"templateID":"base","allow_internet_access":true,"timeout":60}`)
	if err != nil {
		t.Fatal(err)
	}
	if ar.GetNetwork() != nil || ar.GetIdlePolicy() != "" || ar.GetTtl().AsDuration() != time.Minute {
		t.Fatalf("%v", ar)
	}
}

func ids(list []map[string]any) []string {
	var out []string
	for _, s := range list {
		out = append(out, s["sandboxID"].(string))
	}
	return out
}

// TestListAndOwners: each key lists its own sandboxes only, filtered by
// metadata and state, a page at a time; another owner's sandbox is not
// found; leases made without this API are not sandboxes.
func TestListAndOwners(t *testing.T) {
	a := start(t, nil)
	s1 := a.create(t, keyA, `{"templateID":"base","metadata":{"app":"prod","user":"a b"}}`)["sandboxID"].(string)
	s2 := a.create(t, keyA, `{"templateID":"base","metadata":{"app":"dev"}}`)["sandboxID"].(string)
	op := a.create(t, keyOp, `{"templateID":"base"}`)["sandboxID"].(string)

	an := a.do(t, keyA, "GET", "/v2/sandboxes", "")
	if an.code != 200 || len(an.list) != 2 {
		t.Fatalf("list A: %d %s", an.code, an.body)
	}
	for _, s := range an.list {
		for _, k := range []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion", "metadata"} {
			if _, ok := s[k]; !ok {
				t.Errorf("listed sandbox lacks %s: %v", k, s)
			}
		}
		if s["state"] != "running" {
			t.Errorf("state %v", s["state"])
		}
		if md := s["metadata"].(map[string]any); md[e2b.LabelTemplate] != nil || md[e2b.LabelSecure] != nil {
			t.Errorf("metadata shows berth's labels: %v", md)
		}
	}
	q := url.Values{"metadata": {"app=prod&user=a%20b"}}.Encode()
	if an := a.do(t, keyA, "GET", "/v2/sandboxes?"+q, ""); len(an.list) != 1 || an.list[0]["sandboxID"] != s1 {
		t.Fatalf("metadata filter: %s", an.body)
	}
	if an := a.do(t, keyA, "GET", "/sandboxes?metadata="+url.QueryEscape("app=dev"), ""); len(an.list) != 1 || an.list[0]["sandboxID"] != s2 {
		t.Fatalf("v1 metadata filter: %s", an.body)
	}
	if an := a.do(t, keyA, "GET", "/v2/sandboxes?state=paused", ""); an.code != 200 || len(an.list) != 0 {
		t.Fatalf("paused: %s", an.body)
	}
	wantError(t, a.do(t, keyA, "GET", "/v2/sandboxes?state=dead", ""), 400, "state")
	wantError(t, a.do(t, keyA, "GET", "/v2/sandboxes?limit=101", ""), 400, "limit")

	// Pages of one.
	var seen []string
	next := ""
	for range 4 {
		an := a.do(t, keyA, "GET", "/v2/sandboxes?limit=1&nextToken="+url.QueryEscape(next), "")
		seen = append(seen, ids(an.list)...)
		if next = an.header.Get(e2b.NextTokenHeader); next == "" {
			break
		}
	}
	if len(seen) != 2 || seen[0] == seen[1] {
		t.Fatalf("pages gave %v", seen)
	}

	// Team B sees nothing of team A's, nor of the operator's.
	if an := a.do(t, keyB, "GET", "/v2/sandboxes", ""); an.code != 200 || len(an.list) != 0 {
		t.Fatalf("list B: %s", an.body)
	}
	if an := a.do(t, keyB, "GET", "/sandboxes", ""); an.code != 200 || len(an.list) != 0 {
		t.Fatalf("list v1 B: %s", an.body)
	}
	for _, path := range []string{"/sandboxes/" + s1, "/sandboxes/" + op} {
		wantError(t, a.do(t, keyB, "GET", path, ""), 404, "not found")
		wantError(t, a.do(t, keyB, "DELETE", path, ""), 404, "not found")
		wantError(t, a.do(t, keyB, "POST", path+"/pause", ""), 404, "not found")
		wantError(t, a.do(t, keyB, "POST", path+"/connect", `{"timeout":10}`), 404, "not found")
	}
	if an := a.do(t, keyOp, "GET", "/v2/sandboxes", ""); len(an.list) != 1 || an.list[0]["sandboxID"] != op {
		t.Fatalf("operator's list: %s", an.body)
	}

	// A lease acquired through berth's own API is no sandbox here.
	l, _, _, err := a.orch.Srv.Manager().Acquire(t.Context(), leaseReq("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, a.do(t, keyA, "GET", "/sandboxes/"+l.ID, ""), 404, "not found")
	if an := a.do(t, keyA, "GET", "/v2/sandboxes", ""); len(an.list) != 2 {
		t.Fatalf("list with a plain lease: %s", an.body)
	}
}

// TestLifecycle: detail, pause (409 when not running), connect resumes
// (201) and then finds it running (200), resume of a running one is 409,
// timeout sets an absolute deadline (shorter too), refreshes only extend,
// metrics answer, kill ends it.
func TestLifecycle(t *testing.T) {
	a := start(t, nil)
	sb := a.create(t, keyA, `{"templateID":"base","timeout":300,"secure":true,"metadata":{"k":"v"}}`)
	id := sb["sandboxID"].(string)
	p := "/sandboxes/" + id

	d := a.do(t, keyA, "GET", p, "")
	if d.code != 200 || d.m["sandboxID"] != id || d.m["state"] != "running" || d.m["envdAccessToken"] != sb["envdAccessToken"] ||
		d.m["metadata"].(map[string]any)["k"] != "v" || d.m["domain"] != "e2b.localhost" {
		t.Fatalf("detail: %s", d.body)
	}

	if an := a.do(t, keyA, "POST", p+"/pause", ""); an.code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", an.code, an.body)
	}
	wantError(t, a.do(t, keyA, "POST", p+"/pause", ""), 409, "not running")
	if an := a.do(t, keyA, "GET", "/v2/sandboxes?state=paused", ""); len(an.list) != 1 || an.list[0]["state"] != "paused" {
		t.Fatalf("paused list: %s", an.body)
	}
	if an := a.do(t, keyA, "GET", "/sandboxes", ""); len(an.list) != 0 {
		t.Fatalf("v1 lists running only: %s", an.body)
	}
	an := a.do(t, keyA, "POST", p+"/connect", `{"timeout":60}`)
	if an.code != http.StatusCreated || an.m["sandboxID"] != id || an.m["envdAccessToken"] != sb["envdAccessToken"] {
		t.Fatalf("connect to paused: %d %s", an.code, an.body)
	}
	if an := a.do(t, keyA, "POST", p+"/connect", `{"timeout":60}`); an.code != http.StatusOK {
		t.Fatalf("connect to running: %d %s", an.code, an.body)
	}
	wantError(t, a.do(t, keyA, "POST", p+"/resume", `{}`), 409, "running")
	// connect only extends: the 300 s deadline stays.
	if end := endAt(t, a, p); time.Until(end) < 250*time.Second {
		t.Fatalf("connect shortened the deadline to %s", end)
	}

	if an := a.do(t, keyA, "POST", p+"/timeout", `{"timeout":30}`); an.code != http.StatusNoContent {
		t.Fatalf("timeout: %d %s", an.code, an.body)
	}
	if left := time.Until(endAt(t, a, p)); left > 31*time.Second || left < 20*time.Second {
		t.Fatalf("after timeout 30 the sandbox ends in %s", left)
	}
	wantError(t, a.do(t, keyA, "POST", p+"/timeout", `{}`), 400, "timeout")
	if an := a.do(t, keyA, "POST", p+"/refreshes", `{"duration":5}`); an.code != http.StatusNoContent {
		t.Fatalf("refresh: %d %s", an.code, an.body)
	}
	if left := time.Until(endAt(t, a, p)); left < 20*time.Second {
		t.Fatalf("a shorter refresh shortened it: %s", left)
	}
	if an := a.do(t, keyA, "POST", p+"/refreshes", `{"duration":600}`); an.code != http.StatusNoContent {
		t.Fatalf("refresh: %d %s", an.code, an.body)
	}
	if left := time.Until(endAt(t, a, p)); left < 590*time.Second {
		t.Fatalf("refresh 600 left %s", left)
	}
	wantError(t, a.do(t, keyA, "POST", p+"/refreshes", `{"duration":3601}`), 400, "duration")

	if an := a.do(t, keyA, "GET", p+"/metrics", ""); an.code != 200 || !strings.HasPrefix(an.body, "[") {
		t.Fatalf("metrics: %d %s", an.code, an.body)
	}

	if an := a.do(t, keyA, "DELETE", p, ""); an.code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", an.code, an.body)
	}
	wantError(t, a.do(t, keyA, "GET", p, ""), 404, "not found")
	wantError(t, a.do(t, keyA, "DELETE", p, ""), 404, "not found")
}

func endAt(t *testing.T, a api, p string) time.Time {
	t.Helper()
	d := a.do(t, keyA, "GET", p, "")
	end, err := time.Parse(time.RFC3339Nano, d.m["endAt"].(string))
	if err != nil {
		t.Fatalf("endAt of %s: %v", d.body, err)
	}
	return end
}

func leaseReq(owner string) lease.AcquireRequest {
	return lease.AcquireRequest{ConversationID: "plain", Owner: owner}
}
