package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
	"github.com/berth-dev/berth/pkg/runtime/docker"
)

// ClosableRuntime is a container backend that holds a client to close.
type ClosableRuntime interface {
	runtime.Runtime
	Close() error
}

// NewRuntime builds the backend cfg.Runtime names ("docker" or
// "containerd") and checks that its engine answers; the error of an
// unreachable engine is errdefs.ErrUnavailable with a hint.
func NewRuntime(ctx context.Context, cfg Config, log *slog.Logger) (ClosableRuntime, error) {
	if log == nil {
		log = slog.Default()
	}
	res := runtime.Resources{NanoCPUs: int64(cfg.DefaultCPUs * 1e9), MemoryBytes: cfg.DefaultMemoryBytes, PidsLimit: cfg.DefaultPids,
		DiskBytes: cfg.DefaultDiskBytes}
	var rt ClosableRuntime
	switch cfg.Runtime {
	case "docker", "":
		d, err := docker.New(ctx, docker.Config{
			AgentBinary: cfg.AgentBinary, Network: cfg.Network, Injection: docker.Injection(cfg.AgentInjection),
			DefaultResources: res, HostInput: docker.HostInputMode(cfg.HostInput), Logger: log.With("component", "docker"),
		})
		if err != nil {
			return nil, fmt.Errorf("docker runtime: %w", err)
		}
		rt = d
	case "containerd":
		var bins []string
		if cfg.CNIBinDir != "" {
			bins = []string{cfg.CNIBinDir}
		}
		c, err := containerd.New(ctx, containerd.Config{
			AgentBinary: cfg.AgentBinary, Address: cfg.ContainerdAddress, Namespace: cfg.ContainerdNamespace,
			StateDir: cfg.ContainerdStateDir, CNIBinDirs: bins, Subnet: cfg.SandboxSubnet, Bridge: cfg.SandboxBridge,
			DefaultResources: res, UserNamespaces: cfg.UserNamespaces, UserNSBase: cfg.UserNSBase,
			Logger: log.With("component", "containerd"),
		})
		if err != nil {
			return nil, fmt.Errorf("containerd runtime: %w", err)
		}
		// Bring the locally built images over from the Docker Engine when
		// there is one (cheap when they are current); a host without
		// Docker imports by hand (docs/runtime-containerd.md).
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		names, err := c.ImportFromDocker(ictx)
		cancel()
		if err != nil {
			log.Warn("containerd: images not imported from Docker; import them by hand (docs/runtime-containerd.md)", "err", err)
		} else {
			log.Info("containerd: images ready", "images", names)
		}
		if cfg.UserNamespaces {
			// The default image's first sandbox would otherwise remap it
			// (seconds to tens of seconds); do it now, in the background.
			go func() {
				pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
				defer cancel()
				if err := c.PrepareImage(pctx, cfg.DefaultImage); err != nil {
					log.Warn("containerd: default image not prepared for user namespaces; its first sandbox will remap it", "image", cfg.DefaultImage, "err", err)
				}
			}()
		}
		rt = c
	default:
		return nil, fmt.Errorf("runtime %q is not supported (supported: docker, containerd)", cfg.Runtime)
	}
	if err := rt.Ping(ctx); err != nil {
		rt.Close()
		return nil, fmt.Errorf("%s engine unreachable: %w", cfg.Runtime, err)
	}
	return rt, nil
}
