// Package backend builds the container runtime `orchestrator serve` runs
// on: the Docker, containerd or Kubernetes backend, as the configuration's Runtime
// names, with the configuration's agent, network and per-sandbox defaults.
// It is the only package of the orchestrator command that imports the
// backends, so pkg/orchestrator (the server) depends on the runtime
// interface alone. (It is not called "runtime" so as not to shadow
// pkg/runtime, whose interface it returns.)
package backend

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
	"github.com/berth-dev/berth/pkg/runtime/docker"
	"github.com/berth-dev/berth/pkg/runtime/kubernetes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Runtime is a container backend that holds a client to close.
type Runtime interface {
	runtime.Runtime
	Close() error
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
func New(ctx context.Context, cfg orchestrator.Config, log *slog.Logger) (Runtime, error) {
	if log == nil {
		log = slog.Default()
	}
	var rt Runtime
	switch cfg.Runtime {
	case "docker", "":
		d, err := docker.New(ctx, dockerConfig(cfg, log))
		if err != nil {
			return nil, fmt.Errorf("docker runtime: %w", err)
		}
		rt = d
	case "containerd":
		c, err := containerd.New(ctx, containerdConfig(cfg, log))
		if err != nil {
			return nil, fmt.Errorf("containerd runtime: %w", err)
		}
		prepareContainerd(ctx, c, cfg, log)
		rt = c
	case "kubernetes":
		// client-go logs (leader election, watches) through klog: send
		// them to the orchestrator's log rather than raw to stderr.
		klog.SetSlogLogger(log.With("component", "client-go"))
		k, err := kubernetes.New(ctx, kubernetesConfig(cfg, log))
		if err != nil {
			return nil, fmt.Errorf("kubernetes runtime: %w", err)
		}
		rt = k
	default:
		return nil, fmt.Errorf("runtime %q is not supported (supported: docker, containerd, kubernetes)", cfg.Runtime)
	}
	if err := rt.Ping(ctx); err != nil {
		rt.Close()
		return nil, fmt.Errorf("%s engine unreachable: %w", cfg.Runtime, err)
	}
	return rt, nil
}

// dockerConfig is the Docker backend's configuration from cfg.
func dockerConfig(cfg orchestrator.Config, log *slog.Logger) docker.Config {
	return docker.Config{
		AgentBinary: cfg.AgentBinary, Network: cfg.Network, Injection: docker.Injection(cfg.AgentInjection),
		DefaultResources: cfg.DefaultResources(), HostInput: docker.HostInputMode(cfg.HostInput),
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
		DefaultResources: cfg.DefaultResources(), UserNamespaces: cfg.UserNamespaces, UserNSBase: cfg.UserNSBase,
		Logger: log.With("component", "containerd"),
	}
}

// kubernetesConfig is the Kubernetes backend's configuration from cfg.
func kubernetesConfig(cfg orchestrator.Config, log *slog.Logger) kubernetes.Config {
	pull := corev1.PullPolicy(cfg.KubernetesPullPolicy)
	return kubernetes.Config{
		Kubeconfig: cfg.Kubeconfig, Namespace: cfg.KubernetesNamespace, NodeName: cfg.KubernetesNode,
		AgentImage: cfg.KubernetesAgentImage, AgentImagePullPolicy: pull, ImagePullPolicy: pull,
		StorageClass:  cfg.KubernetesStorageClass,
		NetworkPolicy: true, DefaultResources: cfg.DefaultResources(),
		LeaderLease: kubernetes.LeaderLeaseOf(cfg.Fleet), LeaderLeaseDuration: time.Duration(cfg.LeaderLeaseDuration),
		Logger: log.With("component", "kubernetes"),
	}
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
