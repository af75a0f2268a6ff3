// Package kubernetes is berth's Kubernetes backend: one Pod per sandbox,
// through k8s.io/client-go, as the orchestrator's ServiceAccount
// (deploy/kubernetes).
//
// A sandbox is a Pod named from its lease id, with restartPolicy Never, an
// init container from berth's agent image that copies the static agent into
// an emptyDir (so any image works, even one with no files), the agent as
// the sandbox container's PID 1 on port 7000, its token and secrets in a
// Secret referenced by secretKeyRef, berth's labels (exactly, in an
// annotation; as Pod labels where Kubernetes' syntax allows), limits from
// the Spec's resources and a hardened securityContext. The endpoint is the
// Pod's IP. Watch comes from an informer. Kubernetes cannot freeze a Pod,
// so the backend does not implement runtime.Freezer; Stop ends a Pod
// (activeDeadlineSeconds) and Restart replaces it. RunElected is the
// leader election of several replicas. See docs/kubernetes.md.
package kubernetes
