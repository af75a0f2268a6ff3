package orchestrator_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
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

// follow is one open GET /v1/leases/{id}/logs?follow=true.
type follow struct {
	code   int
	msg    string      // the error message of a refused one
	lines  chan string // "source:text" of an admitted one
	cancel context.CancelFunc
}

// openFollow opens a log follow of lease id with tok.
func openFollow(t *testing.T, base, id, tok string) *follow {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/leases/"+id+"/logs?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Errorf("log follow: %v", err)
		return &follow{cancel: cancel}
	}
	f := &follow{code: resp.StatusCode, cancel: func() { cancel(); resp.Body.Close() }}
	if resp.StatusCode != http.StatusOK {
		// A refused stream's status comes as {"error": {...}} (the
		// gateway's stream error form) or as a plain status body.
		var m struct {
			Message string
			Error   struct{ Message string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&m)
		f.msg = m.Message + m.Error.Message
		f.cancel()
		return f
	}
	f.lines = make(chan string, 64)
	go func() {
		defer close(f.lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var line struct{ Result struct{ Source, Text string } }
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				f.lines <- line.Result.Source + ":" + line.Result.Text
			}
		}
	}()
	return f
}

// waitLine waits for a line of f containing want.
func (f *follow) waitLine(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-f.lines:
			if !ok {
				t.Fatalf("the follow ended before a line with %q", want)
			}
			if strings.Contains(l, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no line with %q", want)
		}
	}
}

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
	fs := make([]*follow, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fs[i] = openFollow(t, s.Base, id, tok) })
	}
	wg.Wait()
	var admitted []*follow
	refused := 0
	for _, f := range fs {
		switch {
		case f.code == http.StatusOK:
			admitted = append(admitted, f)
			t.Cleanup(f.cancel)
		case f.code == http.StatusTooManyRequests && strings.HasPrefix(f.msg, limitMsg(max)):
			refused++
		default:
			t.Fatalf("log follow: %d %q", f.code, f.msg)
		}
	}
	if len(admitted) != max || refused != n-max {
		t.Fatalf("%d admitted, %d refused; want %d and %d", len(admitted), refused, max, n-max)
	}
	if f := openFollow(t, s.Base, otherID, otherTok); f.code != http.StatusOK {
		t.Fatalf("another lease's follow: %d %q", f.code, f.msg)
	} else {
		f.cancel()
	}
	// The admitted ones keep working: each sees the pause.
	if code, _, b := signCall(t, "POST", s.Base+"/v1/leases/"+id+":pause", tok, `{"mode":"hibernate"}`); code != 200 {
		t.Fatalf("pause: %d %s", code, b)
	}
	for _, f := range admitted {
		f.waitLine(t, "transition:paused (hibernate)")
	}
	// Closing three frees three slots (once the server sees them gone).
	for _, f := range admitted[:3] {
		f.cancel()
	}
	deadline := time.Now().Add(30 * time.Second)
	for accepted := 0; accepted < 3; {
		f := openFollow(t, s.Base, id, tok)
		switch {
		case f.code == http.StatusOK:
			accepted++
			t.Cleanup(f.cancel)
		case f.code != http.StatusTooManyRequests:
			t.Fatalf("log follow after closing: %d %q", f.code, f.msg)
		case time.Now().After(deadline):
			t.Fatalf("closed follows did not free their slots: %d of 3 accepted", accepted)
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	if f := openFollow(t, s.Base, id, tok); f.code != http.StatusTooManyRequests {
		t.Fatalf("a follow past the limit again: %d", f.code)
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
	f := openFollow(t, s.Base, id, tok)
	refused("a log follow", f.code, f.msg)
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
