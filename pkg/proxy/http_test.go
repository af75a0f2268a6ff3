package proxy_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
)

func TestExecRoundTrip(t *testing.T) {
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "exec", "")
	r := do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(tok), `{"command":"echo out; echo err >&2; exit 3"}`)
	if r.code != 200 {
		t.Fatalf("exec: %d %s", r.code, r.body)
	}
	m := r.json(t)
	if m["exitCode"] != float64(3) || m["stdout"] != "out\n" || m["stderr"] != "err\n" {
		t.Errorf("exec result %s", r.body)
	}
	// The query string is kept; a bad request is the agent's answer, passed through.
	r = do(t, "GET", e.sandboxURL(id, "/v1/fs:stat")+"?path=/nonexistent-berth", "", bearerHdr(tok), "")
	if r.code != 404 || !strings.Contains(string(r.body), "nonexistent-berth") {
		t.Errorf("stat with query: %d %s", r.code, r.body)
	}
}

func TestExecStreamIsIncremental(t *testing.T) {
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "stream", "")
	req, _ := http.NewRequest("POST", e.sandboxURL(id, "/v1/exec:stream"),
		strings.NewReader(`{"command":"echo first; sleep 1.5; echo second"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	var sawFirstAt, sawSecondAt time.Duration
	var lines []string
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		var ev struct {
			Result struct {
				Stdout []byte          `json:"stdout"`
				Exited json.RawMessage `json:"exited"`
			} `json:"result"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		switch string(ev.Result.Stdout) {
		case "first\n":
			sawFirstAt = time.Since(start)
		case "second\n":
			sawSecondAt = time.Since(start)
		}
	}
	if sawFirstAt == 0 || sawSecondAt == 0 {
		t.Fatalf("events: %q", lines)
	}
	if sawFirstAt > time.Second || sawSecondAt < 1400*time.Millisecond {
		t.Errorf("first event at %s, second at %s: the stream was not flushed as produced", sawFirstAt, sawSecondAt)
	}
	if !strings.Contains(lines[len(lines)-1], "exited") {
		t.Errorf("last event %q", lines[len(lines)-1])
	}
}

// TestStreamKeepsLeaseAlive: a lease with a 1s idle timeout survives a 2.5s
// exec stream because the open stream keeps touching it, and expires once
// the stream is over.
func TestStreamKeepsLeaseAlive(t *testing.T) {
	t.Parallel() // its own orchestrator and proxy; mostly waits
	e := newEnv(t, func(c *proxy.Config) { c.TouchInterval = 200 * time.Millisecond })
	id, tok := e.acquire(t, "idle", `,"idleTimeout":"1s"`)
	r := do(t, "POST", e.sandboxURL(id, "/v1/exec:stream"), "", bearerHdr(tok), `{"command":"sleep 2.5; echo done"}`)
	if r.code != 200 || !strings.Contains(string(r.body), "exited") {
		t.Fatalf("stream: %d %s", r.code, r.body)
	}
	if l := e.lease(t, id); l.State != lease.StateReady {
		t.Fatalf("lease after the stream: %s (%s); the stream did not keep it alive", l.State, l.Reason)
	}
	eventually(t, 10*time.Second, "the idle lease to expire", func() bool { return e.lease(t, id).State == lease.StateExpired })
}

// patternReader yields n pseudo-random bytes without holding them.
type patternReader struct {
	rng *rand.ChaCha8
	n   int64
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	p.rng.Read(b)
	p.n -= int64(len(b))
	return len(b), nil
}

// heapPeak samples the live heap until stop is closed and returns the peak.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

func TestRawFilesStreamed(t *testing.T) {
	const size = 64 << 20
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "files", "")
	path := filepath.Join(t.TempDir(), "big.bin") // in-process agents share this host's files

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	stop := make(chan struct{})
	peakc := heapPeak(stop)

	up := sha256.New()
	body := io.TeeReader(&patternReader{rng: rand.NewChaCha8([32]byte{7}), n: size}, up)
	req, _ := http.NewRequest("PUT", e.sandboxURL(id, "/v1/files"+path), body)
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sum := hex.EncodeToString(up.Sum(nil))
	if resp.StatusCode != 201 || !strings.Contains(string(b), sum) {
		t.Fatalf("upload: %d %s, want sha256 %s", resp.StatusCode, b, sum)
	}

	req, _ = http.NewRequest("GET", e.sandboxURL(id, "/v1/files"+path), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	down := sha256.New()
	n, err := io.Copy(down, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || n != size {
		t.Fatalf("download: %d, %d bytes, %v", resp.StatusCode, n, err)
	}
	close(stop)
	peak := <-peakc
	if got := hex.EncodeToString(down.Sum(nil)); got != sum {
		t.Fatalf("download sha256 %s, want %s", got, sum)
	}
	growth := int64(peak) - int64(base.HeapInuse)
	t.Logf("64 MiB up and down: heap in use grew by at most %.1f MiB", float64(growth)/(1<<20))
	if growth > size/4 {
		t.Errorf("heap grew by %d bytes during a %d-byte transfer: bodies are buffered", growth, size)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != size {
		t.Errorf("file on disk: %v %v", fi, err)
	}
}

func TestHopByHopAndTokenHeaders(t *testing.T) {
	got := make(chan *http.Request, 1)
	upstream := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Clone(context.Background())
		w.Header().Set("Connection", "X-Bar")
		w.Header().Set("X-Bar", "hop")
		w.Header().Set("X-Kept", "yes")
		w.Write([]byte("ok"))
	}))
	fr := newFakeRouter()
	id := fakeID(1)
	fr.set(id, lease.Route{State: lease.StateReady, Endpoint: fmt.Sprintf("127.0.0.1:%d", upstream)})
	e := mountProxy(t, nil, fr, nil)

	hdr := http.Header{
		"Authorization":   {"Bearer " + fakeToken(id)},
		"X-Berth-Token":   {fakeToken(id)},
		"Connection":      {"X-Foo"},
		"X-Foo":           {"hop"},
		"Keep-Alive":      {"timeout=5"},
		"X-Forwarded-For": {"6.6.6.6"},
		"Cookie":          {"a=1; berth_token=" + fakeToken(id) + "; b=2"},
		"X-Custom":        {"kept"},
	}
	r := do(t, "POST", e.sandboxURL(id, "/v1/some%2Fpath/x")+"?q=1&r=%20", "", hdr, "body")
	if r.code != 200 || string(r.body) != "ok" {
		t.Fatalf("proxied: %d %s", r.code, r.body)
	}
	if r.header.Get("X-Bar") != "" || r.header.Get("X-Kept") != "yes" {
		t.Errorf("response headers: %v", r.header)
	}
	in := <-got
	for k, want := range map[string]string{
		"Authorization":     "Bearer agent-" + id,
		"X-Berth-Token":     "",
		"X-Foo":             "",
		"Keep-Alive":        "",
		"X-Forwarded-For":   "127.0.0.1",
		"X-Forwarded-Proto": "http",
		"X-Forwarded-Host":  strings.TrimPrefix(e.srv.URL, "http://"),
		"Cookie":            "a=1; b=2",
		"X-Custom":          "kept",
	} {
		if g := strings.Join(in.Header.Values(k), ","); g != want {
			t.Errorf("upstream %s = %q, want %q", k, g, want)
		}
	}
	if in.URL.EscapedPath() != "/v1/some%2Fpath/x" || in.URL.RawQuery != "q=1&r=%20" {
		t.Errorf("upstream URL %s %q", in.URL.EscapedPath(), in.URL.RawQuery)
	}
	// The proxy touches the lease when the request starts and again when
	// it ends, which may be just after the client has its response.
	deadline := time.Now().Add(10 * time.Second) // the bound of a wait, not the expected time
	for fr.touched(id) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if fr.touched(id) < 2 {
		t.Errorf("lease touched %d times", fr.touched(id))
	}
}

// sleepProcs returns the pids whose command line is exactly argv.
func procsWith(argv ...string) []string {
	want := strings.Join(argv, "\x00") + "\x00"
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == want {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

func TestClientCancelIs499AndKillsCommand(t *testing.T) {
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "cancel", "")
	arg := fmt.Sprintf("31.%06d", rand.IntN(1e6)) // unique: agents run on this host
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.sandboxURL(id, "/v1/exec"), strings.NewReader(`{"argv":["sleep","`+arg+`"]}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("exec returned %d", resp.StatusCode)
		}
		errc <- err
	}()
	start := time.Now()
	eventually(t, 5*time.Second, "sleep to start", func() bool { return len(procsWith("sleep", arg)) > 0 })
	time.Sleep(300*time.Millisecond - time.Since(start))
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	eventually(t, 10*time.Second, "sleep "+arg+" to be killed", func() bool { return len(procsWith("sleep", arg)) == 0 })
	eventually(t, 5*time.Second, "499 to be logged", func() bool {
		return strings.Contains(e.logs.String(), "client went away") && strings.Contains(e.logs.String(), "status=499")
	})
	if n := e.proxy.Stats().HTTP[499]; n != 1 {
		t.Errorf("499 counted %d times", n)
	}
}

func TestAgentUnreachable(t *testing.T) {
	t.Parallel() // its own orchestrator and proxy; mostly waits
	// A READY lease whose agent does not answer (it died and the manager
	// has not noticed yet): 502, JSON.
	fr := newFakeRouter()
	id := fakeID(2)
	fr.set(id, lease.Route{State: lease.StateReady, Endpoint: closedPort(t)})
	e := mountProxy(t, nil, fr, nil)
	r := do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(fakeToken(id)), `{"argv":["true"]}`)
	if r.code != 502 || !strings.Contains(r.json(t)["message"].(string), "connection refused") {
		t.Errorf("dead agent: %d %s", r.code, r.body)
	}
	if !strings.Contains(e.logs.String(), "status=502") {
		t.Errorf("502 not logged:\n%s", e.logs)
	}

	// A real sandbox that dies is restarted in place by the manager (the
	// in-process runtime starts a new agent on the same workspace, at
	// another port): the proxy follows the new endpoint.
	e = newEnv(t, nil)
	id, tok := e.acquire(t, "dies", "")
	before := e.lease(t, id)
	if err := e.orch.Runtime.Kill(before.ContainerID, 137); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the sandbox to be restarted", func() bool {
		l := e.lease(t, id)
		return l.State == lease.StateReady && l.Restarts == 1
	})
	if after := e.lease(t, id); after.Endpoint == before.Endpoint {
		t.Errorf("endpoint %s unchanged after the restart", after.Endpoint)
	}
	r = do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(tok), `{"argv":["true"]}`)
	if r.code != 200 {
		t.Errorf("restarted sandbox: %d %s", r.code, r.body)
	}
	// A sandbox removed behind berth's back: the manager marks the lease
	// FAILED, and the proxy says so (410 with the reason) instead of a
	// bare 502.
	if err := e.orch.Runtime.Remove(context.Background(), before.ContainerID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the lease to fail", func() bool { return e.lease(t, id).State == lease.StateFailed })
	r = do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(tok), `{"argv":["true"]}`)
	if r.code != 410 || !strings.Contains(r.json(t)["message"].(string), "FAILED") {
		t.Errorf("removed sandbox: %d %s", r.code, r.body)
	}
	t.Logf("removed sandbox: %d %s", r.code, r.body)
}

func TestSlowUpstreamIs504(t *testing.T) {
	// A port that accepts connections and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(io.Discard, c) }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	e := newEnv(t, func(c *proxy.Config) { c.ResponseHeaderTimeout = 200 * time.Millisecond })
	id, tok := e.acquire(t, "slow", "")
	start := time.Now()
	r := do(t, "GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/", e.srv.URL, id, port), "", bearerHdr(tok), "")
	if r.code != 504 || !strings.Contains(string(r.body), "timed out") || time.Since(start) > 5*time.Second {
		t.Errorf("slow port: %d %q after %s", r.code, r.body, time.Since(start))
	}
	// Nothing listening on a port: 502, plain text on previews.
	r = do(t, "GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/", e.srv.URL, id, mustPort(t, closedPort(t))), "", bearerHdr(tok), "")
	if r.code != 502 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") || !strings.Contains(string(r.body), "nothing answers on port") {
		t.Errorf("closed port: %d %v %q", r.code, r.header, r.body)
	}
}

func mustPort(t testing.TB, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(p, &n)
	return n
}

// TestClassify checks the error mapping on errors that are hard to provoke
// for real (a dial timeout needs a black-hole address).
func TestClassify(t *testing.T) {
	live := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, tc := range []struct {
		ctx  context.Context
		err  error
		want int
	}{
		{gone, context.Canceled, 499},
		{gone, refused, 499},
		{live, dialTimeout, 504},
		{live, context.DeadlineExceeded, 504},
		{live, fmt.Errorf("wrapped: %w", context.DeadlineExceeded), 504},
		{live, refused, 502},
		{live, io.ErrUnexpectedEOF, 502},
		{live, context.Canceled, 502},
	} {
		if got := proxy.ClassifyForTest(tc.ctx, tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
