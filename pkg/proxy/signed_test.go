package proxy_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
)

// signedEnv is newEnv with the proxy also serving SignedPrefix (as the
// orchestrator mounts it) on srv.
func signedEnv(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t, nil)
	srv := httptest.NewServer(e.proxy)
	t.Cleanup(srv.Close)
	return e, srv.URL
}

func sign(e *env, s lease.SignedScope) string {
	return proxy.SignedPath(s, e.orch.Srv.Manager().Tokens().Sign(s))
}

func TestSignedPreview(t *testing.T) {
	seen := make(chan *http.Request, 16)
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r
		fmt.Fprintf(w, "page %s %s", r.Method, r.URL.Path)
	}))
	e, base := signedEnv(t)
	id, tok := e.acquire(t, "signed-preview", "")
	exp := time.Now().Add(time.Hour)
	any := lease.SignedScope{LeaseID: id, Kind: lease.SignedPort, Port: port, Method: lease.AnyMethod, Expires: exp}
	u := sign(e, any)
	if want := fmt.Sprintf("%s%s/ports/%d/?berth_exp=", proxy.SignedPrefix, id, port); !strings.HasPrefix(u, want) {
		t.Fatalf("signed path %q, want prefix %q", u, want)
	}

	// A plain client: served at once, without any token; the app sees
	// neither the signature nor a berth token.
	appURL := strings.Replace(u, "/?", "/app/x?q=1&", 1)
	r := do(t, "GET", base+appURL, "", http.Header{"Authorization": {"Bearer " + tok}}, "")
	if r.code != 200 || string(r.body) != "page GET /app/x" {
		t.Fatalf("plain GET: %d %s", r.code, r.body)
	}
	in := <-seen
	if in.URL.RawQuery != "q=1" || in.Header.Get("Authorization") != "" || r.header.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("upstream query %q authorization %q; referrer policy %q", in.URL.RawQuery, in.Header.Get("Authorization"), r.header.Get("Referrer-Policy"))
	}
	r = do(t, "POST", base+u, "", nil, "a=b")
	if r.code != 200 || string(r.body) != "page POST /" {
		t.Errorf("POST with an any-method signature: %d %s", r.code, r.body)
	}
	<-seen

	// A browser: the signature becomes a cookie scoped to the port, and
	// the redirect drops it from the address bar.
	r = do(t, "GET", base+appURL, "", http.Header{"Accept": {"text/html,*/*"}}, "")
	prefix := fmt.Sprintf("%s%s/ports/%d/", proxy.SignedPrefix, id, port)
	if r.code != http.StatusFound || r.header.Get("Location") != prefix+"app/x?q=1" {
		t.Fatalf("browser GET: %d Location %q", r.code, r.header.Get("Location"))
	}
	cs := (&http.Response{Header: r.header}).Cookies()
	if len(cs) != 1 || cs[0].Name != proxy.SignedCookie || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteLaxMode ||
		cs[0].Path != prefix || cs[0].Domain != "" || cs[0].Expires.Unix() != exp.Unix() || cs[0].Secure {
		t.Fatalf("cookie %v", r.header["Set-Cookie"])
	}
	if r.header.Get("Cache-Control") != "no-store" || r.header.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("bootstrap headers %v", r.header)
	}
	// Behind a TLS-terminating proxy the cookie is Secure.
	if r := do(t, "GET", base+appURL, "", http.Header{"Accept": {"text/html"}, "X-Forwarded-Proto": {"https"}}, ""); !strings.Contains(r.header.Get("Set-Cookie"), "; Secure") {
		t.Errorf("cookie behind TLS: %v", r.header["Set-Cookie"])
	}
	r = do(t, "GET", base+prefix+"app/y", "", http.Header{"Cookie": {cs[0].Name + "=" + cs[0].Value + "; app=1"}}, "")
	if r.code != 200 || string(r.body) != "page GET /app/y" {
		t.Fatalf("with cookie: %d %s", r.code, r.body)
	}
	if in := <-seen; in.Header.Get("Cookie") != "app=1" {
		t.Errorf("upstream saw cookie %q", in.Header.Get("Cookie"))
	}

	// Scope: another port, another lease, a changed method or expiry, a
	// tampered signature: 403; no signature: 401.
	other, _ := e.acquire(t, "signed-preview-other", "")
	get := any
	get.Method = http.MethodGet
	gu := sign(e, get)
	for _, tc := range []struct {
		name, method, url string
		code              int
		body              string
	}{
		{"other port", "GET", strings.Replace(u, fmt.Sprintf("/ports/%d/", port), fmt.Sprintf("/ports/%d/", port+1), 1), 403, "invalid signature"},
		{"other lease", "GET", strings.Replace(u, id, other, 1), 403, "invalid signature"},
		{"tampered", "GET", u[:len(u)-2] + "xx", 403, "invalid signature"},
		{"expiry moved", "GET", strings.Replace(u, fmt.Sprint(exp.Unix()), fmt.Sprint(exp.Unix()+3600), 1), 403, "invalid signature"},
		{"method added", "POST", u + "&berth_method=POST", 403, "invalid signature"},
		{"GET signature, POST", "POST", gu, 403, "for GET requests, not POST"},
		{"no signature", "GET", prefix, 401, "missing signature"},
		{"malformed expiry", "GET", prefix + "?berth_exp=soon&berth_sig=abc", 403, "not a Unix time"},
	} {
		r := do(t, tc.method, base+tc.url, "", nil, "")
		if r.code != tc.code || !strings.Contains(string(r.body), tc.body) || r.header.Get("Set-Cookie") != "" {
			t.Errorf("%s: %d %q, want %d %q", tc.name, r.code, r.body, tc.code, tc.body)
		}
	}
	if r := do(t, "HEAD", base+gu, "", nil, ""); r.code != 200 {
		t.Errorf("HEAD with a GET signature: %d", r.code)
	}
	<-seen

	// Expired: 403 saying so.
	old := any
	old.Expires = time.Now().Add(-time.Minute)
	r = do(t, "GET", base+sign(e, old), "", nil, "")
	if r.code != 403 || !strings.Contains(string(r.body), "expired at") {
		t.Errorf("expired: %d %s", r.code, r.body)
	}
	// The lease ended: the URL (and its cookie) stop working.
	if _, err := e.orch.Srv.Manager().Release(context.Background(), id, "test"); err != nil {
		t.Fatal(err)
	}
	r = do(t, "GET", base+u, "", nil, "")
	if r.code != http.StatusGone || !strings.Contains(string(r.body), "RELEASED") {
		t.Errorf("after release: %d %s", r.code, r.body)
	}
}

func TestSignedFiles(t *testing.T) {
	e, base := signedEnv(t)
	id, _ := e.acquire(t, "signed-files", "")
	exp := time.Now().Add(time.Hour)
	dir := t.TempDir() // in-process agents use the host's file system
	path := dir + "/report v1.txt"
	up := sign(e, lease.SignedScope{LeaseID: id, Kind: lease.SignedUpload, Path: path, Method: http.MethodPut, Expires: exp})
	down := sign(e, lease.SignedScope{LeaseID: id, Kind: lease.SignedDownload, Path: path, Method: http.MethodGet, Expires: exp})
	if !strings.Contains(down, "/files/") || !strings.Contains(down, "report%20v1.txt?") {
		t.Fatalf("download path %q", down)
	}
	r := do(t, "PUT", base+up+"&mode=0777", "", nil, "hello signed")
	if r.code/100 != 2 {
		t.Fatalf("signed upload: %d %s", r.code, r.body)
	}
	req, _ := http.NewRequest("GET", base+down, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello signed" {
		t.Fatalf("signed download: %d %q", resp.StatusCode, b)
	}
	if cd := resp.Header.Get("Content-Disposition"); !strings.Contains(cd, `filename="report v1.txt"`) {
		t.Errorf("Content-Disposition %q", cd)
	}
	for _, tc := range []struct {
		name, method, url string
		code              int
	}{
		{"download signature used to upload", "PUT", down, 403},
		{"upload signature used to download", "GET", up, 403},
		{"other file", "GET", strings.Replace(down, "report%20v1.txt", "other.txt", 1), 403},
		{"DELETE", "DELETE", down, 405},
		{"unclean path", "GET", strings.Replace(down, "/files/", "/files/x/../", 1), 400},
	} {
		r := do(t, tc.method, base+tc.url, "", nil, "x")
		if r.code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.name, r.code, r.body, tc.code)
		}
	}
	if _, err := e.orch.Srv.Manager().Release(context.Background(), id, "test"); err != nil {
		t.Fatal(err)
	}
	if r := do(t, "GET", base+down, "", nil, ""); r.code != http.StatusGone {
		t.Errorf("download after release: %d %s", r.code, r.body)
	}
}

func TestSignedPathChecks(t *testing.T) {
	for _, p := range []string{"", "rel/x", "/", "/a/../b", "/a//b", "/a/", "/a\x00b"} {
		if _, err := proxy.CleanSignedPath("download", p); err == nil || !strings.Contains(err.Error(), "download") {
			t.Errorf("CleanSignedPath(%q) = %v, want an error naming the field", p, err)
		}
	}
	if p, err := proxy.CleanSignedPath("download", "/workspace/out.tar.gz"); err != nil || p != "/workspace/out.tar.gz" {
		t.Errorf("clean path refused: %q %v", p, err)
	}
	for in, want := range map[string]string{"": "*", "*": "*", "get": "GET", "PUT": "PUT"} {
		if got, err := proxy.SignedMethod("method", in); err != nil || got != want {
			t.Errorf("SignedMethod(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := proxy.SignedMethod("method", "GET /x"); err == nil {
		t.Error("SignedMethod accepted a bad method")
	}
}

// TestSignedWebSocket: an app's WebSocket opens through a signed port URL,
// with the signature in the query or in the signed cookie (what a page
// opened through the URL sends); neither reaches the app.
func TestSignedWebSocket(t *testing.T) {
	seen := make(chan http.Header, 4)
	port := listenHTTP(t, wsEcho(seen))
	e, base := signedEnv(t)
	id, _ := e.acquire(t, "signed-ws", "")
	u := sign(e, lease.SignedScope{LeaseID: id, Kind: lease.SignedPort, Port: port, Method: lease.AnyMethod, Expires: time.Now().Add(time.Hour)})
	path, query, _ := strings.Cut(u, "?")
	addr := strings.TrimPrefix(base, "http://")
	for _, tc := range []struct{ name, target, hdr string }{
		{"query", path + "socket?" + query, ""},
		{"cookie", path + "socket", "Cookie: theme=dark; " + proxy.SignedCookie + "=*." + strings.ReplaceAll(strings.TrimPrefix(query, "berth_exp="), "&berth_sig=", ".") + "\r\n"},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n%s\r\n", tc.target, addr, key, tc.hdr)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("%s: upgrade: %v %v", tc.name, resp, err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := writeFrame(c, 1, []byte("hi"), true); err != nil {
			t.Fatal(err)
		}
		if op, p, err := readFrame(br); err != nil || op != 1 || string(p) != "hi" {
			t.Fatalf("%s: echo: %d %q %v", tc.name, op, p, err)
		}
		c.Close()
		if h := <-seen; strings.Contains(h.Get("Cookie"), proxy.SignedCookie) || h.Get("Authorization") != "" {
			t.Errorf("%s: upstream saw %v", tc.name, h)
		}
	}
}
