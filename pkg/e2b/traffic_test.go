package e2b

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/agent/envd"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
)

// Lease ids of the fakes (the shape of lease ids).
const (
	secureID = "06h4epjmh87fofg046qjubqq20"
	plainID  = "06h4epjmh87fofg046qjubqq21"
	berthID  = "06h4epjmh87fofg046qjubqq22" // made without the E2B API
	endedID  = "06h4epjmh87fofg046qjubqq23"
	otherID  = "06h4epjmh87fofg046qjubqq24" // a secure one of someone else
)

// fakeSandboxes is both the Sandboxes and the Tokens of a Traffic.
type fakeSandboxes map[string]lease.Lease

func (f fakeSandboxes) Get(_ context.Context, id string) (lease.Lease, error) {
	l, ok := f[id]
	if !ok {
		return lease.Lease{}, errdefs.NotFound("no lease %s", id)
	}
	return l, nil
}
func (f fakeSandboxes) Token(id string) string      { return "lease-token-" + id }
func (f fakeSandboxes) AgentToken(id string) string { return "agent-token-" + id }

// fakeProxy records what would be forwarded and answers 200 with the
// upstream request's headers.
type fakeProxy struct {
	mu   sync.Mutex
	got  []proxy.PortRequest
	hdrs []http.Header
}

func (p *fakeProxy) ServePort(w http.ResponseWriter, r *http.Request, req proxy.PortRequest) {
	h := r.Header.Clone()
	if req.Header != nil {
		req.Header(h)
	}
	p.mu.Lock()
	p.got = append(p.got, req)
	p.hdrs = append(p.hdrs, h)
	p.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (p *fakeProxy) last(t *testing.T) (proxy.PortRequest, http.Header) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) == 0 {
		t.Fatal("nothing was forwarded")
	}
	return p.got[len(p.got)-1], p.hdrs[len(p.hdrs)-1]
}

func (p *fakeProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.got)
}

func trafficServer(t *testing.T) (*httptest.Server, *fakeProxy, *Traffic) {
	t.Helper()
	sb := fakeSandboxes{
		secureID: {ID: secureID, State: lease.StateReady, Labels: map[string]string{LabelTemplate: "base", LabelSecure: "true"}},
		plainID:  {ID: plainID, State: lease.StatePaused, Labels: map[string]string{LabelTemplate: "base", LabelSecure: "false"}},
		berthID:  {ID: berthID, State: lease.StateReady},
		endedID:  {ID: endedID, State: lease.StateReleased, Labels: map[string]string{LabelTemplate: "base"}},
		otherID:  {ID: otherID, State: lease.StateReady, Labels: map[string]string{LabelTemplate: "base", LabelSecure: "true"}},
	}
	px := &fakeProxy{}
	tr := &Traffic{Sandboxes: sb, Tokens: sb, Proxy: px, Logger: slog.New(slog.DiscardHandler)}
	h := New(Config{Domain: "e2b.localhost", Traffic: tr, Authenticate: func(string) Caller { return Nobody }})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, px, tr
}

func send(t *testing.T, srv *httptest.Server, method, path, host string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestTrafficRouting: the E2b-Sandbox-Id/-Port headers and PORT-ID.DOMAIN
// hosts route to the sandbox's port; envd's port gets the agent's token,
// the routing headers are removed.
func TestTrafficRouting(t *testing.T) {
	srv, px, _ := trafficServer(t)
	code, body := send(t, srv, "POST", "/process.Process/Start", "", map[string]string{
		SandboxIDHeader: plainID, SandboxPortHeader: "49983", "Authorization": "Basic dXNlcjo="})
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	req, h := px.last(t)
	if req.LeaseID != plainID || req.Port != EnvdPort || h.Get(envd.AccessTokenHeader) != "agent-token-"+plainID ||
		h.Get(SandboxIDHeader) != "" || h.Get(SandboxPortHeader) != "" || h.Get("Authorization") != "Basic dXNlcjo=" {
		t.Fatalf("forwarded %+v with %v", req, h)
	}
	// Any other port, by host: no agent token.
	if code, body := send(t, srv, "GET", "/index.html", "8080-"+plainID+".e2b.localhost:1234", nil); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	req, h = px.last(t)
	if req.LeaseID != plainID || req.Port != 8080 || h.Get(envd.AccessTokenHeader) != "" {
		t.Fatalf("forwarded %+v with %v", req, h)
	}
	// A client's X-Access-Token never reaches another port.
	send(t, srv, "GET", "/", "49983-"+plainID+".e2b.localhost", map[string]string{envd.AccessTokenHeader: "mine"})
	if req, h = px.last(t); req.Port != EnvdPort || h.Get(envd.AccessTokenHeader) != "agent-token-"+plainID {
		t.Fatalf("forwarded %+v with %v", req, h)
	}
	// A host outside the domain is the API (which wants a key).
	n := px.count()
	if code, _ := send(t, srv, "GET", "/v2/sandboxes", "8080-"+plainID+".example.com", nil); code != 401 || px.count() != n {
		t.Fatalf("outside the domain: %d, forwarded %d", code, px.count()-n)
	}
	if code, _ := send(t, srv, "GET", "/", "", map[string]string{SandboxIDHeader: plainID, SandboxPortHeader: "0x50"}); code != 400 || px.count() != n {
		t.Fatalf("bad port: %d", code)
	}
}

// TestTrafficNotFound: an unknown, ended or non-E2B lease is E2B's 502.
func TestTrafficNotFound(t *testing.T) {
	srv, px, _ := trafficServer(t)
	for _, id := range []string{"nosuchsandbox", "06h4epjmh87fofg046qjubqq99", berthID, endedID} {
		code, body := send(t, srv, "GET", "/health", "", map[string]string{SandboxIDHeader: id, SandboxPortHeader: "49983"})
		var m map[string]string
		_ = json.Unmarshal([]byte(body), &m)
		if code != http.StatusBadGateway || m["message"] != "The sandbox was not found" || m["sandboxId"] != id {
			t.Errorf("%s: %d %s", id, code, body)
		}
	}
	if px.count() != 0 {
		t.Fatalf("forwarded %d", px.count())
	}
}

// TestSecureEnvd: a secure sandbox's envd needs its own lease token (not
// another's, not none) or a /files signature made with it; its other ports
// need nothing.
func TestSecureEnvd(t *testing.T) {
	srv, px, tr := trafficServer(t)
	hdr := func(tok string) map[string]string {
		m := map[string]string{SandboxIDHeader: secureID, SandboxPortHeader: "49983"}
		if tok != "" {
			m[envd.AccessTokenHeader] = tok
		}
		return m
	}
	for _, tc := range []struct{ name, tok string }{
		{"none", ""}, {"another sandbox's", "lease-token-" + otherID}, {"the agent's", "agent-token-" + secureID}, {"garbage", "x"},
	} {
		code, body := send(t, srv, "POST", "/process.Process/Start", "", hdr(tc.tok))
		if code != 401 || !strings.Contains(body, `"unauthenticated"`) {
			t.Errorf("%s token: %d %s", tc.name, code, body)
		}
		if code, _ := send(t, srv, "GET", "/files?path=/etc/hostname", "", hdr(tc.tok)); code != 401 {
			t.Errorf("%s token on /files: %d", tc.name, code)
		}
	}
	if px.count() != 0 {
		t.Fatalf("forwarded %d refused requests", px.count())
	}
	if code, body := send(t, srv, "POST", "/process.Process/Start", "", hdr("lease-token-"+secureID)); code != 200 {
		t.Fatalf("own token: %d %s", code, body)
	}
	if _, h := px.last(t); h.Get(envd.AccessTokenHeader) != "agent-token-"+secureID {
		t.Fatalf("upstream token %q", h.Get(envd.AccessTokenHeader))
	}
	// Signed /files URLs (no header): made with the lease token, unexpired.
	now := time.Unix(1_800_000_000, 0)
	tr.now = func() time.Time { return now }
	exp := now.Unix() + 60
	sig := envd.Signature("/tmp/a", "read", "user", "lease-token-"+secureID, &exp)
	q := "/files?path=/tmp/a&username=user&signature=" + url.QueryEscape(sig) + "&signature_expiration=" + strconv.FormatInt(exp, 10)
	if code, body := send(t, srv, "GET", q, "", hdr("")); code != 200 {
		t.Fatalf("signed: %d %s", code, body)
	}
	for name, bad := range map[string]string{
		"write with a read signature": "POST " + q,
		"another path":                "GET " + strings.Replace(q, "path=/tmp/a", "path=/tmp/b", 1),
		"another sandbox's signature": "GET /files?path=/tmp/a&username=user&signature=" + envd.Signature("/tmp/a", "read", "user", "lease-token-"+otherID, &exp) + "&signature_expiration=" + strconv.FormatInt(exp, 10),
	} {
		method, path, _ := strings.Cut(bad, " ")
		if code, _ := send(t, srv, method, path, "", hdr("")); code != 401 {
			t.Errorf("%s: %d", name, code)
		}
	}
	now = now.Add(2 * time.Minute)
	if code, body := send(t, srv, "GET", q, "", hdr("")); code != 401 || !strings.Contains(body, "expired") {
		t.Fatalf("expired: %d %s", code, body)
	}
	// Other ports of a secure sandbox are public, as E2B's.
	if code, _ := send(t, srv, "GET", "/", "3000-"+secureID+".e2b.localhost", nil); code != 200 {
		t.Fatalf("port 3000: %d", code)
	}
}
