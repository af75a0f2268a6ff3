package e2e

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestSignedURLsDocker runs the signed-URL scenario (signedScenario) on a
// Docker sandbox.
func TestSignedURLsDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	acq := o.mustAcquire(t, "signed-"+randHex(4), minimalImage, "600s")
	signedScenario(t, o.api, acq)
}

// TestSignedURLsContainerd runs the same scenario on a containerd sandbox.
func TestSignedURLsContainerd(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	acq := o.acq(t, "signed-ctrd-"+randHex(4), minimalImage, "600s")
	signedScenario(t, o.api, acq)
}

// signedScenario: a busybox httpd in the sandbox is opened with a URL from
// `orchestrator lease sign --port` by a plain HTTP client that holds no
// token, and by a browser-like client (Accept: text/html, a cookie jar)
// that gets the HttpOnly, SameSite=Lax cookie scoped to the port and a
// redirect without the signature; a signed download and a signed upload
// (REST :sign) move files; a tampered URL is 403, a URL past its expiry is
// 403 saying so, and after release every URL is 410.
func signedScenario(t *testing.T, a *api, acq *orchv1.AcquireResponse) {
	id, tok := acq.GetLease().GetId(), acq.GetToken()
	released := false
	t.Cleanup(func() {
		if !released {
			a.mustRelease(t, id)
		}
	})
	page := "<html><body>signed preview " + randHex(8) + "</body></html>\n"
	a.putFile(t, id, tok, "/workspace/www/index.html", []byte(page))
	code, _, b := a.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/processes"),
		map[string]any{"argv": []string{"busybox", "httpd", "-f", "-p", "8000", "-h", "/workspace/www"}}, tok)
	if code != http.StatusOK {
		t.Fatalf("start httpd: HTTP %d: %s", code, b)
	}
	if !eventually(15*time.Second, 50*time.Millisecond, func() bool {
		c, _, _, err := a.httpGet("", "/v1/sandboxes/"+id+"/ports/8000/", bearerHeader(tok))
		return err == nil && c == http.StatusOK
	}) {
		t.Fatal("httpd never answered through the token preview")
	}

	// The CLI prints the URL alone.
	out, errs, rc := cliRun(t, a.addr, "lease", "sign", id, "--port", "8000", "--expires", "10m")
	if rc != 0 {
		t.Fatalf("lease sign: exit %d: %s", rc, errs)
	}
	previewURL := strings.TrimSpace(out)
	if !strings.HasPrefix(previewURL, a.base+"/v1/signed/"+id+"/ports/8000/?berth_exp=") {
		t.Fatalf("signed URL %q does not start with %s/v1/signed/%s/ports/8000/", previewURL, a.base, id)
	}

	// A plain client, no token: served at once.
	plain := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 30 * time.Second}
	defer plain.CloseIdleConnections()
	resp, body := fetch(t, plain, http.MethodGet, previewURL, nil, nil)
	if resp.StatusCode != http.StatusOK || body != page {
		t.Fatalf("plain GET of the signed URL: %d %q", resp.StatusCode, body)
	}

	// A browser: cookie + redirect to the URL without the signature.
	noFollow := &http.Client{Transport: plain.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, _ = fetch(t, noFollow, http.MethodGet, previewURL, http.Header{"Accept": {"text/html"}}, nil)
	prefix := "/v1/signed/" + id + "/ports/8000/"
	cs := resp.Cookies()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != prefix || len(cs) != 1 ||
		!cs[0].HttpOnly || cs[0].SameSite != http.SameSiteLaxMode || cs[0].Path != prefix || cs[0].Domain != "" || cs[0].Expires.IsZero() {
		t.Fatalf("browser GET: %d Location %q Set-Cookie %q", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Values("Set-Cookie"))
	}
	if resp.Header.Get("Referrer-Policy") != "no-referrer" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("bootstrap headers: %v", resp.Header)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Transport: plain.Transport, Jar: jar}
	resp, body = fetch(t, browser, http.MethodGet, previewURL, http.Header{"Accept": {"text/html"}}, nil)
	if resp.StatusCode != http.StatusOK || body != page || strings.Contains(resp.Request.URL.RawQuery, "berth_sig") {
		t.Fatalf("browser after redirect: %d %q at %s", resp.StatusCode, body, resp.Request.URL)
	}
	resp, body = fetch(t, browser, http.MethodGet, a.base+prefix+"index.html", nil, nil)
	if resp.StatusCode != http.StatusOK || body != page {
		t.Errorf("browser, next page by cookie: %d %q", resp.StatusCode, body)
	}

	// Tampered, or moved to another port: 403 with a clear body.
	for _, bad := range []string{previewURL[:len(previewURL)-3] + "AAA", strings.Replace(previewURL, "/ports/8000/", "/ports/8001/", 1)} {
		resp, body = fetch(t, plain, http.MethodGet, bad, nil, nil)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "invalid signature") {
			t.Errorf("GET %s: %d %q, want 403 invalid signature", bad, resp.StatusCode, body)
		}
	}

	// A signed download (CLI) and a signed upload (REST :sign).
	artifact := make([]byte, 256<<10)
	_, _ = rand.Read(artifact)
	a.putFile(t, id, tok, "/workspace/dist/artifact.bin", artifact)
	out, errs, rc = cliRun(t, a.addr, "lease", "sign", id, "--download", "/workspace/dist/artifact.bin")
	if rc != 0 {
		t.Fatalf("lease sign --download: exit %d: %s", rc, errs)
	}
	downloadURL := strings.TrimSpace(out)
	resp, body = fetch(t, plain, http.MethodGet, downloadURL, nil, nil)
	if resp.StatusCode != http.StatusOK || body != string(artifact) || !strings.Contains(resp.Header.Get("Content-Disposition"), `filename="artifact.bin"`) {
		t.Fatalf("signed download: %d, %d bytes, Content-Disposition %q", resp.StatusCode, len(body), resp.Header.Get("Content-Disposition"))
	}
	if resp, body = fetch(t, plain, http.MethodPut, downloadURL, nil, strings.NewReader("x")); resp.StatusCode != http.StatusForbidden {
		t.Errorf("PUT with a download URL: %d %q", resp.StatusCode, body)
	}
	var sr orchv1.SignResponse
	code, _, b = a.mustCall(t, http.MethodPost, "/v1/leases/"+id+":sign", map[string]any{"upload": "/workspace/in/report.txt", "expires": "60s"}, tok)
	if code != http.StatusOK || decode(b, &sr) != nil || sr.GetMethod() != http.MethodPut {
		t.Fatalf("REST :sign upload with the lease token: %d %s", code, b)
	}
	report := "report " + randHex(8) + "\n"
	if resp, body = fetch(t, plain, http.MethodPut, a.base+sr.GetPath(), nil, strings.NewReader(report)); resp.StatusCode/100 != 2 {
		t.Fatalf("signed upload: %d %q", resp.StatusCode, body)
	}
	if c, _, got, err := a.httpGet("", sandboxPath(id, "/v1/files/workspace/in/report.txt"), bearerHeader(tok)); err != nil || c != http.StatusOK || got != report {
		t.Errorf("uploaded file: %d %q %v", c, got, err)
	}

	// Expiry: a 2s URL works, then is 403 "expired".
	code, _, b = a.mustCall(t, http.MethodPost, "/v1/leases/"+id+":sign", map[string]any{"download": "/workspace/in/report.txt", "expires": "2s"})
	if code != http.StatusOK || decode(b, &sr) != nil {
		t.Fatalf("REST :sign 2s: %d %s", code, b)
	}
	if resp, body = fetch(t, plain, http.MethodGet, sr.GetUrl(), nil, nil); resp.StatusCode != http.StatusOK || body != report {
		t.Errorf("short-lived URL before expiry: %d %q", resp.StatusCode, body)
	}
	time.Sleep(time.Until(sr.GetExpiresAt().AsTime()) + 100*time.Millisecond)
	if resp, body = fetch(t, plain, http.MethodGet, sr.GetUrl(), nil, nil); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "expired") {
		t.Errorf("after expiry: %d %q, want 403 expired", resp.StatusCode, body)
	}

	// The lease ends: every URL stops working.
	a.mustRelease(t, id)
	released = true
	for _, u := range []string{previewURL, downloadURL} {
		if resp, body = fetch(t, plain, http.MethodGet, u, nil, nil); resp.StatusCode != http.StatusGone || !strings.Contains(body, "RELEASED") {
			t.Errorf("GET %s after release: %d %q, want 410", u, resp.StatusCode, body)
		}
	}
	if resp, body = fetch(t, browser, http.MethodGet, a.base+prefix, nil, nil); resp.StatusCode != http.StatusGone {
		t.Errorf("cookie after release: %d %q, want 410", resp.StatusCode, body)
	}
}

// fetch sends one request with c and returns the response and its body.
func fetch(t *testing.T, c *http.Client, method, url string, h http.Header, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = io.Copy(&buf, resp.Body)
	return resp, buf.String()
}
