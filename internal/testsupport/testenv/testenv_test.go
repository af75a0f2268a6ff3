package testenv

import (
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

// recorder is a testing.TB that records instead of stopping the goroutine
// (the embedded TB is nil: only the methods below may be called).
type recorder struct {
	testing.TB
	fatal, skipped, logged string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Fatalf(format string, a ...any) { r.fatal = format }
func (r *recorder) Skip(a ...any)                  { r.skipped = "skip" }
func (r *recorder) Log(a ...any)                   { r.logged = "log" }

func TestRequired(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "junk": false, "1": true, "true": true} {
		t.Setenv(RequireEnv, v)
		if got := Required(); got != want {
			t.Errorf("%s=%q: Required() = %v, want %v", RequireEnv, v, got, want)
		}
	}
}

func TestSkipOrFail(t *testing.T) {
	t.Setenv(RequireEnv, "")
	r := &recorder{}
	SkipOrFail(r, "no Docker")
	if r.skipped == "" || r.fatal != "" {
		t.Errorf("without %s: skipped %q fatal %q, want a skip", RequireEnv, r.skipped, r.fatal)
	}
	t.Setenv(RequireEnv, "1")
	r = &recorder{}
	SkipOrFailf(r, "no %s", "Docker")
	if r.fatal == "" || r.skipped != "" {
		t.Errorf("with %s=1: skipped %q fatal %q, want a failure", RequireEnv, r.skipped, r.fatal)
	}
	r = &recorder{}
	LogOrFail(r, "no shell image")
	if r.fatal == "" || r.logged != "" {
		t.Errorf("LogOrFail with %s=1: logged %q fatal %q, want a failure", RequireEnv, r.logged, r.fatal)
	}
	t.Setenv(RequireEnv, "0")
	r = &recorder{}
	LogOrFail(r, "no shell image")
	if r.fatal != "" || r.logged == "" {
		t.Errorf("LogOrFail with %s=0: logged %q fatal %q, want a log line", RequireEnv, r.logged, r.fatal)
	}
}

func TestLiveChildren(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := strconv.Itoa(cmd.Process.Pid) + "(sleep 30)"
	if got := LiveChildren(); !slices.Contains(got, want) {
		t.Fatalf("LiveChildren() = %v, want it to contain %q", got, want)
	}
	if code := NoChildrenLeft(0, 50*time.Millisecond); code != 1 {
		t.Fatalf("NoChildrenLeft with a live child = %d, want 1", code)
	}
	if code := NoChildrenLeft(3, time.Millisecond); code != 3 {
		t.Fatalf("NoChildrenLeft(3) = %d, want the failing code kept", code)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if code := NoChildrenLeft(0, 5*time.Second); code != 0 {
		t.Fatalf("NoChildrenLeft after the child ended = %d, want 0", code)
	}
}
