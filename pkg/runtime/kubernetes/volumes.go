package kubernetes

import (
	"context"
	"encoding/json"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Persistent workspaces (runtime.VolumeManager): a workspace volume
// (runtime.MountVolume, the lease manager's berth-ws-HASH of an owner's
// conversation) is a PersistentVolumeClaim of that name, labelled like
// Docker's volumes (runtime.VolumeLabels; exactly in labelsAnnotation),
// without LabelSandbox: it belongs to no sandbox, outlives the leases that
// mount it (Remove leaves it), and the next acquire of the conversation
// mounts it again. Its size is the first sandbox's disk limit (else
// DefaultWorkspaceSize); a claim is not resized.

var _ runtime.VolumeManager = (*Runtime)(nil)

// volumeSelector is the API server's part of sel for workspace claims.
func volumeSelector(sel runtime.Selector) string {
	set := labels.Set{runtime.LabelManaged: "true", runtime.LabelVolume: runtime.VolumeKindWorkspace}
	for k, v := range sel {
		if len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			set[k] = v
		}
	}
	return labels.SelectorFromSet(set).String()
}

// validClaimName reports whether a volume name can name a claim (a DNS
// subdomain: the lease manager's names are).
func validClaimName(name string) error {
	if !runtime.ValidVolumeName(name) {
		return errdefs.InvalidArgument("name", "%q is not a volume name", name)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return errdefs.InvalidArgument("name", "%q cannot name a PersistentVolumeClaim: %s", name, errs[0])
	}
	return nil
}

// buildVolumeClaim returns the claim of workspace volume m.
func (r *Runtime) buildVolumeClaim(m runtime.Mount, res runtime.Resources) *corev1.PersistentVolumeClaim {
	all := maps.Clone(m.VolumeLabels)
	if all == nil {
		all = map[string]string{}
	}
	all[runtime.LabelManaged] = "true"
	j, _ := json.Marshal(all)
	kl := kubeLabels(all, "")
	delete(kl, LabelSandbox)
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: m.Source, Namespace: r.cfg.Namespace, Labels: kl,
			Annotations: map[string]string{labelsAnnotation: string(j)}},
		Spec: r.claimSpec(res),
	}
}

// ensureVolumeClaims creates the claims of spec's workspace volumes that do
// not exist yet and waits until they are bound (when their StorageClass
// binds at once). An existing claim of that name that is not a berth
// workspace is FailedPrecondition; one being deleted (a volume removal)
// Unavailable.
func (r *Runtime) ensureVolumeClaims(ctx context.Context, spec runtime.Spec, res runtime.Resources, tl *timeline) error {
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace)
	for _, m := range spec.Mounts {
		if m.Type != runtime.MountVolume {
			continue
		}
		if err := validClaimName(m.Source); err != nil {
			return err
		}
		claim, err := claims.Get(ctx, m.Source, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			claim, err = claims.Create(ctx, r.buildVolumeClaim(m, res), metav1.CreateOptions{})
			if err == nil {
				r.log.Info("created workspace volume", "volume", m.Source, "conversation_id", m.VolumeLabels[runtime.LabelConversation])
			} else if apierrors.IsAlreadyExists(err) {
				claim, err = claims.Get(ctx, m.Source, metav1.GetOptions{})
			}
		}
		if err != nil {
			return r.apiErr(err, "create persistentvolumeclaim", m.Source)
		}
		tl.mark(stepClaimCreated)
		switch {
		case !runtime.IsWorkspaceVolume(labelsOf(claim.ObjectMeta)):
			return errdefs.FailedPrecondition("kubernetes: persistentvolumeclaim %s exists but is not a berth workspace volume (no %s=%s label)",
				m.Source, runtime.LabelVolume, runtime.VolumeKindWorkspace)
		case claim.DeletionTimestamp != nil:
			return errdefs.Unavailable("kubernetes: workspace volume %s is being removed; retry", m.Source)
		}
		if err := r.waitBound(ctx, claim); err != nil {
			return err
		}
		tl.mark(stepClaimBound)
	}
	return nil
}

// ListVolumes implements runtime.VolumeManager: the namespace's workspace
// claims whose labels match sel. Sizes are not measured (-1).
func (r *Runtime) ListVolumes(ctx context.Context, sel runtime.Selector) ([]runtime.Volume, error) {
	list, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: volumeSelector(sel)})
	if err != nil {
		return nil, r.apiErr(err, "list persistentvolumeclaims", "")
	}
	out := make([]runtime.Volume, 0, len(list.Items))
	for i := range list.Items {
		c := &list.Items[i]
		if c.DeletionTimestamp != nil {
			continue
		}
		v := toVolume(c)
		if runtime.IsWorkspaceVolume(v.Labels) && sel.Matches(v.Labels) {
			out = append(out, v)
		}
	}
	return out, nil
}

// InspectVolume implements runtime.VolumeManager. The size of the files is
// not measured (-1): the API server does not know it, and the volume's
// files are on a node (or a storage system) berth does not read.
func (r *Runtime) InspectVolume(ctx context.Context, name string) (runtime.Volume, error) {
	c, err := r.workspaceClaim(ctx, name)
	if err != nil {
		return runtime.Volume{}, err
	}
	return toVolume(c), nil
}

// RemoveVolume implements runtime.VolumeManager: it deletes the claim (its
// files go by its StorageClass's reclaim policy). A claim a berth Pod
// mounts is FailedPrecondition.
func (r *Runtime) RemoveVolume(ctx context.Context, name string) error {
	if err := validClaimName(name); err != nil {
		return err
	}
	c, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil // gone already
	case err != nil:
		return r.apiErr(err, "get persistentvolumeclaim", name)
	case !runtime.IsWorkspaceVolume(labelsOf(c.ObjectMeta)):
		return errdefs.NotFound("kubernetes: persistentvolumeclaim %s is not a berth workspace volume", name)
	case c.DeletionTimestamp != nil:
		return nil // being deleted
	}
	pods, err := r.listPods(ctx, selector(nil))
	if err != nil {
		return r.apiErr(err, "list pods", "")
	}
	for _, p := range pods {
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == name {
				return errdefs.FailedPrecondition("kubernetes: workspace volume %s is in use by pod %s", name, p.Name)
			}
		}
	}
	uid := c.UID
	err = r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return r.apiErr(err, "delete persistentvolumeclaim", name)
	}
	r.log.Info("removed workspace volume", "volume", name)
	return nil
}

// workspaceClaim returns the workspace claim name; NotFound when there is
// none, it is being deleted, or it is not a berth workspace.
func (r *Runtime) workspaceClaim(ctx context.Context, name string) (*corev1.PersistentVolumeClaim, error) {
	if err := validClaimName(name); err != nil {
		return nil, err
	}
	c, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, errdefs.NotFound("kubernetes: volume %s not found", name)
	}
	if err != nil {
		return nil, r.apiErr(err, "get persistentvolumeclaim", name)
	}
	if c.DeletionTimestamp != nil || !runtime.IsWorkspaceVolume(labelsOf(c.ObjectMeta)) {
		return nil, errdefs.NotFound("kubernetes: volume %s not found", name)
	}
	return c, nil
}

// toVolume translates a workspace claim.
func toVolume(c *corev1.PersistentVolumeClaim) runtime.Volume {
	v := runtime.Volume{Name: c.Name, CreatedAt: c.CreationTimestamp.UTC(), SizeBytes: -1}
	v.SetLabels(labelsOf(c.ObjectMeta))
	return v
}
