package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Restart brings an exited sandbox back. A Pod cannot start again once its
// container ended (restartPolicy Never, so that an exit is reported as one
// rather than hidden by the kubelet's restarts): Restart replaces the Pod
// by one with the same name, spec, labels, Secret and workspace claim, so
// the sandbox keeps its id, token and the files of /workspace; its address
// changes (files outside /workspace go with the old container). A running
// sandbox is only waited for.
func (r *Runtime) Restart(ctx context.Context, id string) (runtime.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ReadyTimeout)
	defer cancel()
	// The API server's copy, not the informer's: a Pod removed a moment
	// ago may still be in the cache, and recreating it would bring a
	// removed sandbox back (without its Secret, which Remove deleted).
	pod, err := r.cs.CoreV1().Pods(r.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		return runtime.Sandbox{}, r.apiErr(err, "get pod", id)
	}
	if err := runtime.CheckManaged("kubernetes", id, pod.Labels); err != nil {
		return runtime.Sandbox{}, err
	}
	if sandboxOf(pod).State != runtime.StateExited {
		return r.waitReady(ctx, pod, nil)
	}
	next := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: maps.Clone(pod.Labels), Annotations: maps.Clone(pod.Annotations)},
		Spec:       *pod.Spec.DeepCopy(),
	}
	next.Spec.ActiveDeadlineSeconds = nil
	dctx, dcancel := runtime.Detached(ctx)
	defer dcancel()
	zero := int64(0)
	uid := pod.UID
	err = r.cs.CoreV1().Pods(r.cfg.Namespace).Delete(dctx, id, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return runtime.Sandbox{}, r.apiErr(err, "delete exited pod", id)
	}
	if apierrors.IsNotFound(err) {
		// Removed since the read above: not brought back.
		return runtime.Sandbox{}, r.apiErr(err, "delete exited pod", id)
	}
	var created *corev1.Pod
	for {
		// A force delete is immediate; still, retry while the name is taken.
		created, err = r.cs.CoreV1().Pods(r.cfg.Namespace).Create(dctx, next, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return runtime.Sandbox{}, r.apiErr(err, "create pod again", id)
	}
	sb, err := r.waitReady(ctx, created, nil)
	if err != nil {
		return runtime.Sandbox{}, r.backend().TimeoutErr(context.WithoutCancel(ctx), ctx, r.cfg.ReadyTimeout, fmt.Errorf("kubernetes: restart pod %s: %w", id, err))
	}
	return sb, nil
}
