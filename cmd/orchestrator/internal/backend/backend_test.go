package backend

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/docker"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestBackendConfigs checks that every setting a backend reads reaches it.
func TestBackendConfigs(t *testing.T) {
	cfg := orchestrator.Defaults()
	cfg.AgentBinary = "/opt/agent"
	cfg.Network = "net0"
	cfg.AgentInjection = "copy"
	cfg.HostInput = "required"
	cfg.DefaultCPUs, cfg.DefaultMemoryBytes, cfg.DefaultPids, cfg.DefaultDiskBytes = 1.5, 256<<20, 64, 2<<30
	cfg.ContainerdAddress, cfg.ContainerdNamespace, cfg.ContainerdStateDir = "/run/c.sock", "ns", "/var/lib/x"
	cfg.CNIBinDir, cfg.SandboxSubnet, cfg.SandboxBridge = "/cni", "10.9.0.0/16", "br9"
	cfg.UserNamespaces, cfg.UserNSBase = true, 1<<20
	want := runtime.Resources{NanoCPUs: 1_500_000_000, MemoryBytes: 256 << 20, PidsLimit: 64, DiskBytes: 2 << 30}

	d := dockerConfig(cfg, discard)
	if d.AgentBinary != "/opt/agent" || d.Network != "net0" || d.Injection != docker.Injection("copy") ||
		d.HostInput != docker.HostInputMode("required") || d.DefaultResources != want || d.Logger == nil {
		t.Errorf("docker config: %+v", d)
	}
	c := containerdConfig(cfg, discard)
	if c.AgentBinary != "/opt/agent" || c.Address != "/run/c.sock" || c.Namespace != "ns" || c.StateDir != "/var/lib/x" ||
		len(c.CNIBinDirs) != 1 || c.CNIBinDirs[0] != "/cni" || c.Subnet != "10.9.0.0/16" || c.Bridge != "br9" ||
		!c.UserNamespaces || c.UserNSBase != 1<<20 || c.DefaultResources != want || c.Logger == nil {
		t.Errorf("containerd config: %+v", c)
	}
	cfg.CNIBinDir = ""
	if c := containerdConfig(cfg, discard); c.CNIBinDirs != nil {
		t.Errorf("no CNI bin dir: %q, want the backend's search path (nil)", c.CNIBinDirs)
	}
}

func TestNewUnsupported(t *testing.T) {
	cfg := orchestrator.Defaults()
	cfg.Runtime = "podman"
	_, err := New(context.Background(), cfg, discard)
	if err == nil || !strings.Contains(err.Error(), `runtime "podman" is not supported`) {
		t.Fatalf("New(podman): %v", err)
	}
}

func TestKubernetesConfig(t *testing.T) {
	cfg := orchestrator.Defaults()
	cfg.Runtime, cfg.Kubeconfig, cfg.KubernetesNamespace, cfg.KubernetesNode = "kubernetes", "/k/config", "ns", "node1"
	cfg.KubernetesAgentImage, cfg.KubernetesPullPolicy = "reg/agent:1", "Never"
	cfg.KubernetesSandboxServiceAccount, cfg.KubernetesDNSNamespace, cfg.KubernetesDNSPodLabels = "sb", "dns", "app=coredns,tier=dns"
	k, err := kubernetesConfig(cfg, discard)
	if err != nil {
		t.Fatal(err)
	}
	if k.Kubeconfig != "/k/config" || k.Namespace != "ns" || k.NodeName != "node1" || k.AgentImage != "reg/agent:1" ||
		k.AgentImagePullPolicy != "Never" || k.ImagePullPolicy != "Never" || !k.NetworkPolicy || k.DefaultResources != cfg.DefaultResources() || k.Logger == nil ||
		k.ServiceAccount != "sb" || k.DNSNamespace != "dns" || len(k.DNSPodLabels) != 2 || k.DNSPodLabels["app"] != "coredns" || k.DNSPodLabels["tier"] != "dns" {
		t.Errorf("kubernetes config: %+v", k)
	}
	cfg.KubernetesDNSPodLabels = "app!=coredns"
	if _, err := kubernetesConfig(cfg, discard); err == nil {
		t.Error("kubernetesConfig accepted dns pod labels that are no equalities")
	}
	cfg.KubernetesDNSPodLabels = ""
	// Without a kubeconfig outside a cluster: a clear error naming the setting.
	cfg.Kubeconfig = ""
	if _, err := New(context.Background(), cfg, discard); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Errorf("New(kubernetes) without kubeconfig outside a cluster: %v", err)
	}
}
