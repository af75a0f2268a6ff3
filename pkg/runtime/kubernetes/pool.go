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
// missing one NotFound.
func (r *Runtime) ClaimMember(ctx context.Context, id, claimant string) error {
	if claimant == "" {
		return errdefs.InvalidArgument("claimant", "required")
	}
	pod, err := r.managedPod(ctx, id)
	for attempt := 1; ; attempt++ {
		if err != nil {
			return err
		}
		var patch []byte
		if patch, err = claimPatch(pod, claimant); err != nil {
			return err
		}
		var claimed *corev1.Pod
		claimed, err = r.cs.CoreV1().Pods(r.cfg.Namespace).Patch(ctx, id, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			r.awaitClaimSeen(ctx, claimed, claimant)
			return nil
		case apierrors.IsConflict(err) && attempt < claimAttempts:
			// Changed since our copy: read it from the API server (the
			// informer may not have the change yet) and look again.
			pod, err = r.cs.CoreV1().Pods(r.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
			if err != nil {
				err = r.apiErr(err, "get pod", id)
			}
		case apierrors.IsConflict(err):
			return errdefs.Conflict("kubernetes: pool member %s changed under %d claims; taken for claimed", id, attempt)
		default:
			return r.apiErr(err, "claim pool member", id)
		}
	}
}

// claimPatch returns the JSON merge patch of ClaimMember: pod's
// resourceVersion (the precondition), LabelPoolClaim and LabelInstance
// set to claimant in berth's labels (labelsAnnotation) and, where
// Kubernetes accepts the value, in the Pod's labels. A pod claimed
// already, or no pool's, is refused.
func claimPatch(pod *corev1.Pod, claimant string) ([]byte, error) {
	labels := labelsOf(pod.ObjectMeta)
	switch {
	case labels[runtime.LabelPool] == "":
		return nil, errdefs.FailedPrecondition("kubernetes: pod %s is no warm pool's member", pod.Name)
	case labels[runtime.LabelPoolClaim] != "":
		return nil, errdefs.Conflict("kubernetes: pool member %s is claimed by %s already", pod.Name, labels[runtime.LabelPoolClaim])
	case pod.DeletionTimestamp != nil:
		return nil, errdefs.Conflict("kubernetes: pool member %s is being deleted", pod.Name)
	}
	labels = maps.Clone(labels)
	labels[runtime.LabelPoolClaim] = claimant
	labels[runtime.LabelInstance] = claimant
	all, err := json.Marshal(labels)
	if err != nil {
		return nil, errdefs.Internal("kubernetes: labels of pod %s: %v", pod.Name, err)
	}
	var value any // null removes a Kubernetes label that cannot hold the value
	if len(validation.IsValidLabelValue(claimant)) == 0 {
		value = claimant
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": pod.ResourceVersion,
		"labels":          map[string]any{runtime.LabelPoolClaim: value, runtime.LabelInstance: value},
		"annotations":     map[string]string{labelsAnnotation: string(all)},
	}})
}

// awaitClaimSeen waits (briefly) until the informer holds the claim of
// Pod claimed: from then on List, Get and Watch show it claimed, with the
// claimant's instance label, so the claimant's reconciliation finds the
// Pod as its own at once. Past the bound the caller goes on: the informer
// catches up within its watch's latency.
func (r *Runtime) awaitClaimSeen(ctx context.Context, claimed *corev1.Pod, claimant string) {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, _ = r.waitPod(wctx, claimed, func(p *corev1.Pod) (bool, error) {
		return labelsOf(p.ObjectMeta)[runtime.LabelPoolClaim] == claimant, nil
	})
}
