package kubernetes_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// orchestratorClient returns a client with the orchestrator's
// ServiceAccount token (berth.kubeconfig) and its namespace.
func orchestratorClient(t *testing.T, dir string) (*kubernetes.Clientset, string) {
	t.Helper()
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: filepath.Join(dir, "berth.kubeconfig")}, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		t.Fatalf("berth kubeconfig (make k8s-up): %v", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs, ns
}

// TestOrchestratorSecretsDenied: with the orchestrator's token (what
// someone who stole it holds) the namespace's Secrets can be neither
// listed, watched, read (but the shared token secret) nor changed; the
// orchestrator only creates and deletes its sandboxes' Secrets, and reads
// berth-lease-secret.
func TestOrchestratorSecretsDenied(t *testing.T) {
	admin, dir := needCluster(t)
	cs, ns := orchestratorClient(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := fmt.Sprintf("not-berth-%d", time.Now().UnixNano())
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: other},
		StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Secrets(ns).Delete(context.Background(), other, metav1.DeleteOptions{}) })

	secrets := cs.CoreV1().Secrets(ns)
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s with the orchestrator's token: %v, want Forbidden", what, err)
		}
	}
	_, err := secrets.List(ctx, metav1.ListOptions{})
	forbidden("list secrets", err)
	w, err := secrets.Watch(ctx, metav1.ListOptions{})
	if err == nil {
		w.Stop()
	}
	forbidden("watch secrets", err)
	_, err = secrets.Get(ctx, other, metav1.GetOptions{})
	forbidden("get another secret", err)
	// Writes as dry runs: authorized first, so Forbidden all the same,
	// and a Role that allowed them changes nothing.
	dry := []string{metav1.DryRunAll}
	_, err = secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.UpdateOptions{DryRun: dry})
	forbidden("update another secret", err)
	_, err = secrets.Patch(ctx, other, "application/merge-patch+json", []byte(`{"data":null}`), metav1.PatchOptions{DryRun: dry})
	forbidden("patch another secret", err)

	// What the orchestrator does: the shared secret (get after a create
	// that may find it), a sandbox Secret created and deleted.
	rt, err := k8s.New(ctx, k8s.Config{Kubeconfig: filepath.Join(dir, "berth.kubeconfig")})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.SharedSecret(ctx, 16); err != nil {
		t.Errorf("shared secret with the orchestrator's token: %v", err)
	}
	_, err = secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: k8s.SharedSecretName}}, metav1.UpdateOptions{DryRun: dry})
	forbidden("update the shared secret", err)
}

// TestRoleLeastPrivilege asks the API server (SubjectAccessReview, as the
// admin) what the orchestrator's and the sandboxes' ServiceAccounts may do:
// the orchestrator exactly what the backend calls (the other cluster
// tests make those calls with its token), the sandboxes nothing.
func TestRoleLeastPrivilege(t *testing.T) {
	_, dir := needCluster(t)
	_, ns := orchestratorClient(t, dir)
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 100, 100 // a hundred reviews
	admin, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type check struct {
		group, resource, sub, verb, name string
		namespaced                       bool
	}
	c := func(group, resource, verb, name string) check {
		res, sub, _ := strings.Cut(resource, "/")
		return check{group: group, resource: res, sub: sub, verb: verb, name: name, namespaced: true}
	}
	allowed := []check{
		c("", "pods", "get", ""), c("", "pods", "list", ""), c("", "pods", "watch", ""), c("", "pods", "create", ""),
		c("", "pods", "delete", ""), c("", "pods", "patch", ""), c("", "pods/log", "get", ""),
		c("", "persistentvolumeclaims", "get", ""), c("", "persistentvolumeclaims", "list", ""),
		c("", "persistentvolumeclaims", "watch", ""), c("", "persistentvolumeclaims", "create", ""),
		c("", "persistentvolumeclaims", "delete", ""), c("", "persistentvolumeclaims", "patch", ""),
		c("", "secrets", "create", ""), c("", "secrets", "delete", "berth-x-agent"), c("", "secrets", "get", k8s.SharedSecretName),
		c("networking.k8s.io", "networkpolicies", "create", ""),
		c("networking.k8s.io", "networkpolicies", "get", "berth-sandboxes"),
		c("networking.k8s.io", "networkpolicies", "update", "berth-sandboxes"),
		c("coordination.k8s.io", "leases", "get", "berth-leader"), c("coordination.k8s.io", "leases", "create", ""),
		c("coordination.k8s.io", "leases", "update", "berth-leader"), c("coordination.k8s.io", "leases", "delete", "berth-conv-x"),
		c("berth.dev", "berthleases", "get", ""), c("berth.dev", "berthleases", "list", ""), c("berth.dev", "berthleases", "watch", ""),
		c("berth.dev", "berthleases", "create", ""), c("berth.dev", "berthleases", "update", ""), c("berth.dev", "berthleases", "delete", ""),
		c("", "events", "list", ""),
		{group: "storage.k8s.io", resource: "storageclasses", verb: "get"},
	}
	denied := []check{
		c("", "secrets", "list", ""), c("", "secrets", "watch", ""), c("", "secrets", "get", ""), c("", "secrets", "get", "other"),
		c("", "secrets", "update", ""), c("", "secrets", "update", k8s.SharedSecretName), c("", "secrets", "patch", ""),
		c("networking.k8s.io", "networkpolicies", "list", ""), c("networking.k8s.io", "networkpolicies", "watch", ""),
		c("networking.k8s.io", "networkpolicies", "delete", "berth-sandboxes"), c("networking.k8s.io", "networkpolicies", "update", "other"),
		c("networking.k8s.io", "networkpolicies", "get", "other"),
		c("coordination.k8s.io", "leases", "list", ""), c("coordination.k8s.io", "leases", "watch", ""),
		c("", "events", "create", ""), c("", "events", "patch", ""), c("events.k8s.io", "events", "create", ""),
		c("", "pods/exec", "create", ""), c("", "pods/attach", "create", ""), c("", "pods", "update", ""), c("", "persistentvolumeclaims", "update", ""),
		c("", "serviceaccounts", "get", ""), c("", "serviceaccounts/token", "create", "berth-sandbox"),
		c("", "configmaps", "get", ""), c("rbac.authorization.k8s.io", "rolebindings", "create", ""),
		{group: "", resource: "secrets", verb: "list"}, // cluster-wide
	}
	review := func(user string, ck check) bool {
		t.Helper()
		attrs := &authorizationv1.ResourceAttributes{Group: ck.group, Resource: ck.resource, Subresource: ck.sub, Verb: ck.verb, Name: ck.name}
		if ck.namespaced {
			attrs.Namespace = ns
		}
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + ns + ":" + user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: attrs,
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	for _, ck := range allowed {
		if !review("berth", ck) {
			t.Errorf("the orchestrator may not %s %s/%s %q: the backend needs it", ck.verb, ck.resource, ck.sub, ck.name)
		}
		if review(k8s.DefaultSandboxServiceAccount, ck) {
			t.Errorf("the sandboxes' ServiceAccount may %s %s/%s %q", ck.verb, ck.resource, ck.sub, ck.name)
		}
	}
	for _, ck := range denied {
		if review("berth", ck) {
			t.Errorf("the orchestrator may %s %s/%s %q (namespaced %v): more than the backend uses", ck.verb, ck.resource, ck.sub, ck.name, ck.namespaced)
		}
	}
	// The sandboxes' ServiceAccount exists (the Pods name it) and mounts
	// no token.
	sa, err := admin.CoreV1().ServiceAccounts(ns).Get(ctx, k8s.DefaultSandboxServiceAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandboxes' ServiceAccount: %v", err)
	}
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %s: automountServiceAccountToken %v, want false", sa.Name, sa.AutomountServiceAccountToken)
	}
}

// TestNetworkPolicyDNS: the NetworkPolicy the backend ensures (with the
// orchestrator's token) lets the sandboxes reach port 53 of the cluster's
// DNS Pods only; one an older berth made (DNS to every Pod of every
// namespace) is replaced. The test cluster's bridge plugin does not
// enforce NetworkPolicy, so the object is what is checked, as the admin
// reads it back.
func TestNetworkPolicyDNS(t *testing.T) {
	admin, dir := needCluster(t)
	_, ns := orchestratorClient(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nps := admin.NetworkingV1().NetworkPolicies(ns)
	const name = "berth-sandboxes"
	// The policy of an older berth: DNS to any namespace's Pods.
	udp, tcp, dns := corev1.ProtocolUDP, corev1.ProtocolTCP, intstr.FromInt32(53)
	old := networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}}
	cur, err := nps.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur, err = nps.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{old}}}, metav1.CreateOptions{})
	case err == nil:
		cur.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{old}
		cur, err = nps.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}

	w, err := nps.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: cur.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// New ensures the policy at once (its reconciliation's first round).
	rt, err := k8s.New(ctx, k8s.Config{Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), NetworkPolicy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	var last error
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before the policy was updated (%v)", last)
			}
			if np, isNP := ev.Object.(*networkingv1.NetworkPolicy); isNP && ev.Type == watch.Modified {
				if last = dnsOnlyToClusterDNS(np); last == nil {
					return
				}
			}
		case <-ctx.Done():
			t.Fatalf("the backend did not replace the policy of an older berth: %v", last)
		}
	}
}

// dnsOnlyToClusterDNS checks that np allows port 53 in one rule, to the
// k8s-app=kube-dns Pods of kube-system only.
func dnsOnlyToClusterDNS(np *networkingv1.NetworkPolicy) error {
	var dnsRules []networkingv1.NetworkPolicyEgressRule
	for _, rule := range np.Spec.Egress {
		for _, p := range rule.Ports {
			if p.Port != nil && p.Port.IntValue() == 53 {
				dnsRules = append(dnsRules, rule)
				break
			}
		}
	}
	if len(dnsRules) != 1 || len(dnsRules[0].To) != 1 {
		return fmt.Errorf("egress rules on port 53: %+v, want one with one peer", dnsRules)
	}
	peer := dnsRules[0].To[0]
	if peer.IPBlock != nil || peer.NamespaceSelector == nil || peer.PodSelector == nil ||
		!maps.Equal(peer.NamespaceSelector.MatchLabels, map[string]string{"kubernetes.io/metadata.name": k8s.DefaultDNSNamespace}) ||
		!maps.Equal(peer.PodSelector.MatchLabels, map[string]string{"k8s-app": "kube-dns"}) ||
		len(peer.NamespaceSelector.MatchExpressions)+len(peer.PodSelector.MatchExpressions) != 0 {
		return fmt.Errorf("DNS peer %+v / %+v, want the k8s-app=kube-dns Pods of kube-system", peer.NamespaceSelector, peer.PodSelector)
	}
	return nil
}
