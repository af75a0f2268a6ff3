package kubernetes

import (
	"context"
	"encoding/json"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// claimAttempts bounds ClaimMember's tries: the first reads the Pod from
// the informer, which may lag; a conflict is read again from the API
// server before it is taken for another replica's claim.
const claimAttempts = 3

// ClaimMember claims warm pool member id for the orchestrator instance
// claimant (lease.MemberClaimer; docs/pools.md "Several replicas"): one
// patch of the Pod, with its resourceVersion as precondition, sets
// runtime.LabelPoolClaim to claimant and moves runtime.LabelInstance to
// claimant, so that the claiming replica's reconcile, events and removals
// by label find the Pod as its own from then on. The API server applies
// one patch per resourceVersion: of two replicas claiming one Pod, one
// wins and the other gets errdefs.ErrConflict, as does a claim of a Pod
// claimed already. A Pod that is not a pool's is FailedPrecondition; a
// missing one NotFound. It returns once the informer shows the claim.
func (r *Runtime) ClaimMember(ctx context.Context, id, claimant string) error {
	if claimant == "" {
		return errdefs.InvalidArgument("claimant", "required")
	}
	claimed, err := r.patchMember(ctx, id, func(labels map[string]string) error {
		if c := labels[runtime.LabelPoolClaim]; c != "" {
			return errdefs.Conflict("kubernetes: pool member %s is claimed by %s already", id, c)
		}
		labels[runtime.LabelPoolClaim] = claimant
		labels[runtime.LabelInstance] = claimant
		return nil
	})
	if err != nil {
		return err
	}
	r.awaitLabel(ctx, claimed, runtime.LabelPoolClaim, claimant)
	return nil
}

// MarkMemberReady marks warm pool member id ready to be handed out
// (runtime.LabelPoolReady; lease.MemberClaimer), with the same
// compare-and-swap as ClaimMember: a member claimed already is
// errdefs.ErrConflict. It returns once the informer shows the mark.
func (r *Runtime) MarkMemberReady(ctx context.Context, id string) error {
	marked, err := r.patchMember(ctx, id, func(labels map[string]string) error {
		if c := labels[runtime.LabelPoolClaim]; c != "" {
			return errdefs.Conflict("kubernetes: pool member %s is claimed by %s already", id, c)
		}
		labels[runtime.LabelPoolReady] = "true"
		return nil
	})
	if err != nil {
		return err
	}
	r.awaitLabel(ctx, marked, runtime.LabelPoolReady, "true")
	return nil
}

// patchMember changes berth's labels of warm pool member id by change
// (given a copy; an error refuses) in one patch of the Pod with its
// resourceVersion as precondition: labelsAnnotation, and the Pod's labels
// where Kubernetes accepts the values. A conflict is read again from the
// API server (the informer may lag) and retried, at most claimAttempts
// times in all; then it is errdefs.ErrConflict. It returns the patched Pod.
func (r *Runtime) patchMember(ctx context.Context, id string, change func(labels map[string]string) error) (*corev1.Pod, error) {
	pod, err := r.managedPod(ctx, id)
	for attempt := 1; ; attempt++ {
		if err != nil {
			return nil, err
		}
		var patch []byte
		if patch, err = memberPatch(pod, change); err != nil {
			return nil, err
		}
		var patched *corev1.Pod
		patched, err = r.cs.CoreV1().Pods(r.cfg.Namespace).Patch(ctx, id, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			return patched, nil
		case apierrors.IsConflict(err) && attempt < claimAttempts:
			// Changed since our copy: read it from the API server (the
			// informer may not have the change yet) and look again.
			pod, err = r.cs.CoreV1().Pods(r.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
			if err != nil {
				err = r.apiErr(err, "get pod", id)
			}
		case apierrors.IsConflict(err):
			return nil, errdefs.Conflict("kubernetes: pool member %s changed under %d patches; taken for claimed", id, attempt)
		default:
			return nil, r.apiErr(err, "patch pool member", id)
		}
	}
}

// memberPatch returns the JSON merge patch of patchMember: pod's
// resourceVersion (the precondition) and berth's labels as change leaves
// them, in labelsAnnotation and, where Kubernetes accepts the value, in
// the Pod's labels (null removes one that cannot hold its new value). A
// pod that is no pool's, or is being deleted, is refused.
func memberPatch(pod *corev1.Pod, change func(labels map[string]string) error) ([]byte, error) {
	labels := maps.Clone(labelsOf(pod.ObjectMeta))
	switch {
	case labels[runtime.LabelPool] == "":
		return nil, errdefs.FailedPrecondition("kubernetes: pod %s is no warm pool's member", pod.Name)
	case pod.DeletionTimestamp != nil:
		return nil, errdefs.Conflict("kubernetes: pool member %s is being deleted", pod.Name)
	}
	before := maps.Clone(labels)
	if err := change(labels); err != nil {
		return nil, err
	}
	all, err := json.Marshal(labels)
	if err != nil {
		return nil, errdefs.Internal("kubernetes: labels of pod %s: %v", pod.Name, err)
	}
	kube := map[string]any{}
	for k, v := range labels {
		if before[k] == v || len(validation.IsQualifiedName(k)) != 0 {
			continue
		}
		if len(validation.IsValidLabelValue(v)) == 0 {
			kube[k] = v
		} else {
			kube[k] = nil
		}
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": pod.ResourceVersion,
		"labels":          kube,
		"annotations":     map[string]string{labelsAnnotation: string(all)},
	}})
}

// awaitLabel waits (briefly) until the informer holds berth's label key
// with value on Pod patched: from then on List, Get and Watch show it, so
// the claimant's reconciliation finds the Pod as its own at once. Past
// the bound the caller goes on: the informer catches up within its
// watch's latency.
func (r *Runtime) awaitLabel(ctx context.Context, patched *corev1.Pod, key, value string) {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, _ = r.waitPod(wctx, patched, func(p *corev1.Pod) (bool, error) {
		return labelsOf(p.ObjectMeta)[key] == value, nil
	})
}
