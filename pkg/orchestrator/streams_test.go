package orchestrator_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/internal/testsupport/streamtest"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/streamlimit"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// limitMsg is the start of the refusal naming the limit max.
func limitMsg(max int) string {
	return "stream limit: at most " + itoa(max) + " concurrent streams per caller"
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestLogFollowsPerLeaseToken performs the attack of a lease token that
// opens 30 log follows at once: those past the stream limit (the default,
// 16) get 429 naming the limit, the admitted ones keep delivering, and
// after some are closed new ones are accepted. Another lease's token is
// not affected.
func TestLogFollowsPerLeaseToken(t *testing.T) {
	s := orchtest.Start(t, nil)
	id, tok := acquireFor(t, s, "follows")
	otherID, otherTok := acquireFor(t, s, "follows-other")
	max := streamlimit.DefaultMax
	const n = 30
	admitted := streamtest.Flood(t, n, s.Base, id, tok, limitMsg(max))
	if len(admitted) != max {
		t.Fatalf("%d of %d admitted, want %d", len(admitted), n, max)
	}
	if f := streamtest.OpenLogFollow(t, s.Base, otherID, otherTok); f.Code != http.StatusOK {
		t.Fatalf("another lease's follow: %d %q", f.Code, f.Msg)
	} else {
		f.Cancel()
	}
	// The admitted ones keep working: each sees the pause.
	if code, _, b := signCall(t, "POST", s.Base+"/v1/leases/"+id+":pause", tok, `{"mode":"hibernate"}`); code != 200 {
		t.Fatalf("pause: %d %s", code, b)
	}
	for _, f := range admitted {
		f.WaitLine(t, "transition:paused (hibernate)")
	}
	// Closing three frees three slots (once the server sees them gone).
	for _, f := range admitted[:3] {
		f.Cancel()
	}
	deadline := time.Now().Add(30 * time.Second)
	for accepted := 0; accepted < 3; {
		f := streamtest.OpenLogFollow(t, s.Base, id, tok)
		switch {
		case f.Code == http.StatusOK:
			accepted++
			t.Cleanup(f.Cancel)
		case f.Code != http.StatusTooManyRequests:
			t.Fatalf("log follow after closing: %d %q", f.Code, f.Msg)
		case time.Now().After(deadline):
			t.Fatalf("closed follows did not free their slots: %d of 3 accepted", accepted)
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	if f := streamtest.OpenLogFollow(t, s.Base, id, tok); f.Code != http.StatusTooManyRequests {
		t.Fatalf("a follow past the limit again: %d", f.Code)
	}
	// A plain read (no follow) ends by itself and is not limited.
	if code, _, b := signCall(t, "GET", s.Base+"/v1/leases/"+id+"/logs", tok, ""); code != 200 {
		t.Fatalf("logs without follow at the limit: %d %s", code, b)
	}
}

// TestStreamLimitSharedAcrossKinds checks that one limit counts a
// caller's lease watch, terminal attach (WebSocket and gRPC), file watch
// (REST and gRPC) and log follow together: with a limit of 2, a watch and
// a terminal attach by one lease token leave no room for a third stream of
// any kind, and closing the terminal makes room again.
func TestStreamLimitSharedAcrossKinds(t *testing.T) {
	s := orchtest.Start(t, func(c *orchestrator.Config) { c.MaxWatchesPerPrincipal = 2 })
	id, tok := acquireFor(t, s, "kinds")
	_, otherTok := acquireFor(t, s, "kinds-other")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	as := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok, "x-berth-lease", id)
	}
	// A lease watch.
	wctx, wcancel := context.WithCancel(as(tok))
	defer wcancel()
	w, err := orchv1.NewLeaseServiceClient(conn).Watch(wctx, &orchv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatal(err)
	}
	// A terminal attach through the proxy.
	ws := "ws" + strings.TrimPrefix(s.Base, "http") + "/v1/sandboxes/" + id
	hdr := func(tok string) *websocket.DialOptions {
		return &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}}
	}
	term, _, err := websocket.Dial(ctx, ws+"/v1/terminals/ws?argv=/bin/sh", hdr(tok))
	if err != nil {
		t.Fatalf("terminal attach: %v", err)
	}
	defer term.CloseNow()
	if _, _, err := term.Read(ctx); err != nil { // the session message
		t.Fatal(err)
	}
	// Every kind of third stream is refused, naming the limit.
	refused := func(what string, code int, body string) {
		t.Helper()
		if code != http.StatusTooManyRequests || !strings.Contains(body, limitMsg(2)) {
			t.Fatalf("%s past the limit: %d %s", what, code, body)
		}
	}
	if _, resp, err := websocket.Dial(ctx, ws+"/v1/terminals/ws?argv=/bin/sh", hdr(tok)); err == nil || resp == nil {
		t.Fatalf("a second terminal: %v", err)
	} else {
		var m struct{ Message string }
		_ = json.NewDecoder(resp.Body).Decode(&m)
		refused("a second terminal", resp.StatusCode, m.Message)
	}
	code, _, b := signCall(t, "GET", s.Base+"/v1/sandboxes/"+id+"/v1/files:watch?path=/tmp", tok, "")
	refused("a REST file watch", code, b)
	f := streamtest.OpenLogFollow(t, s.Base, id, tok)
	refused("a log follow", f.Code, f.Msg)
	wctx2, wcancel2 := context.WithCancel(as(tok))
	defer wcancel2()
	for _, method := range []string{"/berth.agent.v1.TerminalService/Connect", "/berth.agent.v1.FileService/Watch"} {
		st, err := conn.NewStream(wctx2, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
		if err == nil {
			_ = st.CloseSend()
			err = st.RecvMsg(new(orchv1.LeaseEvent))
		}
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), limitMsg(2)) {
			t.Fatalf("gRPC %s past the limit: %v", method, err)
		}
	}
	// Another lease's token has its own count.
	other, _, err := websocket.Dial(ctx, ws+"/v1/terminals/ws?argv=/bin/sh", hdr(otherTok))
	if err == nil {
		other.CloseNow()
		t.Fatal("another lease's token opened this lease's terminal")
	}
	// Closing the terminal makes room for a file watch.
	term.CloseNow()
	deadline := time.Now().Add(30 * time.Second)
	for {
		fctx, fcancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(fctx, "GET", s.Base+"/v1/sandboxes/"+id+"/v1/files:watch?path=/tmp", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fcancel()
			t.Fatal(err)
		}
		code := resp.StatusCode
		resp.Body.Close()
		fcancel()
		if code == http.StatusOK {
			break
		}
		if code != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("a file watch after closing the terminal: %d", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
