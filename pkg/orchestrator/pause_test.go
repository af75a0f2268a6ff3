package orchestrator_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/berth-dev/berth/pkg/lease"
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
