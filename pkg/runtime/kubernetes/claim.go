package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// bindsAtOnce reports whether claims of StorageClass class are bound when
// created (volumeBindingMode Immediate) rather than when a Pod using them
// is scheduled (WaitForFirstConsumer). It reads the StorageClass once
// (deploy/kubernetes's ClusterRole berth-storageclasses); one that cannot be
// read counts as WaitForFirstConsumer, so that Create never waits for a
// binding that waits for its Pod.
func (r *Runtime) bindsAtOnce(ctx context.Context, class string) bool {
	if class == "" {
		return false
	}
	r.classMu.Lock()
	immediate, ok := r.classes[class]
	r.classMu.Unlock()
	if ok {
		return immediate
	}
	sc, err := r.cs.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{})
	if err != nil {
		r.log.Debug("kubernetes: storage class not read; not waiting for claims to bind", "class", class, "err", err)
		return false
	}
	immediate = sc.VolumeBindingMode == nil || *sc.VolumeBindingMode == storagev1.VolumeBindingImmediate
	r.classMu.Lock()
	r.classes[class] = immediate
	r.classMu.Unlock()
	return immediate
}

// waitBound waits until claim is bound when its StorageClass binds at
// once: a Pod whose claim is not bound yet is held back by the kubelet,
// which retries its volumes only after a back-off of seconds. It watches
// the claim (no polling: 20 Creates at once would spend the client's rate
// limit).
func (r *Runtime) waitBound(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	if claim.Spec.StorageClassName == nil || !r.bindsAtOnce(ctx, *claim.Spec.StorageClassName) {
		return nil
	}
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace)
	phase, rv := claim.Status.Phase, claim.ResourceVersion
	for phase != corev1.ClaimBound {
		w, err := claims.Watch(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", claim.Name).String(), ResourceVersion: rv})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("kubernetes: claim %s not bound (phase %s): %w", claim.Name, phase, ctx.Err())
			}
			return r.apiErr(err, "watch persistentvolumeclaim", claim.Name)
		}
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*corev1.PersistentVolumeClaim)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted {
				w.Stop()
				return errdefs.NotFound("kubernetes: claim %s deleted while waiting for it to bind", claim.Name)
			}
			phase, rv = c.Status.Phase, c.ResourceVersion
			if phase == corev1.ClaimBound {
				break
			}
		}
		w.Stop()
		if phase != corev1.ClaimBound {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("kubernetes: claim %s not bound (phase %s): %w", claim.Name, phase, err)
			}
			// The API server closed the watch (or its version expired):
			// read the claim again and watch from there.
			got, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				return r.apiErr(err, "get persistentvolumeclaim", claim.Name)
			}
			phase, rv = got.Status.Phase, got.ResourceVersion
		}
	}
	return nil
}
