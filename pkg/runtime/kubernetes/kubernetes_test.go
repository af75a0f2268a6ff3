package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/conformance"
)

func TestPodName(t *testing.T) {
	long := strings.Repeat("a", 128)
	cases := map[string]string{
		"lease-1":   "berth-lease-1",
		"abc":       "berth-abc",
		"Lease_1.x": "",
		long:        "",
		"a-":        "",
	}
	seen := map[string]string{}
	for lease, want := range cases {
		got := podName(lease)
		if want != "" && got != want {
			t.Errorf("podName(%q) = %q, want %q", lease, got, want)
		}
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("podName(%q) = %q: not a DNS label: %v", lease, got, errs)
		}
		if other, ok := seen[got]; ok {
			t.Errorf("podName(%q) = podName(%q) = %q", lease, other, got)
		}
		seen[got] = lease
		if podName(lease) != got {
			t.Errorf("podName(%q) is not deterministic", lease)
		}
	}
	// Two ids that differ only in what sanitising maps away differ.
	if podName("a_b") == podName("a.b") || podName("A") == podName("a") {
		t.Error("sanitised ids collide")
	}
}

func TestBuildObjects(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns", AgentImage: "agent:1", InstanceID: "inst", ServiceAccount: "sandbox-sa",
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever}}
	spec := runtime.Spec{
		LeaseID: "Lease_1", ConversationID: strings.Repeat("c", 100), Image: "img:1", AgentToken: "tok",
		Env: map[string]string{"A": "1"}, Secrets: map[string]string{"S": "secret-value"},
		Labels: map[string]string{"color": "blue", "weird key": "x"}, User: "1000",
	}
	res := runtime.Resources{NanoCPUs: 500_000_000, MemoryBytes: 256 << 20, PidsLimit: 100, DiskBytes: 1 << 30}
	secret, pod := r.buildObjects(spec, res)

	if pod.Name != podName("Lease_1") || secret.Name != pod.Name+"-agent" || pod.Namespace != "ns" {
		t.Fatalf("names: pod %s/%s secret %s", pod.Namespace, pod.Name, secret.Name)
	}
	// Every berth label is in the annotation; the Kubernetes labels hold
	// those Kubernetes accepts.
	var labels map[string]string
	if err := json.Unmarshal([]byte(pod.Annotations[labelsAnnotation]), &labels); err != nil {
		t.Fatal(err)
	}
	if labels[runtime.LabelConversation] != spec.ConversationID || labels[runtime.LabelUserPrefix+"weird key"] != "x" || labels[runtime.LabelInstance] != "inst" {
		t.Errorf("annotation labels = %v", labels)
	}
	if pod.Labels[runtime.LabelManaged] != "true" || pod.Labels[runtime.LabelUserPrefix+"color"] != "blue" || pod.Labels[LabelSandbox] != pod.Name {
		t.Errorf("pod labels = %v", pod.Labels)
	}
	if _, ok := pod.Labels[runtime.LabelConversation]; ok {
		t.Errorf("a 100-character label value made it into the Kubernetes labels")
	}
	sb := sandboxOf(pod)
	if sb.LeaseID != "Lease_1" || sb.ConversationID != spec.ConversationID || sb.DiskEnforcement != runtime.DiskEnforcementEngine {
		t.Errorf("sandboxOf = %+v", sb)
	}

	// No secret in the Pod object: the token and Secrets come from the Secret.
	podJSON, _ := json.Marshal(pod)
	if strings.Contains(string(podJSON), "secret-value") || strings.Contains(string(podJSON), `"tok"`) {
		t.Errorf("the Pod object holds a secret: %s", podJSON)
	}
	if string(secret.Data[tokenKey]) != "tok" || string(secret.Data[secretPrefix+"S"]) != "secret-value" {
		t.Errorf("secret data = %v", secret.Data)
	}

	if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Containers) != 1 {
		t.Fatalf("containers: %d init, %d", len(pod.Spec.InitContainers), len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.Command[0] != runtime.AgentPath || !strings.Contains(strings.Join(c.Command, " "), "--user 1000") {
		t.Errorf("command = %v", c.Command)
	}
	sc := c.SecurityContext
	if sc == nil || *sc.AllowPrivilegeEscalation || *sc.Privileged || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != len(runtime.Capabilities()) {
		t.Errorf("securityContext = %+v", sc)
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("with a user the agent runs as root; RunAsUser = %v", sc.RunAsUser)
	}
	lim := c.Resources.Limits
	if lim.Cpu().MilliValue() != 500 || lim.Memory().Value() != 256<<20 || lim.StorageEphemeral().Value() != 1<<30 {
		t.Errorf("limits = %v", lim)
	}
	if req := c.Resources.Requests; req.Cpu().MilliValue() != 50 || req.Memory().Value() != 64<<20 {
		t.Errorf("requests = %v, want a tenth of the CPU and a quarter of the memory", req)
	}
	if *pod.Spec.AutomountServiceAccountToken || pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.ServiceAccountName != "sandbox-sa" {
		t.Errorf("pod spec: automount %v restart %s service account %q", *pod.Spec.AutomountServiceAccountToken, pod.Spec.RestartPolicy, pod.Spec.ServiceAccountName)
	}
	init := pod.Spec.InitContainers[0]
	if init.Image != "agent:1" || !*init.SecurityContext.RunAsNonRoot || !*init.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("init container = %+v", init)
	}
	// The copy runs within the sandbox's CPU and memory limits, not a
	// tiny quota of its own; its requests stay small.
	if l, r := init.Resources.Limits, init.Resources.Requests; l.Cpu().MilliValue() != 500 || l.Memory().Value() != 256<<20 ||
		r.Cpu().MilliValue() != 10 || r.Memory().Value() != 32<<20 {
		t.Errorf("init container resources = %+v", init.Resources)
	}
	if small := installResources(runtime.Resources{NanoCPUs: 5_000_000, MemoryBytes: 16 << 20}); small.Requests.Cpu().MilliValue() != 5 ||
		small.Requests.Memory().Value() != 16<<20 {
		t.Errorf("init requests above tiny limits: %+v", small)
	}
}

func TestSandboxOfStates(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns"}}
	_, pod := r.buildObjects(runtime.Spec{LeaseID: "l", Image: "i", AgentToken: "t"}, runtime.DefaultResources())
	if sb := sandboxOf(pod); sb.State != runtime.StateCreated || sb.Endpoint != "" {
		t.Errorf("new pod: %+v", sb)
	}
	pod.Status.PodIP = "10.0.0.5"
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	if sb := sandboxOf(pod); sb.State != runtime.StateRunning || sb.Endpoint != "10.0.0.5:7000" {
		t.Errorf("running pod: %+v", sb)
	}
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}
	if sb := sandboxOf(pod); sb.State != runtime.StateExited || sb.ExitCode != 137 || !sb.OOMKilled || sb.Endpoint != "" {
		t.Errorf("killed pod: %+v", sb)
	}
	evs := died(pod.DeepCopy(), pod)
	if len(evs) != 0 {
		t.Errorf("no transition, events %v", evs)
	}
	old := pod.DeepCopy()
	old.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	evs = died(old, pod)
	if len(evs) != 2 || evs[0].Kind != runtime.EventOOM || evs[1].Kind != runtime.EventDied || evs[1].ExitCode != 137 || evs[1].LeaseID != "l" {
		t.Errorf("died events = %+v", evs)
	}
}

func TestPodProblem(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns"}}
	_, pod := r.buildObjects(runtime.Spec{LeaseID: "l", Image: "some/image:1", AgentToken: "t"}, runtime.DefaultResources())
	if err := podProblem(pod); err != nil {
		t.Fatalf("pending pod: %v", err)
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull", Message: "not present"}}}}
	err := podProblem(pod)
	if err == nil || !strings.Contains(err.Error(), "make images") || !strings.Contains(err.Error(), "some/image:1") {
		t.Errorf("missing image: %v", err)
	}
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: "unable to find user x"}}
	if err := podProblem(pod); err == nil || !strings.Contains(err.Error(), "cannot start") {
		t.Errorf("bad user: %v", err)
	}
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}}
	if err := podProblem(pod); err == nil || !strings.Contains(err.Error(), "exited with code 2") {
		t.Errorf("exited: %v", err)
	}
}

func TestSelector(t *testing.T) {
	got := selector(runtime.Selector{runtime.LabelLease: "ok-1", runtime.LabelUserPrefix + "bad key": "v", "k": strings.Repeat("x", 70)})
	if got != "dev.berth.lease=ok-1,dev.berth.managed=true" {
		t.Errorf("selector = %q", got)
	}
}

func TestEventErr(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns", AgentImage: "agent:1"}}
	_, pod := r.buildObjects(runtime.Spec{LeaseID: "l", Image: "some/image:1", AgentToken: "t"}, runtime.DefaultResources())
	ev := func(reason, msg, path string) *corev1.Event {
		return &corev1.Event{Reason: reason, Message: msg, InvolvedObject: corev1.ObjectReference{FieldPath: path}}
	}
	main, init := "spec.containers{sandbox}", "spec.initContainers{berth-agent-install}"
	if err := eventErr(pod, ev("ErrImageNeverPull", `Container image "some/image:1" is not present with pull policy of Never`, main)); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "make images") {
		t.Errorf("never pull: %v", err)
	}
	if err := eventErr(pod, ev("Failed", "Error: failed to create containerd container: no such user", main)); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no such user") {
		t.Errorf("create failed: %v", err)
	}
	if err := eventErr(pod, ev("ErrImageNeverPull", "not present", init)); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "agent:1") || !strings.Contains(err.Error(), "agent-image.sh") {
		t.Errorf("agent image missing: %v", err)
	}
	if err := eventErr(pod, ev("FailedMount", "secret not yet there", "")); err != nil {
		t.Errorf("a transient warning: %v", err)
	}
}

func TestAPIErrDeadline(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns"}}
	err := r.apiErr(errors.New("client rate limiter Wait returned an error: rate: Wait(n=1) would exceed context deadline"), "get pod", "p")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("rate limiter past the deadline: %v, want DeadlineExceeded", err)
	}
}

// The backend declares the pids limit, the host mounts, the volume sizes
// and the freeze it cannot give, so that the conformance suite leaves out
// exactly those checks.
func TestLimitations(t *testing.T) {
	var rt any = &Runtime{}
	lim, ok := rt.(conformance.Limited)
	want := []string{conformance.LimitPids, conformance.LimitHostMounts, conformance.LimitVolumeSize, conformance.LimitFreeze}
	if !ok || !slices.Equal(lim.Limitations(), want) {
		t.Fatalf("Limitations = %v (implemented: %v), want %v", lim, ok, want)
	}
}

// /workspace is the sandbox's claim: named after the Pod, its labels, the
// disk limit as its size (else DefaultWorkspaceSize), the configured
// StorageClass (none: the cluster's default).
func TestBuildClaim(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns", InstanceID: "inst"}}
	spec := runtime.Spec{LeaseID: "l1", ConversationID: "c", Image: "img:1", AgentToken: "tok"}
	_, pod := r.buildObjects(spec, runtime.Resources{})
	var claimRef string
	for _, v := range pod.Spec.Volumes {
		if v.Name == workspaceVolume && v.PersistentVolumeClaim != nil {
			claimRef = v.PersistentVolumeClaim.ClaimName
		}
	}
	c := r.buildClaim(pod.ObjectMeta, runtime.Resources{})
	if claimRef != c.Name || c.Name != "berth-l1-workspace" || c.Namespace != "ns" || c.Labels[LabelSandbox] != pod.Name {
		t.Fatalf("claim %s/%s labels %v; pod's claim %q", c.Namespace, c.Name, c.Labels, claimRef)
	}
	if got := c.Spec.Resources.Requests[corev1.ResourceStorage]; got.Value() != DefaultWorkspaceSize || c.Spec.StorageClassName != nil {
		t.Errorf("default claim: size %s class %v", got.String(), c.Spec.StorageClassName)
	}
	r.cfg.StorageClass = "fast"
	c = r.buildClaim(pod.ObjectMeta, runtime.Resources{DiskBytes: 5 << 30})
	if got := c.Spec.Resources.Requests[corev1.ResourceStorage]; got.Value() != 5<<30 || c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != "fast" {
		t.Errorf("claim: size %s class %v", got.String(), c.Spec.StorageClassName)
	}
}

// TestNetworkPolicy: the sandboxes' policy lets them reach port 53 of the
// cluster's DNS Pods only (one peer selecting both the namespace and the
// Pods), not any Pod of any namespace.
func TestNetworkPolicy(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns", DNSNamespace: "dns-ns", DNSPodLabels: map[string]string{"app": "coredns"}}}
	np := r.networkPolicy()
	if np.Name != networkPolicyName || np.Namespace != "ns" || np.Spec.PodSelector.MatchLabels[runtime.LabelManaged] != "true" {
		t.Errorf("policy %s/%s selects %v", np.Namespace, np.Name, np.Spec.PodSelector)
	}
	// The orchestrator reaches the agent's API and its envd listener.
	if len(np.Spec.Ingress) != 1 {
		t.Fatalf("ingress rules: %+v, want one", np.Spec.Ingress)
	}
	var in []int
	for _, p := range np.Spec.Ingress[0].Ports {
		in = append(in, p.Port.IntValue())
	}
	if !slices.Equal(in, []int{runtime.AgentPort, runtime.EnvdPort}) {
		t.Errorf("ingress ports %v, want the agent's %d and envd's %d", in, runtime.AgentPort, runtime.EnvdPort)
	}
	var dns []networkingv1.NetworkPolicyEgressRule
	for _, rule := range np.Spec.Egress {
		if len(rule.Ports) == 0 {
			for _, peer := range rule.To {
				if peer.IPBlock == nil || peer.NamespaceSelector != nil || peer.PodSelector != nil {
					t.Errorf("an egress rule on every port allows %+v; want only public addresses", peer)
				}
			}
			continue
		}
		dns = append(dns, rule)
	}
	if len(dns) != 1 {
		t.Fatalf("egress rules with ports: %+v, want the DNS rule only", dns)
	}
	for _, p := range dns[0].Ports {
		if p.Port == nil || p.Port.IntValue() != 53 {
			t.Errorf("DNS rule port %+v", p)
		}
	}
	if len(dns[0].To) != 1 {
		t.Fatalf("DNS rule peers: %+v, want one", dns[0].To)
	}
	peer := dns[0].To[0]
	if peer.IPBlock != nil || peer.NamespaceSelector == nil || peer.PodSelector == nil ||
		!maps.Equal(peer.NamespaceSelector.MatchLabels, map[string]string{"kubernetes.io/metadata.name": "dns-ns"}) ||
		!maps.Equal(peer.PodSelector.MatchLabels, map[string]string{"app": "coredns"}) ||
		len(peer.NamespaceSelector.MatchExpressions)+len(peer.PodSelector.MatchExpressions) != 0 {
		t.Errorf("DNS peer = %+v / %+v, want the Pods app=coredns of namespace dns-ns", peer.NamespaceSelector, peer.PodSelector)
	}
	if err := validateDNSPeer("kube-system", map[string]string{"k8s-app": "kube-dns"}); err != nil {
		t.Error(err)
	}
	if err := validateDNSPeer("Kube System", nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("validateDNSPeer(bad namespace) = %v", err)
	}
	if err := validateDNSPeer("kube-system", map[string]string{"k8s-app": "bad value!"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("validateDNSPeer(bad label) = %v", err)
	}
}
