package orchestrator_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/berth-dev/berth/pkg/lease"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

func TestPauseResumeREST(t *testing.T) {
	s := start(t, nil)
	id, leaseTok := s.acquire(t, tokA, "conv-p")
	if r := s.do(t, tokB, "POST", "/v1/leases/"+id+":pause", `{"mode":"hibernate"}`); r.code != 404 {
		t.Fatalf("client B pauses A: %d %s", r.code, r.body)
	}
	if r := s.do(t, tokA, "POST", "/v1/leases/"+id+":pause", `{"mode":"sleep"}`); r.code != 400 {
		t.Fatalf("bad mode: %d %s", r.code, r.body)
	}
	// The in-process runtime cannot freeze: FAILED_PRECONDITION naming it.
	if r := s.do(t, tokA, "POST", "/v1/leases/"+id+":pause", `{"mode":"freeze"}`); r.code != 400 || !bytes.Contains(r.body, []byte(`"code":9`)) ||
		!bytes.Contains(r.body, []byte("cannot freeze")) {
		t.Fatalf("freeze on inproc: %d %s", r.code, r.body)
	}
	r := s.do(t, leaseTok, "POST", "/v1/leases/"+id+":pause", `{"mode":"hibernate"}`)
	if r.code != 200 || r.json(t)["state"] != "LEASE_STATE_PAUSED" || r.json(t)["paused"] != "hibernate" || r.json(t)["pausedAt"] == nil {
		t.Fatalf("hibernate: %d %s", r.code, r.body)
	}
	r = s.do(t, opToken, "POST", "/v1/leases/"+id+":resume", `{}`)
	if m := r.json(t); r.code != 200 || m["state"] != "LEASE_STATE_READY" || m["paused"] != "" {
		t.Fatalf("resume: %d %s", r.code, r.body)
	}
}

// A request through the proxy to a paused lease resumes it and is served;
// concurrent first requests resume it once.
func TestProxyResumesPaused(t *testing.T) {
	s := start(t, nil)
	id, tok := s.acquire(t, opToken, "proxied-paused")
	if r := s.do(t, tok, "POST", "/v1/leases/"+id+":pause", `{"mode":"hibernate"}`); r.code != 200 {
		t.Fatalf("hibernate: %d %s", r.code, r.body)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.do(t, tok, "POST", "/v1/sandboxes/"+id+"/v1/exec", `{"argv":["echo","woken"]}`)
			if r.code != 200 || !bytes.Contains(r.body, []byte(`"stdout":"woken\n"`)) {
				t.Errorf("exec on a paused lease: %d %s", r.code, r.body)
			}
		}()
	}
	wg.Wait()
	l, err := s.srv.Manager().Get(context.Background(), id)
	if err != nil || l.State != lease.StateReady {
		t.Fatalf("after proxied request: %v %v", l.State, err)
	}
	resumes := 0
	for _, tr := range l.Transitions {
		if tr.From == lease.StatePaused {
			resumes++
		}
	}
	if resumes != 1 {
		t.Fatalf("%d resumes for 4 concurrent requests, want 1", resumes)
	}
}

// Clients exec through the proxy (REST and gRPC) on the same leases while others pause
// (hibernate) and resume them through the API: a request to a paused or
// pausing lease waits for the resume, so every exec is served; none sees
// 409 "is PAUSED" or an upstream error from a pause that raced it.
func TestPauseRacesProxiedExecs(t *testing.T) {
	t.Parallel() // its own orchestrator; mostly waits
	s := start(t, nil)
	const leases, execers, pausers, rounds = 2, 4, 2, 60
	ids := make([]string, leases)
	for i := range ids {
		ids[i], _ = s.acquire(t, opToken, fmt.Sprintf("pause-race-%d", i))
	}
	call := func(method, path, body string) (int, string, error) {
		req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+opToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	conn, err := grpc.NewClient(strings.TrimPrefix(s.base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	procs := agentv1.NewProcessServiceClient(conn)
	var execs, pauses atomic.Int64
	var wg sync.WaitGroup
	for g := range execers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				id := ids[(g+i)%leases]
				if g%2 == 1 { // gRPC
					ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+opToken, "x-berth-lease", id)
					res, err := procs.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"echo", "ok"}})
					if err != nil || res.GetStdout() != "ok\n" {
						t.Errorf("gRPC exec %d on %s: %v %v", i, id, res, err)
						return
					}
				} else {
					code, body, err := call("POST", "/v1/sandboxes/"+id+"/v1/exec", `{"argv":["echo","ok"]}`)
					if err != nil || code != 200 || !strings.Contains(body, `"stdout":"ok\n"`) {
						t.Errorf("exec %d on %s: %d %s %v", i, id, code, body, err)
						return
					}
				}
				execs.Add(1)
			}
		}()
	}
	for g := range pausers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds / 2 {
				id := ids[(g+i)%leases]
				if code, body, err := call("POST", "/v1/leases/"+id+":pause", `{"mode":"hibernate"}`); err != nil || code != 200 {
					t.Errorf("pause %s: %d %s %v", id, code, body, err)
					return
				}
				pauses.Add(1)
				if code, body, err := call("POST", "/v1/leases/"+id+":resume", `{}`); err != nil || code != 200 {
					t.Errorf("resume %s: %d %s %v", id, code, body, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d execs served beside %d pauses", execs.Load(), pauses.Load())
}
