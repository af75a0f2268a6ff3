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
	// LimitHostMounts: Spec.Mounts of type MountBind are refused
	// (FailedPrecondition). A Kubernetes Pod under Pod Security baseline
	// has no hostPath volume. The suite then mounts no host directory
	// (Mounts) and checks that one is refused.
	LimitHostMounts = "host-mounts"
	// LimitVolumeSize: the size of a workspace volume's files is not
	// measured (InspectVolume's SizeBytes is -1, Usage does not count
	// it). A Kubernetes claim's files are on a node or a storage system
	// the orchestrator does not read. The suite then does not check those
	// figures (Mounts).
	LimitVolumeSize = "volume-size"
	// LimitFreeze: a sandbox cannot be frozen in place (the runtime is no
	// runtime.Freezer; pause in mode freeze is refused, hibernate works).
	// The kubelet has no pause: a Pod's containers cannot be frozen
	// through the Kubernetes API. The suite then checks that the runtime
	// indeed implements no Freezer (PauseResume).
	LimitFreeze = "freeze"
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
