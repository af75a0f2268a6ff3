package conformance

import (
	"slices"
	"testing"
)

// Limited is implemented by a runtime that declares promises of the suite it
// cannot keep on its platform. The suite then leaves out exactly the checks
// of each declared promise, says so in the test log, and runs everything
// else. Only what a platform cannot do belongs here: the Docker and
// containerd backends declare nothing, so every check applies to them.
type Limited interface {
	// Limitations returns the declared limitations (the Limit* names).
	Limitations() []string
}

// The limitations a runtime may declare.
const (
	// LimitPids: Resources.PidsLimit is not enforced per sandbox. A
	// Kubernetes Pod cannot express one (the kubelet's podPidsLimit is a
	// single value for the whole node). The suite then does not check
	// pids.max (Limits) nor that a pids limit of 1 fails Create
	// (EarlyExit).
	LimitPids = "pids-limit"
)

// lacks reports whether the runtime under test declared limitation l, and
// logs that the check it guards is left out.
func (s *suite) lacks(t *testing.T, l string) bool {
	t.Helper()
	lim, ok := s.rt.(Limited)
	if !ok || !slices.Contains(lim.Limitations(), l) {
		return false
	}
	t.Logf("the runtime declares the limitation %q: its check is left out", l)
	return true
}
