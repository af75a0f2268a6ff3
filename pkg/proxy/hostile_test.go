package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/lease"
)

// TestTokenCookieStrippedAsRead sends the token cookie in spellings that
// net/http reads as berth_token (white space around the name, quoted value,
// several Cookie headers) and checks that each one authenticates and that
// none reaches the preview app, while the app's own cookies do.
func TestTokenCookieStrippedAsRead(t *testing.T) {
	seen := make(chan *http.Request, 1)
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r
		fmt.Fprint(w, "page")
	}))
	fr := newFakeRouter()
	id := fakeID(7)
	fr.set(id, lease.Route{State: lease.StateReady, Endpoint: "127.0.0.1:7000"})
	e := mountProxy(t, nil, fr, nil)
	tok := fakeToken(id)

	for _, tc := range []struct {
		name    string
		cookies []string
		want    string // the Cookie header the app sees
	}{
		{"plain", []string{"berth_token=" + tok}, ""},
		{"space before =", []string{"berth_token =" + tok}, ""},
		{"space before = among others", []string{"a=1; berth_token =" + tok + "; b=2"}, "a=1; b=2"},
		{"tab before =", []string{"a=1;berth_token\t=" + tok}, "a=1"},
		{"leading space", []string{"a=1;   berth_token=" + tok}, "a=1"},
		{"space after =", []string{"berth_token= " + tok + "; a=1"}, "a=1"},
		{"quoted value", []string{`berth_token="` + tok + `"; a=1`}, "a=1"},
		{"two headers", []string{"a=1", "berth_token =" + tok + "; b=2"}, "a=1; b=2"},
		{"invalid extra token cookie", []string{"berth_token=" + tok, `berth_token ="x y"; c=3`}, "c=3"},
		{"look-alike names kept", []string{"xberth_token=1; berth_tokens=2; berth_token =" + tok}, "xberth_token=1; berth_tokens=2"},
	} {
		r := do(t, "GET", e.srv.URL+"/p", previewHost(id, port), http.Header{"Cookie": tc.cookies}, "")
		if r.code != 200 || string(r.body) != "page" {
			t.Errorf("%s: %d %s, want 200 page", tc.name, r.code, r.body)
			continue
		}
		in := <-seen
		got := strings.Join(in.Header.Values("Cookie"), "; ")
		if got != tc.want || strings.Contains(got, tok) {
			t.Errorf("%s: the app saw Cookie %q, want %q", tc.name, got, tc.want)
		}
	}
	// A spelling that net/http does not read as the token cookie does not
	// authenticate (and so is never forwarded either).
	if r := do(t, "GET", e.srv.URL+"/p", previewHost(id, port), http.Header{"Cookie": {"berth_token_=" + tok}}, ""); r.code != 401 {
		t.Errorf("look-alike name authenticated: %d %s", r.code, r.body)
	}
}

// rawGET sends a GET with target written as is in the request line (no
// client-side escaping) and returns the status and Location.
func rawGET(t *testing.T, addr, host, target string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", target, err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

// TestBootstrapRedirectStaysOnHost checks that the ?berth_token= bootstrap
// redirect never leaves the preview's host: protocol-relative targets,
// backslashes and their percent-encoded forms are normalised to a path.
func TestBootstrapRedirectStaysOnHost(t *testing.T) {
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "page") }))
	fr := newFakeRouter()
	id := fakeID(8)
	fr.set(id, lease.Route{State: lease.StateReady, Endpoint: "127.0.0.1:7000"})
	e := mountProxy(t, nil, fr, nil)
	tok := fakeToken(id)
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	host := previewHost(id, port)
	prefix := fmt.Sprintf("/v1/sandboxes/%s/ports/%d", id, port)

	for _, tc := range []struct {
		host, target, want string
	}{
		{host, "//evil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "//evil.example/x?a=1&berth_token=" + tok, "/evil.example/x?a=1"},
		{host, "///evil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, `/\evil.example/x?berth_token=` + tok, "/evil.example/x"},
		{host, `\\evil.example/x?berth_token=` + tok, ""}, // not a valid request-target: refused or normalised
		{host, "/%2F/evil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "/%2f%2fevil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "/%5C%5Cevil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "/%5c/evil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "/%09/evil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "/%20//evil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "/%0D%0A/evil.example/x?berth_token=" + tok, "/evil.example/x"},
		{host, "http://evil.example/x?berth_token=" + tok, ""}, // absolute-form: the path is /x
		{host, "/app/%2F%2Fkept?berth_token=" + tok, "/app/%2F%2Fkept"},
		// ServeMux cleans this one first (a 307 to the cleaned path).
		{"", prefix + "//evil.example/x?berth_token=" + tok, ""},
		{"", prefix + "/%2F/evil.example/x?berth_token=" + tok, prefix + "/%2F/evil.example/x"},
	} {
		h := tc.host
		if h == "" {
			h = addr
		}
		code, loc := rawGET(t, addr, h, tc.target)
		if tc.want != "" && (code != http.StatusFound || loc != tc.want) {
			t.Errorf("%q: %d %q, want 302 to %q", tc.target, code, loc, tc.want)
		}
		t.Logf("%q: %d %q", tc.target, code, loc)
		if code < 300 || code > 399 {
			continue
		}
		// Whatever it is, a browser resolves it to the same host.
		base, _ := url.Parse("http://" + h + "/here")
		ref, err := url.Parse(strings.ReplaceAll(loc, `\`, `/`))
		if err != nil || base.ResolveReference(ref).Host != h || strings.HasPrefix(loc, "//") || strings.HasPrefix(loc, `/\`) {
			t.Errorf("%q: Location %q leaves the host", tc.target, loc)
		}
	}
}
