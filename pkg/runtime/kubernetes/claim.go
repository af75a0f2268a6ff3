package kubernetes

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// which retries its volumes only after a back-off of seconds.
func (r *Runtime) waitBound(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	if claim.Spec.StorageClassName == nil || !r.bindsAtOnce(ctx, *claim.Spec.StorageClassName) {
		return nil
	}
	for c := claim; c.Status.Phase != corev1.ClaimBound; {
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes: claim %s not bound (phase %s): %w", claim.Name, c.Status.Phase, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		got, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return r.apiErr(err, "get persistentvolumeclaim", claim.Name)
		}
		c = got
	}
	return nil
}
