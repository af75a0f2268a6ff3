package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

func TestLeasePauseResume(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-pause", "-o", "json")
	var acq struct {
		Lease struct{ ID string } `json:"lease"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	id := acq.Lease.ID
	// The in-process runtime cannot freeze (the default mode).
	if code, _, errs := runCLI(t, s, "pause", id); code != 1 || !strings.Contains(errs, "cannot freeze") {
		t.Errorf("pause (freeze) on inproc: %d %q", code, errs)
	}
	code, out, errs = runCLI(t, s, "pause", id, "--mode", "hibernate", "-o", "json")
	var l struct{ State, Paused string }
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.State != "LEASE_STATE_PAUSED" || l.Paused != "hibernate" {
		t.Fatalf("pause --mode hibernate: %d %q %q", code, out, errs)
	}
	code, out, errs = runCLI(t, s, "resume", id, "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.State != "LEASE_STATE_READY" {
		t.Fatalf("resume: %d %q %q", code, out, errs)
	}
}

func TestAcquireIdlePolicy(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-idle", "--idle-policy", "hibernate", "-o", "json")
	var acq struct {
		Lease struct{ IdlePolicy string } `json:"lease"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil || acq.Lease.IdlePolicy != "hibernate" {
		t.Fatalf("acquire --idle-policy hibernate: %d %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, s, "acquire", "--conversation", "c-idle2", "--idle-policy", "nap"); code != 1 || !strings.Contains(errs, "idle_policy") {
		t.Errorf("acquire --idle-policy nap: %d %q", code, errs)
	}
}
