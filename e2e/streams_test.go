package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/streamtest"
	"github.com/berth-dev/berth/pkg/streamlimit"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStreamLimitDocker performs the attack of a lease token that opens
// 30 log follows at once on a Docker sandbox: those past the per-caller
// stream limit (16 by default) get 429 naming it, the admitted ones keep
// streaming; once some are closed, a lease watch and a terminal attach fill
// the freed slots (one limit counts every kind), a file watch is then
// refused, and closing the terminal lets the file watch in.
func TestStreamLimitDocker(t *testing.T) {
	o, _, id, tok := dockerBaseLease(t, "bounds-streams")
	max := streamlimit.DefaultMax
	limitMsg := "stream limit: at most 16 concurrent streams per caller"

	const n = 30
	admitted := streamtest.Flood(t, n, o.base, id, tok, limitMsg)
	if len(admitted) != max {
		t.Fatalf("%d of %d log follows admitted, want %d", len(admitted), n, max)
	}
	// The admitted follows keep streaming: each sees the freeze.
	if code, _, b := o.mustCall(t, http.MethodPost, "/v1/leases/"+id+":pause", map[string]any{"mode": "freeze"}, tok); code != http.StatusOK {
		t.Fatalf("pause: HTTP %d: %s", code, b)
	}
	for _, f := range admitted {
		f.WaitLine(t, "transition:paused (freeze)")
	}
	if code, _, b := o.mustCall(t, http.MethodPost, "/v1/leases/"+id+":resume", map[string]any{}, tok); code != http.StatusOK {
		t.Fatalf("resume: HTTP %d: %s", code, b)
	}

	// Close two follows; a lease watch and a terminal take their slots.
	admitted[0].Cancel()
	admitted[1].Cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lc := o.grpcClient(t)
	var watch orchv1.LeaseService_WatchClient
	if !eventually(30*time.Second, 50*time.Millisecond, func() bool {
		w, err := lc.Watch(withToken(ctx, tok), &orchv1.WatchRequest{})
		if err != nil {
			return false
		}
		if _, err := w.Header(); err != nil {
			return false
		}
		// A refused watch ends at once with its status; an admitted one waits.
		recv := make(chan error, 1)
		go func() { _, err := w.Recv(); recv <- err }()
		select {
		case err := <-recv:
			if status.Code(err) != codes.ResourceExhausted {
				t.Errorf("watch: %v", err)
			}
			return false
		case <-time.After(300 * time.Millisecond):
			watch = w
			return true
		}
	}) {
		t.Fatal("a closed follow did not free its slot for a watch")
	}
	_ = watch
	// The terminal: dialled until the second closed follow's slot is free.
	u := "ws" + strings.TrimPrefix(o.base, "http") + "/v1/sandboxes/" + id + "/v1/terminals/ws?argv=/bin/sh"
	var term *websocket.Conn
	if !eventually(30*time.Second, 50*time.Millisecond, func() bool {
		c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
		if err != nil {
			if resp == nil || resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("terminal attach: %v", err)
			}
			return false
		}
		term = c
		return true
	}) {
		t.Fatal("the second closed follow did not free its slot for a terminal")
	}
	defer term.CloseNow()
	if _, _, err := term.Read(ctx); err != nil { // the session message
		t.Fatal(err)
	}

	// Now 16 streams of three kinds are open: a file watch is refused.
	code, _, b := o.mustCall(t, http.MethodGet, "/v1/sandboxes/"+id+"/v1/files:watch?path=/tmp", nil, tok)
	if e := parseErr(t, b); code != http.StatusTooManyRequests || !strings.HasPrefix(e.Message, limitMsg) {
		t.Fatalf("a file watch at the limit: HTTP %d: %s", code, b)
	}
	// Closing the terminal lets one in.
	_ = term.CloseNow()
	if !eventually(30*time.Second, 50*time.Millisecond, func() bool { return streamsFree(t, o.base, id, tok) }) {
		t.Fatal("closing the terminal did not free its slot")
	}
}

// streamsFree reports whether lease id's token may open one more stream:
// it opens a file watch through the proxy, and closes it at once when
// admitted.
func streamsFree(t *testing.T, base, id, tok string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sandboxes/"+id+"/v1/files:watch?path=/tmp", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("file watch: %v", err)
		return false
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return true
	case http.StatusTooManyRequests:
		return false
	}
	t.Errorf("file watch: HTTP %d", resp.StatusCode)
	return false
}
