// Package backend builds the container runtime `orchestrator serve` runs
// on: the Docker, containerd or Kubernetes backend, as the configuration's Runtime
// names, with the configuration's agent, network and per-sandbox defaults.
// It is the only package of the orchestrator command that imports the
// backends, so pkg/orchestrator (the server) depends on the runtime
// interface alone; on Kubernetes it also hands over the cluster the
// replicas share (orchestrator.Platform), built here rather than found by
// the server inspecting the runtime's type. (It is not called "runtime" so as not to shadow
// pkg/runtime, whose interface it returns.)
package backend

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
	"github.com/berth-dev/berth/pkg/runtime/docker"
	"github.com/berth-dev/berth/pkg/runtime/kubernetes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
)

// Runtime is a container backend that holds a client to close.
type Runtime interface {
	runtime.Runtime
	Close() error
}

// Backend is what New built: the runtime, and the cluster the replicas
// share when the backend is one (Kubernetes).
type Backend struct {
	Runtime Runtime
	// Cluster is nil but on Kubernetes.
	Cluster orchestrator.Cluster
}

// Platform is what orchestrator.New runs on.
func (b Backend) Platform() orchestrator.Platform {
	return orchestrator.Platform{Runtime: b.Runtime, Cluster: b.Cluster}
}

// Timeouts of the containerd preparation New starts.
const (
	// importTimeout bounds bringing the locally built images over from the
	// Docker Engine (cheap when they are current).
	importTimeout = 5 * time.Minute
	// prepareTimeout bounds remapping the default image for user namespaces.
	prepareTimeout = 15 * time.Minute
)

// New builds the backend cfg.Runtime names ("docker", "containerd" or
// "kubernetes") and checks that its engine answers; the error of an unreachable engine wraps
// errdefs.ErrUnavailable with a hint. The containerd backend also imports
// the images the Docker Engine has (when there is one) and, with user
// namespaces, prepares the default image in the background.
func New(ctx context.Context, cfg orchestrator.Config, log *slog.Logger) (Backend, error) {
	if log == nil {
		log = slog.Default()
	}
	var b Backend
	switch cfg.Runtime {
	case "docker", "":
		d, err := docker.New(ctx, dockerConfig(cfg, log))
		if err != nil {
			return Backend{}, fmt.Errorf("docker runtime: %w", err)
		}
		b.Runtime = d
	case "containerd":
		c, err := containerd.New(ctx, containerdConfig(cfg, log))
		if err != nil {
			return Backend{}, fmt.Errorf("containerd runtime: %w", err)
		}
		prepareContainerd(ctx, c, cfg, log)
		b.Runtime = c
	case "kubernetes":
		// client-go logs (leader election, watches) through klog: send
		// them to the orchestrator's log rather than raw to stderr.
		klog.SetSlogLogger(log.With("component", "client-go"))
		kcfg, err := kubernetesConfig(cfg, log)
		if err != nil {
			return Backend{}, fmt.Errorf("kubernetes runtime: %w", err)
		}
		k, err := kubernetes.New(ctx, kcfg)
		if err != nil {
			return Backend{}, fmt.Errorf("kubernetes runtime: %w", err)
		}
		b.Runtime, b.Cluster = k, k
	default:
		return Backend{}, fmt.Errorf("runtime %q is not supported (supported: docker, containerd, kubernetes)", cfg.Runtime)
	}
	if err := b.Runtime.Ping(ctx); err != nil {
		b.Runtime.Close()
		return Backend{}, fmt.Errorf("%s engine unreachable: %w", cfg.Runtime, err)
	}
	return b, nil
}

// dockerConfig is the Docker backend's configuration from cfg.
func dockerConfig(cfg orchestrator.Config, log *slog.Logger) docker.Config {
	return docker.Config{
		AgentBinary: cfg.AgentBinary, Network: cfg.Network, Injection: docker.Injection(cfg.AgentInjection),
		DefaultResources: cfg.DefaultResources(), HostInput: docker.HostInputMode(cfg.HostInput), Output: cfg.SandboxOutput(),
		Logger: log.With("component", "docker"),
	}
}

// containerdConfig is the containerd backend's configuration from cfg.
func containerdConfig(cfg orchestrator.Config, log *slog.Logger) containerd.Config {
	var bins []string
	if cfg.CNIBinDir != "" {
		bins = []string{cfg.CNIBinDir}
	}
	return containerd.Config{
		AgentBinary: cfg.AgentBinary, Address: cfg.ContainerdAddress, Namespace: cfg.ContainerdNamespace,
		StateDir: cfg.ContainerdStateDir, CNIBinDirs: bins, Subnet: cfg.SandboxSubnet, Bridge: cfg.SandboxBridge,
		DefaultResources: cfg.DefaultResources(), UserNamespaces: cfg.UserNamespaces, UserNSBase: cfg.UserNSBase, Output: cfg.SandboxOutput(),
		Logger: log.With("component", "containerd"),
	}
}

// kubernetesConfig is the Kubernetes backend's configuration from cfg.
func kubernetesConfig(cfg orchestrator.Config, log *slog.Logger) (kubernetes.Config, error) {
	pull := corev1.PullPolicy(cfg.KubernetesPullPolicy)
	var dnsLabels map[string]string
	if cfg.KubernetesDNSPodLabels != "" {
		m, err := labels.ConvertSelectorToLabelsMap(cfg.KubernetesDNSPodLabels)
		if err != nil {
			return kubernetes.Config{}, fmt.Errorf("%w: k8s dns pod labels %q: %v", errdefs.ErrInvalidArgument, cfg.KubernetesDNSPodLabels, err)
		}
		dnsLabels = m
	}
	return kubernetes.Config{
		Kubeconfig: cfg.Kubeconfig, Namespace: cfg.KubernetesNamespace, NodeName: cfg.KubernetesNode,
		AgentImage: cfg.KubernetesAgentImage, AgentClaim: cfg.KubernetesAgentClaim, AgentImagePullPolicy: pull, ImagePullPolicy: pull,
		StorageClass: cfg.KubernetesStorageClass, SpareClaims: cfg.KubernetesSpareClaims, ServiceAccount: cfg.KubernetesSandboxServiceAccount,
		NetworkPolicy: true, DNSNamespace: cfg.KubernetesDNSNamespace, DNSPodLabels: dnsLabels,
		DefaultResources: cfg.DefaultResources(),
		LeaderLease:      kubernetes.LeaderLeaseOf(cfg.Fleet), LeaderLeaseDuration: time.Duration(cfg.LeaderLeaseDuration),
		Logger: log.With("component", "kubernetes"),
	}, nil
}

// prepareContainerd brings the locally built images over from the Docker
// Engine when there is one (a host without Docker imports by hand,
// docs/runtime-containerd.md) and, with user namespaces, remaps the default
// image in the background, which its first sandbox would otherwise do
// (seconds to tens of seconds). Failures are warnings: the server can run
// without either.
func prepareContainerd(ctx context.Context, c *containerd.Runtime, cfg orchestrator.Config, log *slog.Logger) {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), importTimeout)
	names, err := c.ImportFromDocker(ictx)
	cancel()
	if err != nil {
		log.Warn("containerd: images not imported from Docker; import them by hand (docs/runtime-containerd.md)", "err", err)
	} else {
		log.Info("containerd: images ready", "images", names)
	}
	if !cfg.UserNamespaces {
		return
	}
	go func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), prepareTimeout)
		defer cancel()
		if err := c.PrepareImage(pctx, cfg.DefaultImage); err != nil {
			log.Warn("containerd: default image not prepared for user namespaces; its first sandbox will remap it", "image", cfg.DefaultImage, "err", err)
		}
	}()
}
