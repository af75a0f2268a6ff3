package conformance

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// testRestart: a sandbox killed from outside (SIGKILL of its container) is
// started again in place by Restart: the agent answers with the same token
// at the (re-read) endpoint, and a file written before the kill is still
// there. Restart of a running sandbox just returns it; of a missing one is
// NotFound.
func (s *suite) testRestart(t *testing.T) {
	t.Parallel()
	if s.opts.kill == nil {
		testenv.SkipOrFail(t, "no kill hook given (WithKill); skipping")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := s.spec(s.images.Empty) // no shell needed: the agent writes the file
	sb := s.create(t, spec)

	const content = "written before the kill\n"
	url := "http://" + sb.Endpoint + "/v1/files/workspace/keep/me.txt?parents=true"
	if code, body := s.callRaw(t, http.MethodPut, url, spec.AgentToken, content); code/100 != 2 {
		t.Fatalf("upload: HTTP %d: %s", code, body)
	}
	same, err := s.rt.Restart(ctx, sb.ID)
	if err != nil || same.State != runtime.StateRunning || same.Endpoint == "" {
		t.Fatalf("Restart of a running sandbox = %+v, %v; want it running", same, err)
	}

	if err := s.opts.kill(ctx, sb.ID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := s.rt.Get(ctx, sb.ID)
		if err != nil {
			t.Fatalf("Get after kill: %v", err)
		}
		if got.State == runtime.StateExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s 30s after the kill", got.State)
		}
		time.Sleep(20 * time.Millisecond)
	}

	began := time.Now()
	re, err := s.rt.Restart(ctx, sb.ID)
	if err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("Restart = %s at %s (was %s) in %s", shortID(re.ID), re.Endpoint, sb.Endpoint, time.Since(began).Round(time.Millisecond))
	if re.ID != sb.ID || re.LeaseID != spec.LeaseID || re.State != runtime.StateRunning || re.Endpoint == "" {
		t.Fatalf("Restart = %+v; want the same container %s running with an endpoint", re, sb.ID)
	}
	if got, err := s.rt.Get(ctx, sb.ID); err != nil || got.State != runtime.StateRunning || got.Endpoint != re.Endpoint {
		t.Errorf("Get after Restart = %+v, %v; want running at %s", got, err, re.Endpoint)
	}
	if err := s.healthz(re, 5*time.Second); err != nil {
		t.Fatalf("agent after Restart: %v", err)
	}
	code, body := s.callRaw(t, http.MethodGet, "http://"+re.Endpoint+"/v1/files/workspace/keep/me.txt", spec.AgentToken, "")
	if code != http.StatusOK || string(body) != content {
		t.Errorf("file after Restart: HTTP %d %q, want 200 %q (the writable layer must be kept)", code, body, content)
	}
	if code, _ := s.callRaw(t, http.MethodGet, "http://"+re.Endpoint+"/v1/files/workspace/keep/me.txt", "wrong-token", ""); code != http.StatusUnauthorized {
		t.Errorf("wrong token after Restart: HTTP %d, want 401", code)
	}

	if err := s.rt.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rt.Restart(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Errorf("Restart of a removed sandbox: %v, want NotFound", err)
	}
}

// callRaw sends body as is (not JSON) and returns the status and body.
func (s *suite) callRaw(t *testing.T, method, url, token, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	return s.send(t, method, url, token, "", rd)
}
