package orchestrator_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// countingListener counts the bytes the server reads from its connections.
type countingListener struct {
	net.Listener
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &l.read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// startCounting starts an orchestrator like orchtest.Start whose listener
// counts what the server reads.
func startCounting(t *testing.T, mutate func(*orchestrator.Config)) (string, *countingListener) {
	t.Helper()
	wrapped := make(chan *countingListener, 1)
	s := orchtest.StartWrapped(t, mutate, func(ln net.Listener) net.Listener {
		cl := &countingListener{Listener: ln}
		wrapped <- cl
		return cl
	})
	return s.Addr, <-wrapped // sent by the goroutine testserve started
}

// An unauthenticated 19 MiB Acquire is refused from its headers: the
// server does not read the message.
func TestUnauthenticatedBigMessageIsNotRead(t *testing.T) {
	addr, cl := startCounting(t, nil)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := orchv1.NewLeaseServiceClient(conn)
	big := &orchv1.AcquireRequest{ConversationId: "big", Env: map[string]string{"X": strings.Repeat("x", 19<<20)}}
	for _, tok := range []string{"", "not-a-valid-token"} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if tok != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
		}
		before := cl.read.Load()
		t0 := time.Now()
		_, err := c.Acquire(ctx, big)
		cancel()
		took := time.Since(t0)
		time.Sleep(100 * time.Millisecond) // let in-flight frames arrive
		read := cl.read.Load() - before
		t.Logf("token %q: %v in %s; server read %d bytes of a %d-byte message", tok, status.Code(err), took.Round(time.Millisecond), read, 19<<20)
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("err = %v, want Unauthenticated", err)
		}
		if read > 2<<20 {
			t.Fatalf("the server read %d bytes of an unauthenticated message", read)
		}
	}
	// The connection is still usable, and an authenticated call works.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+orchtest.OperatorToken)
	if _, err := c.List(ctx, &orchv1.ListLeasesRequest{}); err != nil {
		t.Fatal(err)
	}
}

// REST: a request without a valid token is answered before its body is
// read.
func TestRESTAuthBeforeBody(t *testing.T) {
	addr, cl := startCounting(t, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := cl.read.Load()
	// Headers announce 3 MiB; the body is never sent. Before the fix the
	// gateway waited for it.
	if _, err := io.WriteString(c, "POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3145728\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer without the body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	if read := cl.read.Load() - before; read > 4096 {
		t.Fatalf("server read %d bytes", read)
	}
	// A small body from a client that writes it whole first gets the 401
	// and a connection that stays readable.
	r, err := http.Post("http://"+addr+"/v1/leases", "application/json", strings.NewReader(`{"conversationId":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("small body: %d", r.StatusCode)
	}
}

// A slow client (slowloris) cannot hold the server: headers must arrive
// within ReadHeaderTimeout, and idle keep-alive connections are closed.
func TestSlowClientsDoNotHoldTheServer(t *testing.T) {
	addr, _ := startCounting(t, func(c *orchestrator.Config) {
		c.ReadHeaderTimeout = orchestrator.Duration(time.Second)
		c.IdleTimeout = orchestrator.Duration(time.Second)
		c.MaxConnections = 4
	})
	// Four connections (the limit) that send a header byte every 200ms.
	var slow []net.Conn
	stop := make(chan struct{})
	defer close(stop)
	for range 4 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		slow = append(slow, c)
		go func() {
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := io.WriteString(c, "X-A: b\r\n"); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("a normal client behind %d slow ones: %v", len(slow), err)
	}
	resp.Body.Close()
	took := time.Since(t0)
	t.Logf("normal request behind %d slowloris connections (the connection limit) answered in %s", len(slow), took.Round(time.Millisecond))
	if resp.StatusCode != 200 || took > 5*time.Second {
		t.Fatalf("status %d after %s", resp.StatusCode, took)
	}
	// The slow connections were cut.
	for i, c := range slow {
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil && !strings.Contains(err.Error(), "reset") {
			t.Errorf("slow connection %d still open: %v", i, err)
		}
		_ = b
	}
	// An idle keep-alive connection is closed after IdleTimeout.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	t1 := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want EOF", err)
	}
	t.Logf("idle keep-alive connection closed after %s", time.Since(t1).Round(time.Millisecond))
}

func TestAcquireBoundsAtTheEdge(t *testing.T) {
	s := start(t, nil)
	for _, tc := range []struct {
		body string
		code int
		msg  string
	}{
		{`{"conversationId":"r","resources":{"cpus":4096}}`, 400, "resources.cpus: 4096 exceeds the maximum 4"},
		{`{"conversationId":"r","resources":{"cpus":1e300}}`, 400, "resources.cpus: 1e+300 exceeds the maximum 4"},
		{`{"conversationId":"r","resources":{"cpus":"NaN"}}`, 400, "resources.cpus: NaN is not a finite number"},
		{`{"conversationId":"r","resources":{"cpus":"Infinity"}}`, 400, "resources.cpus: +Inf is not a finite number"},
		{`{"conversationId":"r","resources":{"cpus":"-Infinity"}}`, 400, "resources.cpus: -Inf is not a finite number"},
		{`{"conversationId":"r","resources":{"cpus":-1}}`, 400, "resources.cpus: -1 must not be negative"},
		{`{"conversationId":"r","resources":{"memoryBytes":"1125899906842624"}}`, 400, "resources.memory_bytes: 1125899906842624 exceeds the maximum 8589934592"},
		{`{"conversationId":"r","resources":{"pids":"9000000000000000000"}}`, 400, "resources.pids: 9000000000000000000 exceeds the maximum 4096"},
		{`{"conversationId":"r","resources":{"diskBytes":"1099511627776000"}}`, 400, "resources.disk_bytes: 1099511627776000 exceeds the maximum 107374182400"},
		{`{"conversationId":"r","env":{"A":"` + strings.Repeat("a", 30000) + `","B":"` + strings.Repeat("b", 30000) + `","C":"` + strings.Repeat("c", 10000) + `"}}`, 400, "env: 70009 bytes in total, at most 65536"},
		{`{"conversationId":"r","image":"ubuntu:24.04"}`, 403, `image: "ubuntu:24.04" is not allowed`},
		{`{"conversationId":"r","image":"Invalid/UPPER"}`, 400, "image:"},
	} {
		r := s.do(t, tokA, "POST", "/v1/leases", tc.body)
		msg, _ := r.json(t)["message"].(string)
		if r.code != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("%.80s: %d %q, want %d %q", tc.body, r.code, msg, tc.code, tc.msg)
		}
	}
	// Nothing was recorded.
	if r := s.do(t, opToken, "GET", "/v1/leases?includeEnded=true", ""); r.code != 200 || strings.Contains(string(r.body), `"id"`) {
		t.Fatalf("refused acquires left records: %s", r.body)
	}
	// Allowed images and the maximum itself are fine.
	if r := s.do(t, tokA, "POST", "/v1/leases", `{"conversationId":"ok","image":"berth/minimal","resources":{"cpus":4,"memoryBytes":"8589934592","pids":"4096"}}`); r.code != 200 {
		t.Fatalf("at the maximums: %d %s", r.code, r.body)
	}
}

func TestPerOwnerLimitAtTheEdge(t *testing.T) {
	s := start(t, func(c *orchestrator.Config) { c.Admission.MaxLivePerOwner = 2 })
	s.acquire(t, tokA, "a1")
	s.acquire(t, tokA, "a2")
	r := s.do(t, tokA, "POST", "/v1/leases", `{"conversationId":"a3"}`)
	if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("third lease of team-a: %d (Retry-After %q) %s", r.code, r.header.Get("Retry-After"), r.body)
	}
	if secs, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || secs < 1 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	// Another owner, and the operator acquiring for team-a, are not limited by it.
	s.acquire(t, tokB, "b1")
	if r := s.do(t, opToken, "POST", "/v1/leases", `{"conversationId":"op","owner":"team-a"}`); r.code != 200 {
		t.Fatalf("operator: %d %s", r.code, r.body)
	}
}

func TestWatchStreamsPerPrincipal(t *testing.T) {
	t.Parallel() // its own orchestrator; mostly waits
	s := start(t, func(c *orchestrator.Config) { c.MaxWatchesPerPrincipal = 2 })
	conn, err := grpc.NewClient(strings.TrimPrefix(s.base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := orchv1.NewLeaseServiceClient(conn)
	// watch opens a watch and waits up to wait for it to be refused.
	watch := func(tok string, wait time.Duration) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok))
		st, err := c.Watch(ctx, &orchv1.WatchRequest{})
		if err != nil {
			cancel()
			return cancel, err
		}
		// An admitted watch stays open with no event to send; a refused
		// one ends at once with its status.
		errc := make(chan error, 1)
		go func() {
			_, err := st.Recv()
			errc <- err
		}()
		select {
		case err := <-errc:
			cancel()
			return cancel, err
		case <-time.After(wait):
			return cancel, nil
		}
	}
	const admitted, refused = 300 * time.Millisecond, 10 * time.Second
	c1, err := watch(tokA, admitted)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch(tokA, admitted); err != nil {
		t.Fatal(err)
	}
	if _, err := watch(tokA, refused); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third watch of team-a: %v, want ResourceExhausted", err)
	}
	if _, err := watch(tokB, admitted); err != nil {
		t.Fatalf("team-b is not limited by team-a's watches: %v", err)
	}
	c1()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := watch(tokA, admitted)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed watch did not free its slot: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLimitsConfig checks the limits' defaults (loading them from flags,
// environment and file: cmd/orchestrator/internal/config).
func TestLimitsConfig(t *testing.T) {
	d := orchestrator.Defaults()
	if d.MaxCPUs != 4 || d.MaxMemoryBytes != 8<<30 || d.MaxPids != 4096 || d.MaxDiskBytes != 100<<30 || d.Admission.MaxEnvBytes != 64<<10 ||
		d.Admission.MaxLabels != 64 || d.Admission.MaxLivePerOwner != 20 || d.Admission.MaxEndedPerOwner != 100 || d.MaxWatchesPerPrincipal != 16 ||
		len(d.Admission.AllowedImages) != 1 || d.Admission.AllowedImages[0] != "berth/" {
		t.Fatalf("defaults: %+v", d)
	}
}
