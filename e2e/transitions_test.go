package e2e

import (
	"net/http"
	"testing"

	"github.com/berth-dev/berth/pkg/lease"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestPauseResumeCyclesDocker performs the attack of a lease token that
// freezes and thaws its Docker sandbox 150 times (302 transitions): the
// lease keeps its last lease.MaxTransitions transitions and reports the
// dropped ones, through REST and after an orchestrator restart.
func TestPauseResumeCyclesDocker(t *testing.T) {
	o, dir, id, tok := dockerBaseLease(t, "bounds-cycles")
	check := pauseResumeCycles(t, o.api, id, tok)
	check("GET", o.mustGet(t, id))
	o.stop(t)
	o2 := startOrch(t, dir)
	check("GET after a restart", o2.mustGet(t, id))
}

// TestPauseResumeCyclesContainerd is TestPauseResumeCyclesDocker on
// containerd (without the restart).
func TestPauseResumeCyclesContainerd(t *testing.T) {
	requireContainerd(t)
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	r := o.acq(t, "bounds-cycles-"+randHex(4), minimalImage, "600s")
	check := pauseResumeCycles(t, o.api, r.GetLease().GetId(), r.GetToken())
	check("GET", o.mustGet(t, r.GetLease().GetId()))
}

// pauseResumeCycles freezes and thaws lease id 150 times with its token
// and returns the check of a lease read afterwards.
func pauseResumeCycles(t *testing.T, a *api, id, tok string) func(where string, l *orchv1.Lease) {
	const cycles = 150
	for i := range cycles {
		for _, op := range []string{":pause", ":resume"} {
			body := map[string]any{}
			if op == ":pause" {
				body["mode"] = "freeze"
			}
			if code, _, b := a.mustCall(t, http.MethodPost, "/v1/leases/"+id+op, body, tok); code != http.StatusOK {
				t.Fatalf("cycle %d %s: HTTP %d: %s", i, op, code, b)
			}
		}
	}
	total := 2 + 2*cycles // acquired, ready, then a freeze and a thaw each
	check := func(where string, l *orchv1.Lease) {
		t.Helper()
		trs := l.GetTransitions()
		if len(trs) != lease.MaxTransitions || l.GetTransitionsDropped() != int64(total-lease.MaxTransitions) {
			t.Fatalf("%s: %d transitions, %d dropped; want %d and %d", where, len(trs), l.GetTransitionsDropped(), lease.MaxTransitions, total-lease.MaxTransitions)
		}
		if last := trs[len(trs)-1]; last.GetTo() != orchv1.LeaseState_LEASE_STATE_READY || last.GetReason() != lease.ReasonThawed {
			t.Fatalf("%s: last transition %v", where, last)
		}
	}
	return check
}
