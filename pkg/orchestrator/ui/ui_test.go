package ui_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/orchestrator/ui"
)

// client is a cookie-less HTTP client of one test orchestrator; tests set
// the cookie and headers themselves, as a browser would.
type client struct {
	t    *testing.T
	base string
	http *http.Client
}

func newClient(t *testing.T) (*client, *orchtest.Server) {
	s := orchtest.Start(t, nil)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(hc.CloseIdleConnections)
	return &client{t: t, base: s.Base, http: hc}, s
}

type resp struct {
	code int
	h    http.Header
	body string
}

func (c *client) do(method, path, body string, h map[string]string) resp {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	r, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	if r.StatusCode == http.StatusSwitchingProtocols {
		return resp{r.StatusCode, r.Header, ""} // a WebSocket: not read
	}
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, r.Header, string(b)}
}

// session is a signed-in browser tab: its cookie and CSRF value.
type session struct {
	cookie, csrf, role, owner string
}

func (c *client) login(tok string, h map[string]string) (resp, session) {
	c.t.Helper()
	hh := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	for k, v := range h {
		hh[k] = v
	}
	r := c.do("POST", "/ui/login", url.Values{"token": {tok}}.Encode(), hh)
	var s session
	if r.code != 200 {
		return r, s
	}
	var info struct{ Role, Owner, CSRF string }
	if err := json.Unmarshal([]byte(r.body), &info); err != nil {
		c.t.Fatalf("login answer %q: %v", r.body, err)
	}
	s.role, s.owner, s.csrf = info.Role, info.Owner, info.CSRF
	for _, sc := range r.h.Values("Set-Cookie") {
		if ck, err := http.ParseSetCookie(sc); err == nil && ck.Name == ui.CookieName {
			s.cookie = ck.Name + "=" + ck.Value
		}
	}
	return r, s
}

func (c *client) mustLogin(tok string) session {
	c.t.Helper()
	r, s := c.login(tok, nil)
	if r.code != 200 || s.cookie == "" || s.csrf == "" {
		c.t.Fatalf("login: HTTP %d %s (cookie %q)", r.code, r.body, s.cookie)
	}
	return s
}

// api calls the shim as the dashboard's JavaScript does.
func (c *client) api(s session, method, path, body string) resp {
	c.t.Helper()
	return c.do(method, "/ui/api"+path, body, map[string]string{"Cookie": s.cookie, ui.CSRFHeader: s.csrf,
		"Origin": c.base, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"})
}

// acquire acquires a lease through the REST API with tok and returns its id
// and token.
func (c *client) acquire(tok, conv string) (id, leaseTok string) {
	c.t.Helper()
	r := c.do("POST", "/v1/leases", `{"conversationId":"`+conv+`"}`, map[string]string{"Authorization": "Bearer " + tok})
	if r.code != 200 {
		c.t.Fatalf("acquire %s: HTTP %d %s", conv, r.code, r.body)
	}
	var a struct {
		Lease struct{ ID string }
		Token string
	}
	if err := json.Unmarshal([]byte(r.body), &a); err != nil {
		c.t.Fatal(err)
	}
	return a.Lease.ID, a.Token
}

func TestLoginSetsHttpOnlyStrictCookie(t *testing.T) {
	c, _ := newClient(t)
	r, s := c.login(orchtest.OperatorToken, map[string]string{"Origin": c.base})
	if r.code != 200 || s.role != "operator" || s.csrf == "" {
		t.Fatalf("login: HTTP %d %s", r.code, r.body)
	}
	if strings.Contains(r.body, orchtest.OperatorToken) {
		t.Fatalf("the login answer holds the token: %s", r.body)
	}
	sc := r.h.Get("Set-Cookie")
	for _, want := range []string{"HttpOnly", "SameSite=Strict", "Path=/ui"} {
		if !strings.Contains(sc, want) {
			t.Errorf("Set-Cookie %q lacks %s", sc, want)
		}
	}
	if strings.Contains(sc, "Secure") {
		t.Errorf("Set-Cookie %q is Secure over plain HTTP", sc)
	}
	// Behind a TLS-terminating proxy the cookie is Secure.
	r, _ = c.login(orchtest.OperatorToken, map[string]string{"X-Forwarded-Proto": "https"})
	if sc := r.h.Get("Set-Cookie"); !strings.Contains(sc, "Secure") {
		t.Errorf("Set-Cookie %q over TLS lacks Secure", sc)
	}
	// A client token signs in as its owner.
	if s := c.mustLogin(orchtest.ClientAToken); s.role != "client" || s.owner != "team-a" {
		t.Errorf("client sign-in: role %q owner %q", s.role, s.owner)
	}
}

func TestLoginRefusals(t *testing.T) {
	c, _ := newClient(t)
	_, leaseTok := c.acquire(orchtest.OperatorToken, "login-refusals")
	for _, tc := range []struct {
		name, tok string
		h         map[string]string
		code      int
		msg       string
	}{
		{"empty", "", nil, 400, "token"},
		{"unknown", "not-a-token-0123456789", nil, 401, "token"},
		{"lease token", leaseTok, nil, 401, "token"},
		{"another site's form", orchtest.OperatorToken, map[string]string{"Origin": "http://evil.example"}, 403, "another site"},
		{"cross-site fetch", orchtest.OperatorToken, map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "another site"},
	} {
		r, _ := c.login(tc.tok, tc.h)
		if r.code != tc.code || !strings.Contains(r.body, tc.msg) {
			t.Errorf("%s: HTTP %d %s, want %d naming %q", tc.name, r.code, r.body, tc.code, tc.msg)
		}
		if r.h.Get("Set-Cookie") != "" {
			t.Errorf("%s: a cookie was set", tc.name)
		}
	}
}

func TestShimNeedsCookieAndCSRF(t *testing.T) {
	c, _ := newClient(t)
	s := c.mustLogin(orchtest.OperatorToken)
	if r := c.api(s, "GET", "/v1/leases", ""); r.code != 200 || !strings.Contains(r.body, `"leases"`) {
		t.Fatalf("shim list: HTTP %d %s", r.code, r.body)
	}
	if r := c.api(s, "GET", "/session", ""); r.code != 200 || !strings.Contains(r.body, `"operator"`) || strings.Contains(r.body, s.csrf) {
		t.Fatalf("session: HTTP %d %s", r.code, r.body)
	}
	// signIn: the answer tells the dashboard's own page to sign in again;
	// a page of another site is only refused.
	for _, tc := range []struct {
		name   string
		h      map[string]string
		code   int
		signIn string
	}{
		{"no cookie", map[string]string{ui.CSRFHeader: s.csrf}, 401, "required"},
		{"cookie alone", map[string]string{"Cookie": s.cookie}, 403, "required"},
		{"wrong CSRF", map[string]string{"Cookie": s.cookie, ui.CSRFHeader: strings.Repeat("0", len(s.csrf))}, 403, "required"},
		{"another origin", map[string]string{"Cookie": s.cookie, ui.CSRFHeader: s.csrf, "Origin": "http://evil.example"}, 403, ""},
		{"cross-site", map[string]string{"Cookie": s.cookie, ui.CSRFHeader: s.csrf, "Sec-Fetch-Site": "cross-site"}, 403, ""},
		{"bad cookie", map[string]string{"Cookie": ui.CookieName + "=" + "bm9wZQ", ui.CSRFHeader: s.csrf}, 401, "required"},
	} {
		for _, m := range []string{"GET", "POST"} {
			p := "/ui/api/v1/leases"
			if m == "POST" {
				p = "/ui/api/v1/leases:reap"
			}
			r := c.do(m, p, `{"all":true}`, tc.h)
			if r.code != tc.code || r.h.Get(ui.SignInHeader) != tc.signIn {
				t.Errorf("%s %s: HTTP %d (%s: %q) %s, want %d", tc.name, m, r.code, ui.SignInHeader, r.h.Get(ui.SignInHeader), r.body, tc.code)
			}
		}
	}
	// Signing out clears the cookie.
	r := c.do("POST", "/ui/logout", "", map[string]string{"Cookie": s.cookie, "Origin": c.base})
	if ck, err := http.ParseSetCookie(r.h.Get("Set-Cookie")); r.code != 204 || err != nil || ck.Name != ui.CookieName || ck.MaxAge >= 0 || ck.Value != "" {
		t.Errorf("logout: HTTP %d Set-Cookie %q", r.code, r.h.Get("Set-Cookie"))
	}
}

func TestShimClientSeesOwnLeasesOnly(t *testing.T) {
	c, _ := newClient(t)
	mine, _ := c.acquire(orchtest.ClientAToken, "a-conv")
	theirs, _ := c.acquire(orchtest.ClientBToken, "b-conv")
	s := c.mustLogin(orchtest.ClientAToken)

	r := c.api(s, "GET", "/v1/leases?includeEnded=true", "")
	if r.code != 200 || !strings.Contains(r.body, mine) || strings.Contains(r.body, theirs) {
		t.Fatalf("client list: HTTP %d %s", r.code, r.body)
	}
	if r := c.api(s, "GET", "/v1/leases/"+theirs, ""); r.code != 404 {
		t.Errorf("another owner's lease: HTTP %d %s, want 404", r.code, r.body)
	}
	if r := c.api(s, "POST", "/v1/leases:reap", `{"all":true}`); r.code != 403 {
		t.Errorf("client reap: HTTP %d %s, want 403", r.code, r.body)
	}
	if r := c.api(s, "GET", "/v1/sandboxes/"+theirs+"/v1/processes", ""); r.code != 404 {
		t.Errorf("another owner's processes: HTTP %d %s, want 404", r.code, r.body)
	}
	if r := c.api(s, "GET", "/v1/sandboxes/"+mine+"/v1/processes", ""); r.code != 200 || !strings.Contains(r.body, `"processes"`) {
		t.Errorf("own processes: HTTP %d %s", r.code, r.body)
	}
	// Renew and release go through the API with the client's token.
	if r := c.api(s, "POST", "/v1/leases/"+mine+":renew", `{}`); r.code != 200 {
		t.Errorf("renew: HTTP %d %s", r.code, r.body)
	}
	if r := c.api(s, "DELETE", "/v1/leases/"+mine+"?reason=from+the+test", ""); r.code != 200 || !strings.Contains(r.body, "LEASE_STATE_RELEASED") {
		t.Errorf("release: HTTP %d %s", r.code, r.body)
	}
}

func TestShimSandboxReadsNeverResume(t *testing.T) {
	c, _ := newClient(t)
	id, _ := c.acquire(orchtest.OperatorToken, "paused-conv")
	s := c.mustLogin(orchtest.OperatorToken)
	if r := c.api(s, "POST", "/v1/leases/"+id+":pause", `{"mode":"hibernate"}`); r.code != 200 {
		t.Fatalf("pause: HTTP %d %s", r.code, r.body)
	}
	if r := c.api(s, "GET", "/v1/sandboxes/"+id+"/v1/processes", ""); r.code != 409 || !strings.Contains(r.body, "PAUSED") {
		t.Errorf("processes of a paused lease: HTTP %d %s, want 409", r.code, r.body)
	}
	if r := c.api(s, "GET", "/v1/leases/"+id, ""); !strings.Contains(r.body, "LEASE_STATE_PAUSED") {
		t.Errorf("the lease is no longer PAUSED: %s", r.body)
	}
	if r := c.api(s, "POST", "/v1/leases/"+id+":resume", `{}`); r.code != 200 || !strings.Contains(r.body, "LEASE_STATE_READY") {
		t.Errorf("resume: HTTP %d %s", r.code, r.body)
	}
}

func TestShimRoutes(t *testing.T) {
	c, _ := newClient(t)
	id, _ := c.acquire(orchtest.OperatorToken, "routes-conv")
	s := c.mustLogin(orchtest.OperatorToken)
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v1/sandboxes/" + id + "/v1/exec"},
		{"GET", "/v1/sandboxes/" + id + "/v1/files/etc/passwd"},
		{"GET", "/healthz"},
		{"GET", "/v1/leases/../sandboxes/" + id + "/v1/exec"},
	} {
		// A path with ".." is redirected to its clean form by net/http
		// first; that form is refused as any other.
		r := c.api(s, tc.method, tc.path, `{"command":"true"}`)
		if loc := r.h.Get("Location"); r.code == 307 && strings.HasPrefix(loc, "/ui/api/") {
			r = c.api(s, tc.method, strings.TrimPrefix(loc, "/ui/api"), `{"command":"true"}`)
		}
		if r.code != 404 {
			t.Errorf("%s %s: HTTP %d %s, want 404", tc.method, tc.path, r.code, r.body)
		}
	}
}

func TestPagesAndHeaders(t *testing.T) {
	c, _ := newClient(t)
	if r := c.do("GET", "/ui", "", nil); r.code != 302 || r.h.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: HTTP %d Location %q", r.code, r.h.Get("Location"))
	}
	r := c.do("GET", "/ui/", "", nil)
	if r.code != 200 || !strings.Contains(r.body, `id="login-form"`) {
		t.Fatalf("GET /ui/: HTTP %d", r.code)
	}
	for k, want := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"} {
		if r.h.Get(k) != want {
			t.Errorf("%s: %q, want %q", k, r.h.Get(k), want)
		}
	}
	if csp := r.h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	for p, ct := range map[string]string{"/ui/static/app.js": "javascript", "/ui/static/app.css": "text/css"} {
		if r := c.do("GET", p, "", nil); r.code != 200 || !strings.Contains(r.h.Get("Content-Type"), ct) {
			t.Errorf("GET %s: HTTP %d %q", p, r.code, r.h.Get("Content-Type"))
		}
	}
	for _, p := range []string{"/ui/static/", "/ui/nope", "/ui/ui.go", "/ui/static/ui.go"} {
		if r := c.do("GET", p, "", nil); r.code != 404 {
			t.Errorf("GET %s: HTTP %d, want 404", p, r.code)
		}
	}
}

func TestTerminalUpgradeNeedsCSRFProtocol(t *testing.T) {
	c, _ := newClient(t)
	id, _ := c.acquire(orchtest.OperatorToken, "terminal-conv")
	s := c.mustLogin(orchtest.OperatorToken)
	var info struct{ Terminal bool }
	r := c.api(s, "GET", "/session", "")
	if err := json.Unmarshal([]byte(r.body), &info); err != nil {
		t.Fatal(err)
	}
	upgrade := func(protocols string) resp {
		return c.do("GET", "/ui/api/v1/sandboxes/"+id+"/v1/terminals/ws?argv=sh&rows=24&cols=80", "", map[string]string{
			"Cookie": s.cookie, "Origin": c.base, "Connection": "Upgrade", "Upgrade": "websocket",
			"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": protocols})
	}
	if !info.Terminal {
		// Built without scripts/ui-xterm.sh: no terminal route at all.
		if r := upgrade("berth.terminal.v1, " + ui.CSRFProtocolPrefix + s.csrf); r.code != 404 {
			t.Errorf("terminal upgrade without the terminal built in: HTTP %d %s, want 404", r.code, r.body)
		}
		return
	}
	if r := upgrade("berth.terminal.v1"); r.code != 403 {
		t.Errorf("upgrade without the CSRF subprotocol: HTTP %d %s, want 403", r.code, r.body)
	}
	if r := upgrade("berth.terminal.v1, " + ui.CSRFProtocolPrefix + strings.Repeat("0", len(s.csrf))); r.code != 403 {
		t.Errorf("upgrade with a wrong CSRF subprotocol: HTTP %d %s, want 403", r.code, r.body)
	}
	r = upgrade("berth.terminal.v1, " + ui.CSRFProtocolPrefix + s.csrf)
	if r.code != http.StatusSwitchingProtocols || r.h.Get("Sec-WebSocket-Protocol") != "berth.terminal.v1" {
		t.Errorf("upgrade: HTTP %d, protocol %q, want 101 with berth.terminal.v1", r.code, r.h.Get("Sec-WebSocket-Protocol"))
	}
}

// TestCSRFIsRandomPerSession: two sign-ins with the same token get
// different CSRF values, and neither session's value opens the other: a
// value read once (by a page that should not have it) is worth nothing
// after the operator signs in again. The value is not derived from the
// token.
func TestCSRFIsRandomPerSession(t *testing.T) {
	c, _ := newClient(t)
	a, b := c.mustLogin(orchtest.OperatorToken), c.mustLogin(orchtest.OperatorToken)
	if a.csrf == b.csrf || len(a.csrf) != 64 {
		t.Fatalf("two sign-ins got CSRF values %q and %q: want different random values", a.csrf, b.csrf)
	}
	if a.cookie == b.cookie {
		t.Fatal("two sign-ins got the same session cookie")
	}
	for _, x := range []struct {
		name string
		s    session
		want int
	}{
		{"session a", a, http.StatusOK},
		{"session b", b, http.StatusOK},
		{"a's cookie, b's value", session{cookie: a.cookie, csrf: b.csrf}, http.StatusForbidden},
		{"b's cookie, a's value", session{cookie: b.cookie, csrf: a.csrf}, http.StatusForbidden},
	} {
		if r := c.api(x.s, "GET", "/v1/leases", ""); r.code != x.want {
			t.Errorf("%s: HTTP %d %s, want %d", x.name, r.code, r.body, x.want)
		}
	}
	// A cookie of the old form (the token alone) is no session.
	old := session{cookie: ui.CookieName + "=" + strings.SplitN(strings.TrimPrefix(a.cookie, ui.CookieName+"="), ".", 2)[0], csrf: a.csrf}
	if r := c.api(old, "GET", "/v1/leases", ""); r.code != http.StatusUnauthorized {
		t.Errorf("a cookie without its session value: HTTP %d %s, want 401", r.code, r.body)
	}
}
