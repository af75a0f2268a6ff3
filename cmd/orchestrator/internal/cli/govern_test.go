package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
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

func TestUsageLine(t *testing.T) {
	u := &orchv1.Usage{CpuNanos: 1_234_567_890, CpuPercent: 12.34, MemoryBytes: 40 << 20, MemoryPeakBytes: 41 << 20, MemoryLimitBytes: 512 << 20,
		NetworkRxBytes: 2048, NetworkTxBytes: 100, Processes: 16, SampledAt: timestamppb.Now()}
	want := "usage: cpu 1.235s (12.3%), memory 40Mi (peak 41Mi) of 512Mi, network 2Ki in / 100 out, 16 processes"
	if got := usageLine(u); got != want {
		t.Errorf("usageLine = %q, want %q", got, want)
	}
	var b bytes.Buffer
	printTable(&b, &orchv1.Lease{Id: "x", Usage: u})
	if !strings.Contains(b.String(), want) {
		t.Errorf("lease table lacks the usage line:\n%s", b.String())
	}
}
