package proxy_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestPreviewConfined: what a sandbox answers on the orchestrator's origin
// (a path-form preview of a public port, which needs no token, and the
// agent's routes) carries a CSP sandbox without allow-same-origin beside
// the app's own policy; a host-form preview (its own origin) does not; and
// no answer from a sandbox can set one of berth's cookies.
func TestPreviewConfined(t *testing.T) {
	app := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Add("Set-Cookie", "berth_ui=forged; Path=/ui")
		h.Add("Set-Cookie", " berth_token=forged; Path=/")
		h.Add("Set-Cookie", "BERTH_signed=forged")
		h.Add("Set-Cookie", "app=1; Path=/")
		h.Set("Content-Security-Policy", "default-src 'self'")
		h.Set("Content-Type", "text/html")
		fmt.Fprint(w, "<script>window.open('/ui/')</script>")
	}))
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "confined", fmt.Sprintf(`,"publicPorts":[%d]`, app))

	check := func(name string, r reply, sandboxed bool) {
		t.Helper()
		if r.code != http.StatusOK {
			t.Fatalf("%s: HTTP %d %s", name, r.code, r.body)
		}
		csp := r.header.Values("Content-Security-Policy")
		var sb []string
		for _, v := range csp {
			if strings.HasPrefix(v, "sandbox") {
				sb = append(sb, v)
			}
		}
		switch {
		case sandboxed && len(sb) != 1:
			t.Errorf("%s: CSP %q, want one sandbox policy", name, csp)
		case sandboxed && strings.Contains(sb[0], "allow-same-origin"):
			t.Errorf("%s: CSP %q allows the same origin", name, sb[0])
		case sandboxed && !strings.Contains(sb[0], "allow-scripts"):
			t.Errorf("%s: CSP %q: the page's scripts would not run", name, sb[0])
		case !sandboxed && len(sb) != 0:
			t.Errorf("%s: CSP %q on a preview of its own origin", name, csp)
		}
		if !slices.Contains(csp, "default-src 'self'") {
			t.Errorf("%s: the app's own CSP is gone: %q", name, csp)
		}
		if c := r.header.Values("Set-Cookie"); !slices.Equal(c, []string{"app=1; Path=/"}) {
			t.Errorf("%s: Set-Cookie %q, want the app's own only", name, c)
		}
	}
	check("path form", do(t, "GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/", e.srv.URL, id, app), "", nil, ""), true)
	check("host form", do(t, "GET", e.srv.URL+"/", previewHost(id, app), nil, ""), false)

	// An agent route is on the orchestrator's origin too.
	r := do(t, "GET", e.sandboxURL(id, "/v1/info"), "", bearerHdr(tok), "")
	if r.code != http.StatusOK || !slices.ContainsFunc(r.header.Values("Content-Security-Policy"), func(v string) bool { return strings.HasPrefix(v, "sandbox ") }) {
		t.Errorf("agent route: HTTP %d, CSP %q", r.code, r.header.Values("Content-Security-Policy"))
	}
	// And so is the proxy's own answer when nothing listens.
	r = do(t, "GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/1/", e.srv.URL, id), "", bearerHdr(tok), "")
	if r.code != http.StatusBadGateway || len(r.header.Values("Content-Security-Policy")) != 1 {
		t.Errorf("nothing on the port: HTTP %d, CSP %q", r.code, r.header.Values("Content-Security-Policy"))
	}
}
