package kubernetes

// Limitations declares what this backend cannot enforce that the other
// backends do (the names of package runtime/conformance's Limited; see
// docs/kubernetes.md):
//
//   - "pids-limit": Resources.PidsLimit is not applied per sandbox. A Pod
//     has no field for it: the kubelet's podPidsLimit is one value for
//     every Pod on a node, so the node's setting bounds each sandbox.
//   - "host-mounts": a Spec's host mounts are refused. A Pod under Pod
//     Security baseline has no hostPath volume.
//   - "volume-size": the size of a workspace volume's files is not
//     measured: a claim's files are on a node or a storage system the
//     orchestrator does not read.
//   - "freeze": a sandbox cannot be frozen in place (the Runtime is no
//     runtime.Freezer): the kubelet has no pause, a Pod's containers
//     cannot be frozen through the Kubernetes API. Pause in mode
//     hibernate (Stop, then Restart on the same claim) works.
func (r *Runtime) Limitations() []string {
	return []string{"pids-limit", "host-mounts", "volume-size", "freeze"}
}
