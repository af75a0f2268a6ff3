package conformance

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// testReadyTimeoutError: a sandbox not ready within Spec.ReadyTimeout fails
// Create with Unavailable naming ReadyTimeout and still matching
// context.DeadlineExceeded. A create that is ready in time (a warm create
// can be) is removed and tried again with a shorter timeout, so the check
// always runs (no skip) and nothing is left running.
func (s *suite) testReadyTimeoutError(t *testing.T) {
	t.Parallel()
	var err error
	for timeout := 150 * time.Millisecond; ; timeout /= 3 { // 150 ms: enough to create, usually not to be ready
		spec := s.spec(s.images.Empty)
		spec.ReadyTimeout = timeout
		var sb runtime.Sandbox
		if sb, err = s.rt.Create(context.Background(), spec); err != nil {
			s.assertNothingLeft(t, spec.LeaseID)
			break
		}
		if err := s.rt.Remove(context.Background(), sb.ID); err != nil {
			t.Fatalf("Remove %s: %v", sb.ID, err)
		}
		if timeout < time.Millisecond {
			t.Fatalf("Create with ReadyTimeout %s succeeded", timeout)
		}
		t.Logf("ready within %s; trying a shorter ReadyTimeout", timeout)
	}
	if !errdefs.IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ReadyTimeout") {
		t.Errorf("err = %v; want Unavailable, DeadlineExceeded, naming ReadyTimeout", err)
	}
}

// testEarlyExit starves the agent of processes (a pids limit of 1: the Go
// runtime cannot even start its threads): Create must notice the exit at
// once rather than wait for the ready timeout, report it as
// FailedPrecondition (with the sandbox's last output lines, under
// WithFailureOutput), and leave nothing behind.
func (s *suite) testEarlyExit(t *testing.T) {
	t.Parallel()
	if s.lacks(t, LimitPids) {
		t.Skip("a pids limit of 1 is how this check makes the agent die at once")
	}
	spec := s.spec(s.images.Empty)
	spec.Resources.PidsLimit = 1
	spec.ReadyTimeout = 20 * time.Second
	began := time.Now()
	sb, err := s.rt.Create(context.Background(), spec)
	if err == nil {
		t.Fatalf("the agent started with a pids limit of 1 (%s)", sb.ID)
	}
	t.Logf("failed in %s: %v", time.Since(began).Round(time.Millisecond), err)
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("failing Create took %s; an agent that dies at once should fail it fast", d)
	}
	// Depending on timing the engine reports the exit, or fails the start
	// itself ("cannot start a stopped process").
	exited := strings.Contains(err.Error(), "exited with code") || strings.Contains(err.Error(), "cannot start")
	if !errdefs.IsFailedPrecondition(err) || !exited {
		t.Errorf("err = %v; want FailedPrecondition reporting the exit", err)
	}
	if s.opts.failureOutput && !strings.Contains(err.Error(), " output (last") {
		t.Errorf("err = %v; want the sandbox's last output lines", err)
	}
	s.assertNothingLeft(t, spec.LeaseID)
}
