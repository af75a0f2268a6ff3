package iptables

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRun checks stdin and stdout, and that an error names the command and
// carries its stderr, also when ctx is already cancelled.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := Run(ctx, []byte("in\n"), "cat")
	if err != nil || out != "in\n" {
		t.Fatalf("Run(cat) = %q, %v", out, err)
	}
	_, err = Run(ctx, nil, "sh", "-c", "echo oops >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "sh -c") || !strings.Contains(err.Error(), "oops") {
		t.Errorf("Run(failing) = %v", err)
	}
	if _, err := Run(ctx, nil, "berth-no-such-command"); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("Run(missing) = %v, want exec.ErrNotFound", err)
	}
}

// TestLock checks that a second Lock of the same file waits for the first
// release.
func TestLock(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	release := Lock("berth-test.lock")
	got := make(chan struct{})
	go func() {
		Lock("berth-test.lock")()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("second Lock did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	<-got
}
