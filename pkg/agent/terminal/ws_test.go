package terminal

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wsTerm is a WebSocket client of one session.
type wsTerm struct {
	t       *testing.T
	c       *websocket.Conn
	session Control

	mu       sync.Mutex
	out      strings.Builder
	controls []Control
	err      error // the read error that ended the connection
	wake     chan struct{}
	done     chan struct{}
}

// dialWS connects to srv with query q and reads the session message.
func dialWS(t *testing.T, base string, q url.Values, header http.Header) (*wsTerm, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	u := strings.Replace(base, "http", "ws", 1) + "?" + q.Encode()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: header, Subprotocols: []string{Subprotocol}})
	if err != nil {
		return nil, resp, err
	}
	if c.Subprotocol() != Subprotocol {
		t.Errorf("subprotocol %q", c.Subprotocol())
	}
	w := &wsTerm{t: t, c: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
	typ, data, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageText {
		t.Fatalf("first message: %v %v", typ, err)
	}
	if err := json.Unmarshal(data, &w.session); err != nil || w.session.Type != "session" || w.session.ID == "" {
		t.Fatalf("first message %s: %v", data, err)
	}
	t.Cleanup(func() { _ = c.CloseNow(); <-w.done })
	go func() {
		defer close(w.done)
		for {
			typ, data, err := c.Read(ctx)
			w.mu.Lock()
			switch {
			case err != nil:
				w.err = err
			case typ == websocket.MessageBinary:
				w.out.Write(data)
			default:
				var msg Control
				if err := json.Unmarshal(data, &msg); err != nil {
					t.Errorf("text message %q: %v", data, err)
				}
				w.controls = append(w.controls, msg)
			}
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return w, resp, nil
}

func (w *wsTerm) input(s string) {
	w.t.Helper()
	if err := w.c.Write(context.Background(), websocket.MessageBinary, []byte(s)); err != nil {
		w.t.Fatalf("write: %v", err)
	}
}

func (w *wsTerm) control(s string) {
	w.t.Helper()
	if err := w.c.Write(context.Background(), websocket.MessageText, []byte(s)); err != nil {
		w.t.Fatalf("write control: %v", err)
	}
}

func (w *wsTerm) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

// waitUntil waits until cond holds for the received output and controls.
func (w *wsTerm) waitUntil(what string, cond func(out string, controls []Control) bool) {
	w.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		w.mu.Lock()
		ok := cond(w.out.String(), w.controls)
		w.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-w.wake:
		case <-w.done:
			w.mu.Lock()
			ok := cond(w.out.String(), w.controls)
			w.mu.Unlock()
			if !ok {
				w.t.Fatalf("connection ended (%v) before %s: %q", w.err, what, tail(w.String()))
			}
			return
		case <-deadline:
			w.t.Fatalf("timed out waiting for %s: %q", what, tail(w.String()))
		}
	}
}

func (w *wsTerm) waitFor(want string) {
	w.t.Helper()
	w.waitUntil(want, func(out string, _ []Control) bool { return strings.Contains(out, want) })
}

func TestWebSocket(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{})
	srv := httptest.NewServer(WebSocket(m))
	t.Cleanup(srv.Close)

	w, _, err := dialWS(t, srv.URL, url.Values{"argv": {"/bin/sh"}, "rows": {"20"}, "cols": {"70"}, "env": {"X=x=1"}, "term": {"vt220"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := w.session; s.Pid == 0 || s.Rows != 20 || s.Cols != 70 || s.Term != "vt220" || len(s.Argv) != 1 {
		t.Errorf("session message %+v", s)
	}
	w.input("echo ws-$((4+4))-$X-$TERM $(stty size)\n")
	w.waitFor("ws-8-x=1-vt220 20 70")
	w.control(`{"type":"resize","rows":44,"cols":99}`)
	w.input("echo size-$((1+6)) $(stty size)\n")
	w.waitFor("size-7 44 99")
	w.input("sleep 30\n")
	time.Sleep(300 * time.Millisecond)
	w.control(`{"type":"signal","signal":"SIGINT"}`)
	w.input("echo int-$?\n")
	w.waitFor("int-130")

	// Refused controls are answered; the connection goes on.
	w.control(`{"type":"resize","rows":0,"cols":80}`)
	w.control(`{"type":"bogus"}`)
	w.control(`not json`)
	w.waitUntil("three errors", func(_ string, cs []Control) bool {
		n := 0
		for _, c := range cs {
			if c.Type == "error" && c.Message != "" {
				n++
			}
		}
		return n == 3
	})

	// A second client attaches by id and gets the scrollback first.
	w2, _, err := dialWS(t, srv.URL, url.Values{"session": {w.session.ID}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w2.waitFor("ws-8-x=1-vt220 20 70")
	if w2.session.ID != w.session.ID {
		t.Errorf("attached to %s", w2.session.ID)
	}
	// The first client leaves; the session runs on.
	_ = w.c.Close(websocket.StatusNormalClosure, "bye")
	w2.input("echo still-$((5*5))\n")
	w2.waitFor("still-25")
	w2.input("exit 5\n")
	w2.waitUntil("exit", func(_ string, cs []Control) bool { return len(cs) > 0 && cs[len(cs)-1].Type == "exit" })
	<-w2.done
	if st := websocket.CloseStatus(w2.err); st != websocket.StatusNormalClosure {
		t.Errorf("close status %v (%v)", st, w2.err)
	}
	w2.mu.Lock()
	last := w2.controls[len(w2.controls)-1]
	w2.mu.Unlock()
	if last.Code == nil || *last.Code != 5 {
		t.Errorf("exit message %+v", last)
	}

	// Attaching without replay to the ended session: nothing but the exit.
	w3, _, err := dialWS(t, srv.URL, url.Values{"session": {w.session.ID}, "replay": {"false"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w3.waitUntil("exit", func(_ string, cs []Control) bool { return len(cs) == 1 && cs[0].Type == "exit" })
	if w3.String() != "" {
		t.Errorf("output without replay: %q", w3.String())
	}
}

func TestWebSocketRefusals(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{MaxSessions: 1})
	srv := httptest.NewServer(WebSocket(m))
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		query  url.Values
		status int
		msg    string
	}{
		{url.Values{"session": {"t-0000000000000000"}}, http.StatusNotFound, "t-0000000000000000"},
		{url.Values{"argv": {"no-such-program-xyz"}}, http.StatusBadRequest, "argv[0]"},
		{url.Values{"rows": {"x"}}, http.StatusBadRequest, "rows"},
		{url.Values{"env": {"NOEQUALS"}}, http.StatusBadRequest, "env"},
		{url.Values{"bogus": {"1"}}, http.StatusBadRequest, "bogus"},
		{url.Values{"session": {"t-1"}, "replay": {"maybe"}}, http.StatusBadRequest, "replay"},
	} {
		_, resp, err := dialWS(t, srv.URL, tc.query, nil)
		if err == nil || resp == nil || resp.StatusCode != tc.status {
			t.Errorf("%v: %v, %v; want HTTP %d", tc.query, resp, err, tc.status)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), tc.msg) || !strings.Contains(string(b), `"code"`) {
			t.Errorf("%v: body %s, want a JSON error naming %q", tc.query, b, tc.msg)
		}
	}
	// Not an upgrade.
	resp, err := http.Get(srv.URL + "?argv=sh")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("plain GET: %d", resp.StatusCode)
	}
	if n := len(m.List()); n != 0 {
		t.Errorf("refused requests opened %d sessions", n)
	}
	// The session limit is 429.
	w, _, err := dialWS(t, srv.URL, url.Values{"argv": {"/bin/sh"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, resp, err := dialWS(t, srv.URL, url.Values{"argv": {"/bin/sh"}}, nil); err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("over the limit: %v %v", resp, err)
	}
	// A session ended by Kill closes its clients normally, with the exit.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.Kill(ctx, w.session.ID, ""); err != nil {
		t.Fatal(err)
	}
	w.waitUntil("exit", func(_ string, cs []Control) bool { return len(cs) > 0 && cs[len(cs)-1].Type == "exit" })
	<-w.done
	if st := websocket.CloseStatus(w.err); st != websocket.StatusNormalClosure {
		t.Errorf("close status %v (%v)", st, w.err)
	}
}

// TestWebSocketSlowClient: a client that stops reading is closed with 1013
// (try again later) once it is ClientBuffer behind, and may re-attach.
func TestWebSocketSlowClient(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{ClientBuffer: 16 << 10})
	srv := httptest.NewServer(WebSocket(m))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := strings.Replace(srv.URL, "http", "ws", 1) + "?command=" + url.QueryEscape("read go; yes | head -c 30000000; sleep 30")
	c, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	if err := c.Write(ctx, websocket.MessageBinary, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // not reading: socket buffers fill, then the queue
	var err2 error
	for {
		if _, _, err2 = c.Read(ctx); err2 != nil {
			break
		}
	}
	if st := websocket.CloseStatus(err2); st != websocket.StatusTryAgainLater {
		t.Fatalf("slow client closed with %v (%v), want 1013", st, err2)
	}
	var ce websocket.CloseError
	if !errors.As(err2, &ce) || !strings.Contains(ce.Reason, "re-attach") {
		t.Errorf("close reason: %v", err2)
	}
}
