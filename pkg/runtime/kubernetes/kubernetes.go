package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Defaults of Config.
const (
	// DefaultNamespace is the namespace of deploy/kubernetes.
	DefaultNamespace = "berth"
	// DefaultAgentImage is the agent image scripts/k8s/agent-image.sh builds.
	DefaultAgentImage = "berth/k8s-agent:latest"
	// DefaultSandboxServiceAccount is the ServiceAccount of the sandbox
	// Pods (deploy/kubernetes/serviceaccount.yaml): no token mounted, no
	// RoleBinding.
	DefaultSandboxServiceAccount = "berth-sandbox"
	// DefaultDNSNamespace and DefaultDNSPodLabel select the cluster's DNS
	// Pods, the only peers the sandboxes' NetworkPolicy lets them reach on
	// port 53 (kube-dns and CoreDNS both carry k8s-app=kube-dns in
	// kube-system).
	DefaultDNSNamespace = "kube-system"
	DefaultDNSPodLabel  = "k8s-app=kube-dns"
)

// Config configures the Kubernetes backend.
type Config struct {
	// Kubeconfig is a kubeconfig file; "" means the in-cluster
	// configuration (the Pod's ServiceAccount).
	Kubeconfig string
	// Namespace holds the sandboxes. Default: the kubeconfig context's
	// namespace, else DefaultNamespace.
	Namespace string
	// NodeName, when set, pins every sandbox Pod to that node (a cluster
	// without a scheduler, like make k8s-up's). Default "": the scheduler
	// places them.
	NodeName string
	// AgentImage is the image of the init container that copies the agent
	// into each sandbox (scripts/k8s/agent-image.sh). Default
	// DefaultAgentImage.
	AgentImage string
	// AgentClaim, when set, names a PersistentVolumeClaim in Namespace
	// holding the static agent at its root as runtime.AgentFile (mode
	// 0755, owned by root): every sandbox Pod mounts it read-only at
	// runtime.AgentDir instead of copying the agent from AgentImage with
	// an init container, which saves a cold start that container's
	// start, its run and the kubelet's relist that sees it exit (about
	// 1 s; docs/kubernetes.md "Cold start"). The claim must be mountable
	// read-only by every Pod at once: ReadOnlyMany, or a one-node
	// cluster's ReadWriteOnce (make k8s-up's berth-agent,
	// scripts/k8s/agent-claim.sh). Default "": the init container.
	AgentClaim string
	// SpareClaims is how many spare workspace claims the backend keeps
	// made ahead, bound, of the default size and StorageClass (spare.go):
	// Create of a sandbox without a persistent workspace takes one
	// instead of creating a claim and waiting for its binding. One
	// replica of the fleet refills them (elected over the Lease
	// LeaderLease+"-spares"); with a StorageClass that binds only for a
	// Pod (WaitForFirstConsumer) none are made. Default 0: none.
	SpareClaims int
	// StorageClass is the StorageClass of the sandboxes' workspace claims
	// (one PersistentVolumeClaim per sandbox, mounted at /workspace).
	// Default "": the cluster's default StorageClass. Its volumes must be
	// writable by the sandbox's user (make k8s-up's berth-local class
	// makes mode-0777 directories).
	StorageClass string
	// AgentImagePullPolicy and ImagePullPolicy apply to the agent image and
	// to the sandboxes' images. Default IfNotPresent; Never on a node whose
	// images are imported rather than pulled (make k8s-up).
	AgentImagePullPolicy corev1.PullPolicy
	ImagePullPolicy      corev1.PullPolicy
	// ServiceAccount is the ServiceAccount the sandbox Pods run as: one
	// with no rights (no RoleBinding) whose token is never mounted (the
	// Pods also set automountServiceAccountToken: false). It must exist in
	// Namespace: the API server refuses a Pod naming a missing one, and
	// Create fails with that error. Default DefaultSandboxServiceAccount.
	ServiceAccount string
	// NetworkPolicy makes New ensure the namespace's NetworkPolicy
	// (networkPolicyName; see network.go). Enforcement depends on the
	// cluster's network plugin.
	NetworkPolicy bool
	// DNSNamespace and DNSPodLabels select the cluster's DNS Pods: the
	// NetworkPolicy lets sandboxes reach port 53 of those Pods only.
	// Default DefaultDNSNamespace and DefaultDNSPodLabel.
	DNSNamespace string
	DNSPodLabels map[string]string
	// InstanceID becomes the instance label of sandboxes whose Spec leaves
	// InstanceID empty.
	InstanceID string
	// DefaultResources fill the zero fields of a Spec's resources;
	// runtime.DefaultResources fills what it leaves zero.
	DefaultResources runtime.Resources
	// ReadyTimeout applies when Spec.ReadyTimeout is zero. Default
	// runtime.DefaultReadyTimeout, plus the time a cold node needs.
	ReadyTimeout time.Duration
	// OrphanAge is how old a Secret berth created for a sandbox must be
	// before reconciliation removes it when its Pod is gone. Default 2m.
	OrphanAge time.Duration
	// LeaderLease names the coordination.k8s.io Lease RunLeader elects
	// over. Default DefaultLeaderLease (LeaderLeaseOf a fleet).
	LeaderLease string
	// LeaderLeaseDuration is that Lease's duration; RunLeader renews it
	// within two thirds of it and retries every seventh. Default 15s.
	LeaderLeaseDuration time.Duration
	// REST, when set, is used instead of Kubeconfig (tests).
	REST *rest.Config
	// Logger receives the backend's logs. Default slog.Default().
	Logger *slog.Logger
}

// Runtime is the Kubernetes backend: one Pod per sandbox.
type Runtime struct {
	cfg    Config
	cs     kubernetes.Interface
	rest   *rest.Config
	host   string
	log    *slog.Logger
	health runtime.HealthProber
	// pods is the informer on the namespace's berth Pods (cache.go).
	pods *podCache
	// bg lives until Close (stop); wg counts its goroutines.
	bg   context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
	// classes caches whether a StorageClass binds claims at once (claim.go).
	classMu sync.Mutex
	classes map[string]bool
	// spares are the spare workspace claims (spare.go); nil without.
	spares *spareSet
}

var _ runtime.Runtime = (*Runtime)(nil)

// New connects to the cluster and starts the reconciliation of orphans.
// It does not check that the API server answers: Ping does.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rc := cfg.REST
	if rc == nil {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.Kubeconfig}, &clientcmd.ConfigOverrides{})
		var err error
		if cfg.Kubeconfig == "" {
			rc, err = rest.InClusterConfig()
		} else {
			rc, err = loader.ClientConfig()
		}
		if err != nil {
			return nil, errdefs.InvalidArgument("kubeconfig", "%q: %v", cfg.Kubeconfig, err)
		}
		if cfg.Namespace == "" && cfg.Kubeconfig != "" {
			if ns, overridden, err := loader.Namespace(); err == nil && (overridden || ns != "default") {
				cfg.Namespace = ns
			}
		}
	}
	rc = rest.CopyConfig(rc)
	// Creates wait on watches, not polls; still, 20 parallel acquires make
	// more calls than client-go's default of 5 per second.
	rc.QPS, rc.Burst = 100, 200
	rc.UserAgent = "berth-orchestrator"
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, errdefs.InvalidArgument("namespace", "%q: %s", cfg.Namespace, errs[0])
	}
	if cfg.AgentImage == "" {
		cfg.AgentImage = DefaultAgentImage
	}
	if cfg.AgentClaim != "" {
		if errs := validation.IsDNS1123Subdomain(cfg.AgentClaim); len(errs) > 0 {
			return nil, errdefs.InvalidArgument("agent claim", "%q: %s", cfg.AgentClaim, errs[0])
		}
	}
	if cfg.AgentImagePullPolicy == "" {
		cfg.AgentImagePullPolicy = corev1.PullIfNotPresent
	}
	if cfg.ImagePullPolicy == "" {
		cfg.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = runtime.DefaultReadyTimeout
	}
	if cfg.ServiceAccount == "" {
		cfg.ServiceAccount = DefaultSandboxServiceAccount
	}
	if errs := validation.IsDNS1123Subdomain(cfg.ServiceAccount); len(errs) > 0 {
		return nil, errdefs.InvalidArgument("service account", "%q: %s", cfg.ServiceAccount, errs[0])
	}
	if cfg.DNSNamespace == "" {
		cfg.DNSNamespace = DefaultDNSNamespace
	}
	if len(cfg.DNSPodLabels) == 0 {
		k, v, _ := strings.Cut(DefaultDNSPodLabel, "=")
		cfg.DNSPodLabels = map[string]string{k: v}
	}
	if err := validateDNSPeer(cfg.DNSNamespace, cfg.DNSPodLabels); err != nil {
		return nil, err
	}
	if cfg.LeaderLease == "" {
		cfg.LeaderLease = DefaultLeaderLease
	}
	if cfg.LeaderLeaseDuration <= 0 {
		cfg.LeaderLeaseDuration = 15 * time.Second
	}
	if cfg.SpareClaims < 0 {
		return nil, errdefs.InvalidArgument("spare claims", "%d: must not be negative", cfg.SpareClaims)
	}
	if cfg.OrphanAge <= 0 {
		cfg.OrphanAge = 2 * time.Minute
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, errdefs.InvalidArgument("kubeconfig", "%v", err)
	}
	return start(ctx, cfg, cs, rc)
}

// start returns the Runtime of cfg (defaults applied) over cs and starts
// its Pod informer and the reconciliation of orphans.
func start(ctx context.Context, cfg Config, cs kubernetes.Interface, rc *rest.Config) (*Runtime, error) {
	pods, err := newPodCache(cs, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	r := &Runtime{cfg: cfg, cs: cs, rest: rc, host: rc.Host, log: cfg.Logger, health: runtime.NewHealthProber(),
		pods: pods, bg: bg, stop: stop, classes: map[string]bool{}}
	pods.start(bg.Done())
	if r.spares = newSpareSet(r); r.spares != nil {
		r.spares.start(bg)
	}
	r.wg.Add(1)
	go func() { defer r.wg.Done(); r.reconcileLoop(bg) }()
	return r, nil
}

// Close stops the Pod informer and the background reconciliation; the
// replica that refills the spare claims deletes them (spare.go).
func (r *Runtime) Close() error {
	r.stop()
	r.wg.Wait()
	r.pods.shutdown()
	r.spares.shutdown()
	r.health.Close()
	return nil
}

// Namespace returns the namespace of the sandboxes.
func (r *Runtime) Namespace() string { return r.cfg.Namespace }

// RESTConfig returns a copy of the client configuration the backend uses
// (the lease store of several replicas talks to the same API server).
func (r *Runtime) RESTConfig() *rest.Config { return rest.CopyConfig(r.rest) }

// backend is what the shared Create logic knows of this backend.
func (r *Runtime) backend() runtime.Backend {
	return runtime.Backend{Name: "kubernetes", Noun: "pod", Log: r.log, Output: r.output, Remove: r.remove}
}

// Ping lists one Pod of the namespace: the API server answers and the
// orchestrator may read it.
func (r *Runtime) Ping(ctx context.Context) error {
	_, err := r.cs.CoreV1().Pods(r.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil && !errors.Is(category(err), errdefs.ErrPermissionDenied) && !errors.Is(category(err), errdefs.ErrUnauthenticated) {
		return fmt.Errorf("%w: kubernetes: API server at %s: %w", errdefs.ErrUnavailable, r.host, err)
	}
	if err != nil {
		return r.apiErr(err, "list pods", "")
	}
	if c := r.cfg.AgentClaim; c != "" {
		// Without it every Pod would wait for its volume, never ready.
		if _, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Get(ctx, c, metav1.GetOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return errdefs.FailedPrecondition("kubernetes: the agent claim %s is not in namespace %s (create it with the agent at its root: docs/kubernetes.md)", c, r.cfg.Namespace)
			}
			return r.apiErr(err, "get the agent claim", c)
		}
	}
	return nil
}

// Get returns one sandbox, from the Pod informer (cache.go).
func (r *Runtime) Get(ctx context.Context, id string) (runtime.Sandbox, error) {
	pod, err := r.managedPod(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	return r.sandbox(pod), nil
}

// selector is the API server's part of sel: LabelManaged=true and each key
// and value that Kubernetes labels can hold (the others are matched on
// labelsAnnotation).
func selector(sel runtime.Selector) string {
	set := labels.Set{runtime.LabelManaged: "true"}
	for k, v := range sel {
		if len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			set[k] = v
		}
	}
	return labels.SelectorFromSet(set).String()
}

// List returns the sandboxes matching sel, from the Pod informer
// (cache.go).
func (r *Runtime) List(ctx context.Context, sel runtime.Selector) ([]runtime.Sandbox, error) {
	pods, err := r.listPods(ctx, selector(sel))
	if err != nil {
		return nil, r.apiErr(err, "list pods", "")
	}
	var out []runtime.Sandbox
	for _, p := range pods {
		sb := r.sandbox(p)
		if runtime.IsManaged(sb.Labels) && sel.Matches(sb.Labels) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// Remove deletes a sandbox's Secret, its Pod at once (no grace: the
// sandbox is gone when Remove returns) and its own workspace claim (a
// persistent workspace's claim stays). A missing sandbox is success, one
// berth did not create FailedPrecondition.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	pod, err := r.getPod(ctx, id)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.deleteSecret(ctx, secretName(id)); err != nil {
			return err
		}
		return r.deleteOwnClaims(ctx, id)
	case err != nil:
		return r.apiErr(err, "get pod", id)
	case !runtime.IsManaged(pod.Labels):
		return errdefs.FailedPrecondition("kubernetes: pod %s is not managed by berth (no %s=true label); not removing it", id, runtime.LabelManaged)
	}
	return r.remove(ctx, id)
}

// remove deletes sandbox id's Secret, then its Pod (force: grace 0; it
// returns once the informer has dropped the Pod), then
// its own workspace claim (ownClaim: claimName or the spare it took; its
// volume goes by the StorageClass's reclaim policy). The Secret goes
// first: every Secret has its Pod (see Create), so that a Remove cut short
// leaves a Pod, which the lease manager removes again; a claim left behind
// is ReconcileOrphans'.
func (r *Runtime) remove(ctx context.Context, id string) error {
	pod, perr := r.getPod(ctx, id)
	if err := r.deleteSecret(ctx, secretName(id)); err != nil {
		return err
	}
	zero := int64(0)
	err := r.cs.CoreV1().Pods(r.cfg.Namespace).Delete(ctx, id, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return r.apiErr(err, "delete pod", id)
	}
	if perr == nil && r.pods.synced() {
		// Until the informer drops the Pod (its deletion's event), so
		// that a List or Get right after Remove does not return it: the
		// cache lags the API server by that event. Bounded: a Pod the API
		// server keeps a while longer only delays this Remove.
		wctx, cancel := context.WithTimeout(ctx, removeSettle)
		_, _ = r.waitPod(wctx, pod, func(*corev1.Pod) (bool, error) { return false, nil })
		cancel()
	}
	switch {
	case perr == nil:
		return r.deleteClaim(ctx, ownClaim(pod))
	case apierrors.IsNotFound(perr):
		return r.deleteOwnClaims(ctx, id)
	default:
		return r.deleteClaim(ctx, claimName(id))
	}
}

// removeSettle bounds how long Remove waits for the informer to drop a
// Pod it deleted (remove).
const removeSettle = 5 * time.Second

// deleteStorage deletes sandbox pod's Secret and its own workspace claim
// claim.
func (r *Runtime) deleteStorage(ctx context.Context, pod, claim string) error {
	if err := r.deleteSecret(ctx, secretName(pod)); err != nil {
		return err
	}
	return r.deleteClaim(ctx, claim)
}

// deleteOwnClaims deletes the workspace claims of sandbox pod when the Pod
// that names its claim is gone: those labelled with it (LabelSandbox; a
// persistent workspace's claim has no such label), claimName and the
// spares it took alike.
func (r *Runtime) deleteOwnClaims(ctx context.Context, pod string) error {
	sel := labels.SelectorFromSet(labels.Set{runtime.LabelManaged: "true", LabelSandbox: pod}).String()
	list, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return r.apiErr(err, "list persistentvolumeclaims", pod)
	}
	for _, c := range list.Items {
		if c.DeletionTimestamp != nil {
			continue
		}
		if err := r.deleteClaim(ctx, c.Name); err != nil {
			return err
		}
	}
	return nil
}

func (r *Runtime) deleteClaim(ctx context.Context, name string) error {
	err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return r.apiErr(err, "delete persistentvolumeclaim", name)
	}
	return nil
}

func (r *Runtime) deleteSecret(ctx context.Context, name string) error {
	err := r.cs.CoreV1().Secrets(r.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return r.apiErr(err, "delete secret", name)
	}
	return nil
}

// Stop ends a sandbox's processes and keeps its Pod, which then reports
// the container's exit: Kubernetes has no call that stops a Pod in place,
// so Stop sets the Pod's activeDeadlineSeconds, after which the kubelet
// kills it (SIGTERM, the Pod's grace of 10 s, SIGKILL). grace bounds how
// long Stop waits for that. A stopped Pod cannot start again: Restart
// replaces it.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	pod, err := r.managedPod(ctx, id)
	if err != nil {
		return err
	}
	if sandboxOf(pod).State == runtime.StateExited {
		return nil
	}
	patch := []byte(`{"spec":{"activeDeadlineSeconds":1}}`)
	if _, err := r.cs.CoreV1().Pods(r.cfg.Namespace).Patch(ctx, id, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return r.apiErr(err, "stop pod", id)
	}
	wctx, cancel := context.WithTimeout(ctx, grace+stopGrace*time.Second+5*time.Second)
	defer cancel()
	_, err = r.waitPod(wctx, pod, func(p *corev1.Pod) (bool, error) {
		return sandboxOf(p).State == runtime.StateExited, nil
	})
	if err != nil {
		return fmt.Errorf("kubernetes: stop pod %s: %w", id, err)
	}
	return nil
}

// Usage reports no disk figure: the kubelet measures and enforces a
// sandbox's disk limit itself (ephemeral-storage, DiskEnforcementEngine).
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	if _, err := r.managedPod(ctx, id); err != nil {
		return runtime.Usage{}, err
	}
	return runtime.Usage{MeasuredAt: time.Now()}, nil
}

// output returns the last n lines of sandbox id's output (its container's
// log, else its init container's), as runtime.TailLines formats them.
func (r *Runtime) output(ctx context.Context, id string, n int) string {
	lines := int64(n)
	for _, c := range []string{containerName, installName} {
		b, err := r.cs.CoreV1().Pods(r.cfg.Namespace).GetLogs(id, &corev1.PodLogOptions{Container: c, TailLines: &lines}).DoRaw(ctx)
		if err == nil && len(b) > 0 {
			return runtime.TailLines(string(b), n)
		}
	}
	return ""
}
