package kubernetes

import (
	"context"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// networkPolicyName is the NetworkPolicy that isolates every sandbox of
// the namespace.
const networkPolicyName = "berth-sandboxes"

// LabelOrchestrator marks the orchestrator's own Pods when it runs in the
// cluster: the only Pods that may reach the sandboxes' agents.
const LabelOrchestrator = "app.kubernetes.io/name=berth-orchestrator"

// networkPolicy returns the namespace's policy for every berth sandbox
// (LabelManaged=true): ingress only from the orchestrator's Pods to the
// agent's port (an orchestrator outside the cluster reaches Pods from
// their node, which network plugins allow), egress to the internet only,
// not to private and link-local ranges (other Pods, the nodes, the cloud's
// metadata service), and DNS (port 53, UDP and TCP) to the cluster's DNS
// Pods only (Config.DNSNamespace and Config.DNSPodLabels), not to any Pod
// of any namespace. It is enforced only by a network plugin that
// implements NetworkPolicy (Calico, Cilium, ...); on one that does not
// (the plain bridge plugin of make k8s-up, which scripts/k8s/up.sh makes
// up for with iptables rules) it is a statement, not a wall.
func (r *Runtime) networkPolicy() *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	agent := intstr.FromInt32(runtime.AgentPort)
	envd := intstr.FromInt32(runtime.EnvdPort)
	dns := intstr.FromInt32(53)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: networkPolicyName, Namespace: r.cfg.Namespace,
			Labels: map[string]string{runtime.LabelManaged: "true"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{runtime.LabelManaged: "true"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
					MatchLabels: map[string]string{"app.kubernetes.io/name": "berth-orchestrator"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &agent}, {Protocol: &tcp, Port: &envd}},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
					CIDR:   "0.0.0.0/0",
					Except: []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10", "127.0.0.0/8"},
				}}}},
				// One peer with both selectors: the DNS Pods of the DNS
				// namespace (two peers would allow either).
				{To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{namespaceNameLabel: r.cfg.DNSNamespace}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: maps.Clone(r.cfg.DNSPodLabels)},
				}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}},
			},
		},
	}
}

// namespaceNameLabel is the label the API server sets on every namespace
// to its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// validateDNSPeer checks Config.DNSNamespace and Config.DNSPodLabels.
func validateDNSPeer(ns string, podLabels map[string]string) error {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return errdefs.InvalidArgument("dns namespace", "%q: %s", ns, errs[0])
	}
	for k, v := range podLabels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			return errdefs.InvalidArgument("dns pod labels", "%s=%s: %s", k, v, errs[0])
		}
	}
	return nil
}

// ensureNetworkPolicy creates the namespace's NetworkPolicy, or replaces
// its spec when it differs from networkPolicy's (one an older berth made,
// or one edited by hand).
func (r *Runtime) ensureNetworkPolicy(ctx context.Context) error {
	want := r.networkPolicy()
	np := r.cs.NetworkingV1().NetworkPolicies(r.cfg.Namespace)
	_, err := np.Create(ctx, want, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return r.apiErr(err, "create networkpolicy", networkPolicyName)
	}
	cur, err := np.Get(ctx, networkPolicyName, metav1.GetOptions{})
	if err != nil {
		return r.apiErr(err, "get networkpolicy", networkPolicyName)
	}
	if equality.Semantic.DeepEqual(cur.Spec, want.Spec) {
		return nil
	}
	cur.Spec = want.Spec
	if _, err := np.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return r.apiErr(err, "update networkpolicy", networkPolicyName)
	}
	r.log.Info("kubernetes: sandboxes' NetworkPolicy updated", "networkpolicy", networkPolicyName)
	return nil
}

// reconcileLoop ensures the NetworkPolicy and removes orphans at start and
// then every reconcileEvery, until ctx ends.
func (r *Runtime) reconcileLoop(ctx context.Context) {
	const reconcileEvery = 5 * time.Minute
	for {
		if r.cfg.NetworkPolicy {
			if err := r.ensureNetworkPolicy(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("kubernetes: sandboxes' NetworkPolicy not ensured", "err", err)
			}
		}
		if n, err := r.ReconcileOrphans(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("kubernetes: orphans not reconciled", "err", err)
		} else if n > 0 {
			r.log.Info("kubernetes: removed orphaned secrets and workspace claims", "count", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(reconcileEvery):
		}
	}
}

// ReconcileOrphans removes the workspace claims berth created for
// sandboxes whose Pod is gone (a Create or Remove cut short, an
// orchestrator killed), and their Secrets, once they are older than
// Config.OrphanAge (a taken spare's age counts from its take: claimAge),
// and returns how many objects it removed. Spare claims not taken (no
// LabelSandbox) are the refill's (spare.go). Every Secret
// has its Pod (Create makes it after the Pod, Remove deletes it before),
// so the Pods' reconciliation removes the others; the orchestrator may
// not list Secrets. Persistent workspaces' claims (no LabelSandbox) are
// never orphans: the volume retention and the volumes API remove them.
// (Pods without a lease are the lease manager's to reconcile, through
// List and Remove, as on every backend.)
func (r *Runtime) ReconcileOrphans(ctx context.Context) (int, error) {
	pods, err := r.listPods(ctx, selector(nil))
	if err != nil {
		return 0, r.apiErr(err, "list pods", "")
	}
	live := map[string]bool{}
	for _, p := range pods {
		live[p.Name] = true
	}
	claims, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector(nil)})
	if err != nil {
		return 0, r.apiErr(err, "list persistentvolumeclaims", "")
	}
	n := 0
	for _, c := range claims.Items {
		pod := c.Labels[LabelSandbox]
		if pod == "" || live[pod] || claimAge(&c, time.Now()) < r.cfg.OrphanAge {
			continue
		}
		err := r.cs.CoreV1().Secrets(r.cfg.Namespace).Delete(ctx, secretName(pod), metav1.DeleteOptions{})
		switch {
		case err == nil:
			n++
		case !apierrors.IsNotFound(err):
			return n, r.apiErr(err, "delete secret", secretName(pod))
		}
		if c.DeletionTimestamp != nil {
			continue
		}
		if err := r.deleteClaim(ctx, c.Name); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
