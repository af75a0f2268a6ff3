package proxy_test

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + wsGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// readFrame reads one WebSocket frame (unmasking it if masked).
func readFrame(r *bufio.Reader) (opcode byte, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	opcode = h[0] & 0x0f
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	var mask [4]byte
	masked := h[1]&0x80 != 0
	if masked {
		if _, err = io.ReadFull(r, mask[:]); err != nil {
			return
		}
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(r, payload); err != nil {
		return
	}
	if masked {
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
	}
	return
}

// writeFrame writes one final frame; clients must mask.
func writeFrame(w io.Writer, opcode byte, payload []byte, mask bool) error {
	if len(payload) > 125 {
		return errors.New("test frames are short")
	}
	b := []byte{0x80 | opcode, byte(len(payload))}
	if !mask {
		b = append(b, payload...)
		_, err := w.Write(b)
		return err
	}
	key := [4]byte{1, 2, 3, 4}
	b[1] |= 0x80
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	_, err := w.Write(b)
	return err
}

// wsEcho is a minimal WebSocket echo server; it reports each handshake's
// request headers on seen.
func wsEcho(seen chan<- http.Header) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "websocket only", 400)
			return
		}
		seen <- r.Header.Clone()
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", wsAccept(r.Header.Get("Sec-WebSocket-Key")))
		rw.Flush()
		for {
			op, p, err := readFrame(rw.Reader)
			if err != nil || op == 8 {
				return
			}
			writeFrame(rw, op, p, false)
			rw.Flush()
		}
	})
}

func TestWebSocketThroughPreview(t *testing.T) {
	seen := make(chan http.Header, 4)
	port := listenHTTP(t, wsEcho(seen))
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "ws", "")

	dial := func(host, path string, hdr string) (net.Conn, *bufio.Reader, *http.Response) {
		c, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n%s\r\n", path, host, key, hdr)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == 101 && resp.Header.Get("Sec-WebSocket-Accept") != wsAccept(key) {
			t.Errorf("accept %q", resp.Header.Get("Sec-WebSocket-Accept"))
		}
		return c, br, resp
	}
	echo := func(c net.Conn, br *bufio.Reader, msg string) {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := writeFrame(c, 1, []byte(msg), true); err != nil {
			t.Fatal(err)
		}
		op, p, err := readFrame(br)
		if err != nil || op != 1 || string(p) != msg {
			t.Fatalf("echo: op %d %q %v", op, p, err)
		}
	}

	// Host form, token in a cookie (what a browser sends).
	c, br, resp := dial(previewHost(id, port), "/socket?x=1", "Cookie: theme=dark; berth_token="+tok+"\r\n")
	if resp.StatusCode != 101 {
		t.Fatalf("host-form upgrade: %d", resp.StatusCode)
	}
	echo(c, br, "hello")
	echo(c, br, "again")
	writeFrame(c, 8, nil, true)
	c.Close()
	h := <-seen
	if h.Get("Cookie") != "theme=dark" || h.Get("Authorization") != "" {
		t.Errorf("upstream saw %v", h)
	}

	// Path form, token in the query (the cookie bootstrap does not apply to
	// upgrades, which cannot follow a redirect).
	c, br, resp = dial(strings.TrimPrefix(e.srv.URL, "http://"), fmt.Sprintf("/v1/sandboxes/%s/ports/%d/socket?berth_token=%s", id, port, tok), "")
	if resp.StatusCode != 101 {
		t.Fatalf("path-form upgrade: %d", resp.StatusCode)
	}
	echo(c, br, "path form")
	c.Close()
	<-seen

	// No token: refused before the upstream sees anything.
	c, _, resp = dial(previewHost(id, port), "/socket", "")
	c.Close()
	if resp.StatusCode != 401 {
		t.Errorf("no token: %d", resp.StatusCode)
	}
}

func TestSSEFlushesIncrementally(t *testing.T) {
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(400 * time.Millisecond)
		}
	}))
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "sse", "")
	req, _ := http.NewRequest("GET", e.srv.URL+"/events", nil)
	req.Host = previewHost(id, port)
	req.Header.Set("Authorization", "Bearer "+tok)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: 0\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	if d := time.Since(start); d > 350*time.Millisecond {
		t.Errorf("first event after %s: not flushed", d)
	}
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "data: 2") {
		t.Errorf("rest %q", rest)
	}
}

func TestPreviewAuthAndPublicPorts(t *testing.T) {
	type seenReq struct {
		url  string
		hdr  http.Header
		host string
	}
	seen := make(chan seenReq, 16)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- seenReq{r.URL.String(), r.Header.Clone(), r.Host}
		fmt.Fprint(w, "preview ok")
	})
	public := listenHTTP(t, handler)
	private := listenHTTP(t, handler)
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "preview", fmt.Sprintf(`,"publicPorts":[%d]`, public))
	_, tokB := e.acquire(t, "other", "")

	// Public port: no token needed, host and path form.
	if r := do(t, "GET", e.srv.URL+"/a", previewHost(id, public), nil, ""); r.code != 200 || string(r.body) != "preview ok" {
		t.Errorf("public host form: %d %s", r.code, r.body)
	}
	<-seen
	if r := do(t, "GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/a", e.srv.URL, id, public), "", nil, ""); r.code != 200 {
		t.Errorf("public path form: %d %s", r.code, r.body)
	}
	if s := <-seen; s.url != "/a" || s.hdr.Get("X-Forwarded-Prefix") != fmt.Sprintf("/v1/sandboxes/%s/ports/%d", id, public) {
		t.Errorf("path form upstream: %+v", s)
	}

	// Private port: token needed; its own Authorization passes untouched
	// when it is not a berth token.
	if r := do(t, "GET", e.srv.URL+"/a", previewHost(id, private), nil, ""); r.code != 401 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Errorf("private without token: %d %v %s", r.code, r.header, r.body)
	}
	if r := do(t, "GET", e.srv.URL+"/a", previewHost(id, private), bearerHdr(tokB), ""); r.code != 401 {
		t.Errorf("private with another lease's token: %d %s", r.code, r.body)
	}
	if r := do(t, "GET", e.srv.URL+"/a", previewHost(id, private), http.Header{"X-Berth-Token": {tok}, "Authorization": {"Basic dTpw"}}, ""); r.code != 200 {
		t.Errorf("private with token: %d %s", r.code, r.body)
	}
	if s := <-seen; s.hdr.Get("Authorization") != "Basic dTpw" || s.hdr.Get("X-Berth-Token") != "" {
		t.Errorf("upstream headers %v", s.hdr)
	}
	if r := do(t, "GET", e.srv.URL+"/a", previewHost(id, private), bearerHdr(tok), ""); r.code != 200 {
		t.Errorf("private with bearer: %d %s", r.code, r.body)
	}
	if s := <-seen; s.hdr.Get("Authorization") != "" {
		t.Errorf("bearer lease token reached the port: %v", s.hdr)
	}
	if r := do(t, "GET", e.srv.URL+"/a", previewHost(id, private), bearerHdr(opToken), ""); r.code != 200 {
		t.Errorf("private with operator token: %d %s", r.code, r.body)
	}
	<-seen

	// The agent by host ({lease}.{Domain}).
	if r := do(t, "GET", e.srv.URL+"/v1/info", id+"."+domain+":80", bearerHdr(tok), ""); r.code != 200 || !strings.Contains(string(r.body), "version") {
		t.Errorf("agent by host: %d %s", r.code, r.body)
	}

	// Path form without the trailing slash redirects to it.
	if r := do(t, "GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d?x=1", e.srv.URL, id, public), "", nil, ""); r.code != 307 ||
		r.header.Get("Location") != fmt.Sprintf("/v1/sandboxes/%s/ports/%d/?x=1", id, public) {
		t.Errorf("no slash: %d %v", r.code, r.header)
	}
}

func TestPreviewCookieBootstrap(t *testing.T) {
	seen := make(chan *http.Request, 8)
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r
		fmt.Fprint(w, "page")
	}))
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "cookie", "")
	for _, tc := range []struct {
		name, url, host, path, location string
	}{
		{"host form", e.srv.URL + "/app/page?x=1&berth_token=" + tok + "&y=%20", previewHost(id, port), "/", "/app/page?x=1&y=%20"},
		{"path form", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/app?berth_token=%s", e.srv.URL, id, port, tok), "",
			fmt.Sprintf("/v1/sandboxes/%s/ports/%d/", id, port), fmt.Sprintf("/v1/sandboxes/%s/ports/%d/app", id, port)},
	} {
		r := do(t, "GET", tc.url, tc.host, nil, "")
		if r.code != http.StatusFound || r.header.Get("Location") != tc.location {
			t.Errorf("%s: %d Location %q, want 302 %q", tc.name, r.code, r.header.Get("Location"), tc.location)
			continue
		}
		resp := &http.Response{Header: r.header}
		cs := resp.Cookies()
		if len(cs) != 1 || cs[0].Name != "berth_token" || cs[0].Value != tok || !cs[0].HttpOnly ||
			cs[0].SameSite != http.SameSiteLaxMode || cs[0].Path != tc.path || cs[0].Domain != "" {
			t.Errorf("%s: cookie %v", tc.name, r.header["Set-Cookie"])
			continue
		}
		// Follow the redirect with the cookie, as a browser would.
		base := e.srv.URL
		r = do(t, "GET", base+tc.location, tc.host, http.Header{"Cookie": {"berth_token=" + cs[0].Value + "; app=1"}}, "")
		if r.code != 200 || string(r.body) != "page" {
			t.Errorf("%s: with cookie: %d %s", tc.name, r.code, r.body)
			continue
		}
		in := <-seen
		if in.Header.Get("Cookie") != "app=1" || strings.Contains(in.URL.RawQuery, "berth_token") {
			t.Errorf("%s: upstream saw cookie %q query %q", tc.name, in.Header.Get("Cookie"), in.URL.RawQuery)
		}
	}
	// A bad token in the query is refused, not turned into a cookie.
	r := do(t, "GET", e.srv.URL+"/?berth_token=bogus", previewHost(id, port), nil, "")
	if r.code != 401 || r.header.Get("Set-Cookie") != "" {
		t.Errorf("bad query token: %d %v", r.code, r.header)
	}
	// A POST with the query token is served (token stripped), not redirected.
	r = do(t, "POST", e.srv.URL+"/form?berth_token="+tok, previewHost(id, port), nil, "a=b")
	if r.code != 200 {
		t.Errorf("POST with query token: %d %s", r.code, r.body)
	}
	if in := <-seen; in.URL.RawQuery != "" {
		t.Errorf("POST upstream query %q", in.URL.RawQuery)
	}
}
