package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// claimFloor is what a burst of warm claims costs on this machine at the
// least, measured beside berth's own burst in WarmAcquireParallel: each of
// the parallel callers sends the same REST request to a bare Go HTTP server
// on loopback (no auth, no lease manager, no gateway), whose handler makes
// the one round trip a claim cannot skip, a gRPC call to the agent of an
// idle pooled sandbox over a connection opened ahead (a health check,
// cheaper than Configure, which a sandbox takes once), and the one durable
// write it cannot skip (a small file, fsync'd), and answers a small JSON
// object. berth does this and more (a lease record, tokens, policy, the
// agent's own state file), so the floor's p50 is the least the target can
// be measured against on the machine at the time of the run.
type claimFloor struct {
	srv    *http.Server
	url    string
	client *http.Client
	dir    string

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by the path's index, for the round
}

// newClaimFloor starts the floor's server on loopback; it stops with tb.
func newClaimFloor(tb testing.TB) *claimFloor {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &claimFloor{
		url:    "http://" + ln.Addr().String(),
		client: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, DisableCompression: true}, Timeout: time.Minute},
		dir:    tb.TempDir(),
		conns:  map[string]*grpc.ClientConn{},
	}
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
	// Connections opened ahead, as the bench's REST client has them.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if resp, err := f.client.Get(f.url + "/warm"); err == nil {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	tb.Cleanup(func() {
		_ = f.srv.Close()
		f.client.CloseIdleConnections()
		f.closeConns()
	})
	return f
}

// serve is the floor's claim (path /claim/INDEX): decode the request, one gRPC round trip to
// the sandbox named by the path, one fsync'd write, a JSON answer.
func (f *claimFloor) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/warm" {
		return
	}
	var req map[string]any
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	i := r.URL.Path[len("/claim/"):]
	f.mu.Lock()
	cc := f.conns[i]
	f.mu.Unlock()
	if cc == nil {
		http.Error(w, "no sandbox "+i, http.StatusNotFound)
		return
	}
	if _, err := healthpb.NewHealthClient(cc).Check(r.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	rec, _ := json.Marshal(req)
	if err := writeSynced(f.dir, rec); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"lease": map[string]any{"id": req["conversationId"], "state": "READY"}})
}

// writeSynced writes b to a new file in dir and fsyncs it.
func writeSynced(dir string, b []byte) error {
	fh, err := os.CreateTemp(dir, "rec-*")
	if err != nil {
		return err
	}
	_, err = fh.Write(b)
	if serr := fh.Sync(); err == nil {
		err = serr
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// prepare opens a connection to each agent (as the orchestrator's Prepare
// does for a pooled sandbox) and warms it with one call.
func (f *claimFloor) prepare(tb testing.TB, endpoints []string) {
	tb.Helper()
	f.closeConns()
	for i, ep := range endpoints {
		cc, err := grpc.NewClient("passthrough:///"+ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			tb.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			cc.Close()
			tb.Fatalf("floor: health check of the agent at %s: %v", ep, err)
		}
		f.mu.Lock()
		f.conns[strconv.Itoa(i)] = cc
		f.mu.Unlock()
	}
}

func (f *claimFloor) closeConns() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, cc := range f.conns {
		cc.Close()
		delete(f.conns, k)
	}
}

// burst sends the n requests at the same moment, as WarmAcquireParallel's
// callers do, and returns their durations.
func (f *claimFloor) burst(tb testing.TB, n int, body map[string]any) []time.Duration {
	tb.Helper()
	ds := make([]time.Duration, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(body)
			<-start
			ds[i], errs[i] = f.call(i, b)
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return ds
}

func (f *claimFloor) call(i int, body []byte) (time.Duration, error) {
	t0 := time.Now()
	resp, err := f.client.Post(f.url+"/claim/"+strconv.Itoa(i), "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("floor claim %d: %w", i, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	err = json.NewDecoder(resp.Body).Decode(&out)
	d := time.Since(t0)
	if err != nil || resp.StatusCode != http.StatusOK {
		return d, fmt.Errorf("floor claim %d: HTTP %d, %v", i, resp.StatusCode, err)
	}
	return d, nil
}
