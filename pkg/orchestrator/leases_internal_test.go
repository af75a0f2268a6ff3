package orchestrator

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
)

// TestToLeasePhase: the lease's phase and the phase each transition
// entered reach the wire beside the state, which stays one of the API's
// states.
func TestToLeasePhase(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	l := lease.Lease{ID: "L", State: lease.StatePending, Phase: lease.PhaseRestarting, Transitions: []lease.Transition{
		{From: lease.StateUnspecified, To: lease.StatePending, Reason: "acquired", At: at},
		{From: lease.StatePending, To: lease.StateReady, Reason: "sandbox ready", At: at},
		{From: lease.StateReady, To: lease.StatePending, Phase: lease.PhaseRestarting, Reason: "container exited with code 1; restarting", At: at},
	}}
	out := toLease(l)
	if out.GetState().String() != "LEASE_STATE_PENDING" || out.GetPhase() != "restarting" {
		t.Fatalf("state %s phase %q, want PENDING restarting", out.GetState(), out.GetPhase())
	}
	var phases []string
	for _, tr := range out.GetTransitions() {
		phases = append(phases, tr.GetPhase())
	}
	if len(phases) != 3 || phases[0] != "" || phases[1] != "" || phases[2] != "restarting" {
		t.Fatalf("transition phases %q", phases)
	}
	if got := toLease(lease.Lease{ID: "L", State: lease.StateReady}).GetPhase(); got != "" {
		t.Fatalf("phase of a plain READY lease = %q, want empty", got)
	}
}
