package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

// TestLeaseNetwork drives `lease network` and `lease acquire --network-mode`
// against an in-process orchestrator (its agents listen on loopback, where
// only an open policy can hold; the real enforcement is tested in
// internal/egress and e2e/egress_test.go).
func TestLeaseNetwork(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-net", "--network-mode", "open", "-o", "json")
	var acq struct {
		Lease struct {
			ID      string
			Network struct{ Mode string }
		} `json:"lease"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil || acq.Lease.Network.Mode != "open" {
		t.Fatalf("acquire --network-mode open: %d %q %q", code, out, errs)
	}
	id := acq.Lease.ID
	code, out, errs = runCLI(t, s, "network", id, "--mode", "open", "-o", "json")
	var l struct {
		ID      string
		Network struct{ Mode string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.ID != id || l.Network.Mode != "open" {
		t.Fatalf("network --mode open: %d %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, s, "network", id, "--mode", "closed"); code != 1 || !strings.Contains(errs, "network.mode") {
		t.Errorf("network --mode closed: %d %q", code, errs)
	}
	if code, _, errs := runCLI(t, s, "network", id, "--mode", "restricted", "--allow", "bad..name"); code != 1 || !strings.Contains(errs, "network.allow[0]") {
		t.Errorf("network --allow bad..name: %d %q", code, errs)
	}
	if code, _, errs := runCLI(t, s, "network", id); code == 0 || !strings.Contains(errs, "--mode") {
		t.Errorf("network without flags: %d %q", code, errs)
	}
	if code, _, errs := runCLI(t, s, "acquire", "--conversation", "c-net2", "--network-mode", "closed"); code != 1 || !strings.Contains(errs, "network.mode") {
		t.Errorf("acquire --network-mode closed: %d %q", code, errs)
	}
}
