package runtime

import (
	"github.com/berth-dev/berth/pkg/errdefs"
)

// SandboxLabels returns the labels a backend writes on the sandbox it
// creates for spec: LabelManaged=true, the lease, conversation and instance
// labels, and spec.Labels under LabelUserPrefix. The instance label is
// spec.InstanceID, or defaultInstance (the backend's configured instance)
// when the spec leaves it empty. Every backend labels with it, so List,
// Watch and the lease manager's reconciliation read the same keys on each.
func SandboxLabels(spec Spec, defaultInstance string) map[string]string {
	instance := spec.InstanceID
	if instance == "" {
		instance = defaultInstance
	}
	labels := make(map[string]string, 4+len(spec.Labels))
	labels[LabelManaged] = "true"
	labels[LabelLease] = spec.LeaseID
	labels[LabelConversation] = spec.ConversationID
	labels[LabelInstance] = instance
	for k, v := range spec.Labels {
		labels[LabelUserPrefix+k] = v
	}
	if spec.Pool != "" {
		labels[LabelPool] = spec.Pool
		labels[LabelPoolProfile] = spec.PoolProfile
	}
	return labels
}

// IsManaged reports whether labels mark something berth created
// (LabelManaged=true). Backends never touch what is not.
func IsManaged(labels map[string]string) bool { return labels[LabelManaged] == "true" }

// CheckManaged returns nil when labels mark container id as berth's, and
// errdefs.ErrNotFound otherwise (berth does not reveal, or act on, what it
// did not create). engine prefixes the message ("docker").
func CheckManaged(engine, id string, labels map[string]string) error {
	if IsManaged(labels) {
		return nil
	}
	return errdefs.NotFound("%s: container %s is not managed by berth (no %s=true label)", engine, id, LabelManaged)
}

// SetLabels sets s.Labels to labels and reads the lease, conversation and
// instance ids back from them: the reverse of SandboxLabels.
func (s *Sandbox) SetLabels(labels map[string]string) {
	s.Labels = labels
	s.LeaseID = labels[LabelLease]
	s.ConversationID = labels[LabelConversation]
	s.InstanceID = labels[LabelInstance]
}
