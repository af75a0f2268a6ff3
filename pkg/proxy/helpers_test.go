package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
)

const (
	opToken = orchtest.OperatorToken
	domain  = "sandbox.localhost"
)

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is a real orchestrator (in-process agents) with a Proxy over its
// lease manager, served the way the orchestrator mounts it: /v1/sandboxes/
// on a mux, wrapped by HostRouter.
type env struct {
	orch  *orchtest.Server
	proxy *proxy.Proxy
	srv   *httptest.Server
	logs  *logBuffer
}

func newEnv(t testing.TB, mutate func(*proxy.Config)) *env {
	t.Helper()
	orch := orchtest.Start(t, nil)
	return mountProxy(t, orch, orch.Srv.Manager(), mutate)
}

// mountProxy mounts a Proxy over leases. Its tokens are leases' own when
// it has them (the fakes), else those of orch's lease manager.
func mountProxy(t testing.TB, orch *orchtest.Server, leases proxy.LeaseRouter, mutate func(*proxy.Config)) *env {
	t.Helper()
	tokens, ok := leases.(proxy.LeaseTokens)
	if !ok {
		tokens = orch.Srv.Manager().Tokens()
	}
	logs := &logBuffer{}
	cfg := proxy.Config{
		Leases:   leases,
		Tokens:   tokens,
		Operator: bearer.NewSecret(opToken),
		Domain:   domain,
		Logger:   slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(proxy.RoutePrefix, p)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "orchestrator", http.StatusTeapot) })
	srv := httptest.NewServer(p.HostRouter(mux))
	t.Cleanup(func() {
		srv.Close()
		p.Close()
	})
	return &env{orch: orch, proxy: p, srv: srv, logs: logs}
}

type reply struct {
	code   int
	header http.Header
	body   []byte
}

func (r reply) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return m
}

// noRedirect is a client that returns redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// do sends one request; host, when set, overrides the Host header.
func do(t testing.TB, method, url, host string, hdr http.Header, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if host != "" {
		req.Host = host
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

func bearerHdr(tok string) http.Header {
	if tok == "" {
		return http.Header{}
	}
	return http.Header{"Authorization": {"Bearer " + tok}}
}

// acquire acquires a lease through the orchestrator's REST API (operator
// token); extra is added to the JSON body. It returns the id and token.
func (e *env) acquire(t testing.TB, conv, extra string) (string, string) {
	t.Helper()
	return acquireOn(t, e.orch, conv, extra)
}

func acquireOn(t testing.TB, orch *orchtest.Server, conv, extra string) (string, string) {
	t.Helper()
	body := `{"conversationId":"` + conv + `"`
	if !strings.Contains(extra, `"ttl"`) {
		body += `,"ttl":"600s"`
	}
	body += extra + `}`
	r := do(t, "POST", orch.Base+"/v1/leases", "", bearerHdr(opToken), body)
	if r.code != 200 {
		t.Fatalf("acquire %s: %d %s", conv, r.code, r.body)
	}
	m := r.json(t)
	l := m["lease"].(map[string]any)
	if l["state"] != "LEASE_STATE_READY" {
		t.Fatalf("acquire %s: state %v", conv, l["state"])
	}
	return l["id"].(string), m["token"].(string)
}

func (e *env) lease(t testing.TB, id string) lease.Lease {
	t.Helper()
	l, err := e.orch.Srv.Manager().Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// sandboxURL is the proxy URL of an agent path of lease id.
func (e *env) sandboxURL(id, agentPath string) string {
	return e.srv.URL + proxy.RoutePrefix + id + agentPath
}

// previewHost is the host-form preview host of a lease's port.
func previewHost(id string, port int) string {
	return fmt.Sprintf("%d-%s.%s", port, id, domain)
}

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fakeRouter is a LeaseRouter and its LeaseTokens over a fixed table:
// lease tokens are ID + ".tok", agent tokens "agent-" + ID.
type fakeRouter struct {
	mu      sync.Mutex
	routes  map[string]lease.Route
	touches map[string]int
}

func newFakeRouter() *fakeRouter {
	return &fakeRouter{routes: map[string]lease.Route{}, touches: map[string]int{}}
}

func fakeID(n int) string { return fmt.Sprintf("%026d", n) }

func fakeToken(id string) string { return id + ".tok" }

func (f *fakeRouter) set(id string, r lease.Route) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes[id] = r
}

func (f *fakeRouter) VerifyToken(tok string) (string, bool) {
	id, ok := strings.CutSuffix(tok, ".tok")
	return id, ok && lease.ValidID(id)
}

func (f *fakeRouter) Route(id string) (lease.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.routes[id]
	if !ok {
		return lease.Route{}, errdefs.NotFound("lease %s", id)
	}
	return r, nil
}

func (f *fakeRouter) Touch(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.touches[id]++
}

func (f *fakeRouter) touched(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.touches[id]
}

func (f *fakeRouter) AgentToken(id string) string { return "agent-" + id }

// closedPort returns a loopback address nothing listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// listenHTTP serves h on a loopback port (a "port in the sandbox": in-process
// agents live on 127.0.0.1, so previews of their leases reach it) and
// returns the port.
func listenHTTP(t testing.TB, h http.Handler) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}
