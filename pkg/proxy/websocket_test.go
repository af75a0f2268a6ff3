package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
)

// wsAgent is a stand-in agent that accepts WebSockets selecting
// berth.terminal.v1 from any Origin (as the agent does) and records the
// upgrade's headers.
type wsAgent struct {
	mu      sync.Mutex
	headers []http.Header
}

func (a *wsAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.headers = append(a.headers, r.Header.Clone())
	a.mu.Unlock()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"berth.terminal.v1"}, InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer c.CloseNow()
	typ, b, err := c.Read(r.Context())
	if err != nil {
		return
	}
	_ = c.Write(r.Context(), typ, b)
	_ = c.Close(websocket.StatusNormalClosure, "")
}

func (a *wsAgent) last() http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.headers) == 0 {
		return nil
	}
	return a.headers[len(a.headers)-1]
}

func (a *wsAgent) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.headers)
}

// A browser's WebSocket offers the token as a subprotocol: the proxy takes
// it, removes it, and the agent sees only its own token and the other
// subprotocols; a foreign Origin is refused before anything is forwarded.
func TestWebSocketTokenProtocol(t *testing.T) {
	agent := &wsAgent{}
	up := httptest.NewServer(agent)
	t.Cleanup(up.Close)
	fr := newFakeRouter()
	e := mountProxy(t, nil, fr, nil)
	id := fakeID(7)
	fr.set(id, lease.Route{State: lease.StateReady, Endpoint: strings.TrimPrefix(up.URL, "http://")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(e.sandboxURL(id, "/v1/terminals/ws?argv=cat"), "http")
	self := strings.TrimPrefix(e.srv.URL, "http://")
	tokenProto := proxy.TokenProtocolPrefix + fakeToken(id)

	for _, tc := range []struct {
		name, origin, host string
		protocols          []string
	}{
		{"no Origin (not a browser)", "", "", []string{"berth.terminal.v1", tokenProto}},
		{"same origin", "http://" + self, "", []string{tokenProto, "berth.terminal.v1"}},
		{"same origin, https behind a terminator", "https://" + self, "", []string{"berth.terminal.v1", tokenProto}},
		{"agent host form", "https://" + id + "." + domain, id + "." + domain, []string{"berth.terminal.v1", tokenProto}},
		{"operator token", "", "", []string{"berth.terminal.v1", proxy.TokenProtocolPrefix + opToken}},
	} {
		u := wsURL
		if tc.host != "" {
			u = "ws://" + self + "/v1/terminals/ws"
		}
		h := http.Header{}
		if tc.origin != "" {
			h.Set("Origin", tc.origin)
		}
		c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: tc.protocols, HTTPHeader: h, Host: tc.host})
		if err != nil {
			t.Errorf("%s: dial: %v (%v)", tc.name, err, resp)
			continue
		}
		if c.Subprotocol() != "berth.terminal.v1" {
			t.Errorf("%s: subprotocol %q", tc.name, c.Subprotocol())
		}
		if err := c.Write(ctx, websocket.MessageBinary, []byte("hi")); err != nil {
			t.Errorf("%s: write: %v", tc.name, err)
		}
		if _, b, err := c.Read(ctx); err != nil || string(b) != "hi" {
			t.Errorf("%s: echo %q %v", tc.name, b, err)
		}
		c.CloseNow()
		got := agent.last()
		if p := got.Values("Sec-WebSocket-Protocol"); len(p) != 1 || p[0] != "berth.terminal.v1" {
			t.Errorf("%s: the agent was offered %q, want only berth.terminal.v1", tc.name, p)
		}
		if a := got.Get("Authorization"); a != "Bearer agent-"+id {
			t.Errorf("%s: the agent got Authorization %q", tc.name, a)
		}
	}

	before := agent.count()
	for _, tc := range []struct {
		name, origin string
		protocols    []string
		want         int
		inMsg        string
	}{
		{"foreign origin", "https://evil.example", []string{"berth.terminal.v1", tokenProto}, 403, "refused"},
		{"foreign port", "http://" + strings.Split(self, ":")[0] + ":1", []string{"berth.terminal.v1", tokenProto}, 403, "refused"},
		{"opaque origin", "null", []string{"berth.terminal.v1", tokenProto}, 403, "refused"},
		{"wrong token", "", []string{"berth.terminal.v1", proxy.TokenProtocolPrefix + "nope"}, 401, "invalid token"},
		{"empty token", "", []string{"berth.terminal.v1", proxy.TokenProtocolPrefix}, 401, "missing token"},
		{"another lease's token", "", []string{"berth.terminal.v1", proxy.TokenProtocolPrefix + fakeToken(fakeID(8))}, 401, "another lease"},
		{"no token", "", []string{"berth.terminal.v1"}, 401, "missing token"},
	} {
		h := http.Header{}
		if tc.origin != "" {
			h.Set("Origin", tc.origin)
		}
		_, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{Subprotocols: tc.protocols, HTTPHeader: h})
		if err == nil || resp == nil || resp.StatusCode != tc.want {
			t.Errorf("%s: %v %v, want HTTP %d", tc.name, resp, err, tc.want)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), tc.inMsg) {
			t.Errorf("%s: body %q, want %q in it", tc.name, body, tc.inMsg)
		}
	}
	if n := agent.count(); n != before {
		t.Errorf("refused upgrades reached the agent: %d requests", n-before)
	}

	// The subprotocol is a token only on a WebSocket upgrade: a plain
	// request carrying the header is not authenticated by it.
	r := do(t, "GET", e.sandboxURL(id, "/v1/info"), "", http.Header{"Sec-Websocket-Protocol": {tokenProto}}, "")
	if r.code != 401 {
		t.Errorf("plain GET with the token as a subprotocol: %d %s", r.code, r.body)
	}
	r = do(t, "GET", e.sandboxURL(id, "/v1/terminals/ws"), "", http.Header{
		"Sec-Websocket-Protocol": {tokenProto}, "Upgrade": {"websocket"}, // no Connection: upgrade
	}, "")
	if r.code != 401 {
		t.Errorf("Upgrade without Connection: upgrade: %d %s", r.code, r.body)
	}
	// A header token still works on an upgrade from any Origin (the
	// Origin check guards only the subprotocol token, a page's one way in).
	h := bearerHdr(fakeToken(id))
	h.Set("Origin", "https://elsewhere.example")
	c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{"berth.terminal.v1"}})
	if err != nil {
		t.Fatalf("header token from another origin: %v", err)
	}
	c.CloseNow()
}
