package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

// TestSignTopLogsCommands drives lease sign, lease top and logs against an
// orchestrator with in-process sandboxes (which report no live usage).
func TestSignTopLogsCommands(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-govern", "-o", "json")
	var acq struct {
		Lease struct{ ID string } `json:"lease"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil {
		t.Fatalf("acquire: %d %s %s", code, out, errs)
	}
	id := acq.Lease.ID

	code, out, errs = runCLI(t, s, "sign", id, "--port", "8080", "--expires", "5m")
	if code != 0 || !strings.HasPrefix(out, "http://") || !strings.Contains(out, "/v1/signed/"+id+"/ports/8080/?berth_exp=") || strings.Count(out, "\n") != 1 {
		t.Errorf("sign --port: %d %q %s", code, out, errs)
	}
	code, out, _ = runCLI(t, s, "sign", id, "--download", "/workspace/a b.txt", "-o", "json")
	var sr struct{ URL, Path, Method, ExpiresAt string }
	if code != 0 || json.Unmarshal([]byte(out), &sr) != nil || sr.Method != "GET" || !strings.Contains(sr.Path, "/files/workspace/a%20b.txt?") {
		t.Errorf("sign --download -o json: %d %q", code, out)
	}
	for _, args := range [][]string{
		{"sign", id},
		{"sign", id, "--port", "80", "--upload", "/x"},
		{"sign", id, "--port", "80", "--expires", "-1s"},
	} {
		if code, _, errs := runCLI(t, s, args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errs)
		}
	}
	if code, _, errs := runCLI(t, s, "sign", id, "--download", "relative"); code != 1 || !strings.Contains(errs, "download") {
		t.Errorf("sign a relative path: %d %s", code, errs)
	}

	code, out, errs = runCLI(t, s, "top", "--once")
	if code != 0 || !strings.HasPrefix(out, "LEASE") || !strings.Contains(out, id) {
		t.Errorf("top --once: %d %q %s", code, out, errs)
	}
	code, out, _ = runCLI(t, s, "top", "-o", "json")
	if code != 0 || !strings.Contains(out, `"leases"`) || !strings.Contains(out, id) {
		t.Errorf("top -o json: %d %q", code, out)
	}

	var lout, lerr bytes.Buffer
	code = Run(context.Background(), []string{"logs", id}, operatorEnv(s, &lout, &lerr))
	if code != 0 || !strings.Contains(lout.String(), "transition UNSPECIFIED -> PENDING: acquired") || !strings.Contains(lout.String(), "PENDING -> READY") {
		t.Errorf("logs: %d %q %s", code, lout.String(), lerr.String())
	}
	lout.Reset()
	code = Run(context.Background(), []string{"logs", id, "-o", "json"}, operatorEnv(s, &lout, &lerr))
	first, _, _ := strings.Cut(lout.String(), "\n")
	var e struct{ Source, Text string }
	if code != 0 || json.Unmarshal([]byte(first), &e) != nil || e.Source != "transition" || e.Text != "acquired" {
		t.Errorf("logs -o json: %d %q", code, lout.String())
	}
	if code = Run(context.Background(), []string{"logs", id, "--tail", "-3"}, operatorEnv(s, &lout, &lerr)); code != 2 {
		t.Errorf("logs --tail -3: exit %d", code)
	}
	if code = Run(context.Background(), []string{"logs", "nonexistent-lease"}, operatorEnv(s, &lout, &lerr)); code != 1 {
		t.Errorf("logs of no lease: exit %d", code)
	}
	// --follow ends by itself when the lease ends.
	done := make(chan int, 1)
	var fout bytes.Buffer
	go func() {
		done <- Run(context.Background(), []string{"logs", id, "--follow"}, operatorEnv(s, &fout, &lerr))
	}()
	if code, _, errs := runCLI(t, s, "release", id); code != 0 {
		t.Fatalf("release: %s", errs)
	}
	if code := <-done; code != 0 || !strings.Contains(fout.String(), "-> RELEAS") {
		t.Errorf("logs --follow: exit %d: %q", code, fout.String())
	}
}
