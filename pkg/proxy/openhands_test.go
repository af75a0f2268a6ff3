package proxy_test

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/pkg/lease"
)

// TestOpenHandsSessionKeyAndHealth covers the proxy's part of the OpenHands
// subset: X-Session-API-Key opens a lease like a bearer token and never
// reaches the agent, which gets its own token instead; GET /health without
// a token is answered for an existing lease (READY: after probing the
// agent; PAUSED: without resuming) and counts as no activity.
func TestOpenHandsSessionKeyAndHealth(t *testing.T) {
	var mu sync.Mutex
	var seen http.Header
	healthy := true
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/healthz" {
			if !healthy {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		seen = r.Header.Clone()
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	fr := newFakeRouter()
	e := mountProxy(t, nil, fr, nil)
	ready, paused, gone := fakeID(1), fakeID(2), fakeID(3)
	agent := "127.0.0.1:" + strconv.Itoa(port)
	fr.set(ready, lease.Route{State: lease.StateReady, Endpoint: agent})
	fr.set(paused, lease.Route{State: lease.StatePaused, Endpoint: agent})
	fr.set(gone, lease.Route{State: lease.StateReleased, Reason: "released by client team-b"})

	hdr := http.Header{"X-Session-Api-Key": {fakeToken(ready)}}
	if r := do(t, "GET", e.sandboxURL(ready, "/server_info"), "", hdr, ""); r.code != 200 {
		t.Fatalf("X-Session-API-Key: %d %s", r.code, r.body)
	}
	mu.Lock()
	if seen.Get("X-Session-Api-Key") != "" || seen.Get("Authorization") != "Bearer agent-"+ready {
		t.Errorf("agent saw X-Session-API-Key %q, Authorization %q", seen.Get("X-Session-Api-Key"), seen.Get("Authorization"))
	}
	mu.Unlock()
	if r := do(t, "GET", e.sandboxURL(ready, "/server_info"), "", http.Header{"X-Session-Api-Key": {fakeToken(paused)}}, ""); r.code != 401 {
		t.Errorf("another lease's token: %d %s", r.code, r.body)
	}

	touches := fr.touched(ready)
	for _, tc := range []struct {
		id, method string
		want       int
	}{
		{ready, "GET", 200}, {ready, "HEAD", 200}, {paused, "GET", 200},
		{gone, "GET", 410}, {fakeID(4), "GET", 404},
	} {
		r := do(t, tc.method, e.sandboxURL(tc.id, "/health"), "", nil, "")
		if r.code != tc.want || (tc.want == 200 && tc.method == "GET" && string(r.body) != `{"status":"ok"}`+"\n") {
			t.Errorf("%s /health of %s: %d %q, want %d", tc.method, tc.id, r.code, r.body, tc.want)
		}
		// Issue 21 item 7: no state, reason or owner to a caller without a
		// token, in the body or the headers.
		leak := strings.ToLower(string(r.body) + fmt.Sprint(r.header))
		for _, word := range []string{"released", "team-b", "client", "paused", "ready", "state"} {
			if strings.Contains(leak, word) {
				t.Errorf("%s /health of %s tells %q: %d %s %v", tc.method, tc.id, word, r.code, r.body, r.header)
			}
		}
	}
	if fr.touched(ready) != touches || fr.touched(paused) != 0 {
		t.Errorf("an open health probe counted as activity")
	}
	if l, _ := fr.Route(paused); l.State != lease.StatePaused {
		t.Errorf("an open health probe changed a paused lease: %s", l.State)
	}
	mu.Lock()
	healthy = false
	mu.Unlock()
	if r := do(t, "GET", e.sandboxURL(ready, "/health"), "", nil, ""); r.code != 503 {
		t.Errorf("/health with a failing agent: %d %s", r.code, r.body)
	}
	// Other routes still need the token.
	if r := do(t, "GET", e.sandboxURL(ready, "/api/git/changes"), "", nil, ""); r.code != 401 {
		t.Errorf("/api without a token: %d %s", r.code, r.body)
	}
}

// TestOpenHandsUploadHeldToDiskLimit sends OpenHands uploads (multipart,
// X-Session-API-Key, both route prefixes) past a lease's disk limit: 507,
// and nothing written; one that fits goes through.
func TestOpenHandsUploadHeldToDiskLimit(t *testing.T) {
	e := diskEnv(t)
	id, tok := e.acquire(t, "oh-disk", "")
	dir := e.workdir(t, id, tok)
	multipartBody := func(n int) (string, string) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		fw, _ := mw.CreateFormFile("file", "f")
		_, _ = fw.Write(bytes.Repeat([]byte("x"), n))
		_ = mw.Close()
		return b.String(), mw.FormDataContentType()
	}
	for _, prefix := range []string{"/api", "/api/conversations/c1"} {
		body, ct := multipartBody(3 << 20)
		dst := dir + "/big" + strconv.Itoa(len(prefix)) + ".bin"
		r := do(t, "POST", e.sandboxURL(id, prefix+"/file/upload?path="+url.QueryEscape(dst)), "",
			http.Header{"X-Session-Api-Key": {tok}, "Content-Type": {ct}}, body)
		checkRefused(t, r, prefix+" upload")
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want no file", dst, err)
		}
	}
	body, ct := multipartBody(100 << 10)
	r := do(t, "POST", e.sandboxURL(id, "/api/file/upload?path="+url.QueryEscape(dir+"/small.bin")), "",
		http.Header{"X-Session-Api-Key": {tok}, "Content-Type": {ct}}, body)
	if r.code != 200 || !strings.Contains(string(r.body), `"file_size":102400`) {
		t.Errorf("small upload: %d %s", r.code, r.body)
	}
}

// TestOpenHandsAppSocket: a WebSocket upgrade of /sockets/events/{id}
// without any token passes to a lease that runs an app (with the agent's
// token, as every request), and only there: the same upgrade to a lease
// without an app, a tokenless non-upgrade, and another tokenless path of an
// app lease are 401; a missing lease answers 401 too (before existence).
func TestOpenHandsAppSocket(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusTeapot) // no upgrade: enough to see it arrived
	}))
	fr := newFakeRouter()
	e := mountProxy(t, nil, fr, nil)
	withApp, without := fakeID(1), fakeID(2)
	agent := "127.0.0.1:" + strconv.Itoa(port)
	fr.set(withApp, lease.Route{State: lease.StateReady, Endpoint: agent, App: true})
	fr.set(without, lease.Route{State: lease.StateReady, Endpoint: agent})
	upgrade := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
	for _, tc := range []struct {
		id, path string
		hdr      http.Header
		want     int
	}{
		{withApp, "/sockets/events/c1", upgrade, http.StatusTeapot},
		{without, "/sockets/events/c1", upgrade, 401},
		{fakeID(3), "/sockets/events/c1", upgrade, 401},
		{withApp, "/sockets/events/c1", nil, 401},
		{withApp, "/sockets/events/", upgrade, 401},
		{withApp, "/sockets/bash-events", upgrade, 401},
		{withApp, "/api/conversations", upgrade, 401},
	} {
		if r := do(t, "GET", e.sandboxURL(tc.id, tc.path), "", tc.hdr, ""); r.code != tc.want {
			t.Errorf("GET %s of %s (upgrade %v): %d %s, want %d", tc.path, tc.id, tc.hdr != nil, r.code, r.body, tc.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "/sockets/events/c1 Bearer agent-"+withApp {
		t.Fatalf("the agent saw %q", seen)
	}
}
