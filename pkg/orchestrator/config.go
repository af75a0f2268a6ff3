package orchestrator

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/streamlimit"
)

// Config is the orchestrator's configuration, the input of New. Start from
// Defaults: a zero field is not a default. `orchestrator serve` fills it
// from a JSON file, BERTH_* environment variables and flags (one table of
// settings in cmd/orchestrator, documented in docs/configuration.md);
// this package reads none of them.
type Config struct {
	// Listen is the address of the single listener. Default "127.0.0.1:7070".
	Listen string
	// DataDir holds the lease store (leases.db), the server secret and the
	// instance id. Default "$HOME/.local/share/berth".
	DataDir string
	// Runtime selects the container backend: "docker", "containerd" or
	// "kubernetes". Default "docker".
	Runtime string
	// InstanceID names this orchestrator (its sandboxes' instance label,
	// the home of the leases it creates, its leader-election identity).
	// Default "": the id kept in DataDir (created on first start). Set it
	// when the data directory does not outlive the process (a replica on
	// Kubernetes: use the StatefulSet's Pod name) so a restarted replica
	// takes its leases back.
	InstanceID string
	// LeaseStore is where lease records live: "local" (the bbolt file in
	// DataDir), "cluster" (BerthLease objects of the Kubernetes
	// namespace, shared by every replica: docs/kubernetes.md) or "" (the
	// default: cluster on the kubernetes runtime, local otherwise).
	LeaseStore string
	// Fleet names the replicas that serve one set of leases with the
	// cluster lease store: replicas of one fleet share leases, a leader
	// and conversation locks; two fleets in one namespace see nothing of
	// each other. Default "default".
	Fleet string
	// LeaderLeaseDuration is how long the elected replica's
	// coordination.k8s.io Lease lasts without renewal: the longest a dead
	// leader delays expiry and reaping. Default 15s.
	LeaderLeaseDuration Duration
	// Kubeconfig is the kubeconfig file of the Kubernetes backend; ""
	// means the in-cluster configuration. Default "".
	Kubeconfig string
	// KubernetesNamespace holds the sandbox Pods. Default: the
	// kubeconfig context's namespace, else "berth" (deploy/kubernetes).
	KubernetesNamespace string
	// KubernetesNode pins sandbox Pods to one node, for a cluster without
	// a scheduler (make k8s-up: "localhost"). Default "": scheduled.
	KubernetesNode string
	// KubernetesAgentImage is the image whose init container copies the
	// agent into each sandbox Pod. Default "berth/k8s-agent:latest".
	KubernetesAgentImage string
	// KubernetesAgentClaim names a claim holding the agent that sandbox
	// Pods mount read-only instead of running the agent image's init
	// container (kubernetes.Config.AgentClaim). Default "": the init
	// container.
	KubernetesAgentClaim string
	// KubernetesPullPolicy is the pull policy of the agent image and the
	// sandboxes' images: IfNotPresent, Always or Never (images loaded
	// into the nodes by hand). Default "" (IfNotPresent).
	KubernetesPullPolicy string
	// KubernetesStorageClass is the StorageClass of the sandboxes'
	// workspace claims. Default "": the cluster's default StorageClass.
	KubernetesStorageClass string
	// KubernetesSpareClaims is how many spare workspace claims the
	// Kubernetes backend keeps made ahead and bound, so that a cold
	// Create of a lease that does not persist takes one instead of
	// waiting for a claim's binding (kubernetes.Config.SpareClaims; one
	// replica of the fleet refills them). 0 disables. Default 2.
	KubernetesSpareClaims int
	// KubernetesSandboxServiceAccount is the ServiceAccount of the sandbox
	// Pods (no rights, no token mounted). Default "" ("berth-sandbox",
	// deploy/kubernetes).
	KubernetesSandboxServiceAccount string
	// KubernetesDNSNamespace and KubernetesDNSPodLabels (a label selector
	// of equalities, "k=v,k2=v2") select the cluster's DNS Pods, the only
	// peers the sandboxes' NetworkPolicy allows on port 53. Default ""
	// ("kube-system" and "k8s-app=kube-dns").
	KubernetesDNSNamespace string
	KubernetesDNSPodLabels string
	// ContainerdAddress is containerd's socket. Default: auto-detected
	// (/run/containerd/containerd.sock, else Docker's own containerd at
	// /var/run/docker/containerd/containerd.sock).
	ContainerdAddress string
	// ContainerdNamespace is the containerd namespace of sandboxes and
	// imported images. Default "berth".
	ContainerdNamespace string
	// ContainerdStateDir holds per-sandbox host state (agent bind mount,
	// token). Default "/var/lib/berth/containerd".
	ContainerdStateDir string
	// CNIBinDir is where the CNI plugins are. Default: /usr/lib/cni, then
	// /opt/cni/bin (Debian's containernetworking-plugins).
	CNIBinDir string
	// SandboxSubnet is the containerd sandboxes' subnet. Default "10.213.0.0/16".
	SandboxSubnet string
	// SandboxBridge is the containerd sandboxes' bridge. Default "berth-ctrd0".
	SandboxBridge string
	// SandboxOutputMaxBytes and SandboxOutputMaxFiles bound each sandbox's
	// output kept on the host (what its main process writes to stdout and
	// stderr): at most MaxFiles rotated files of MaxBytes each (Docker: the
	// json-file driver's max-size and max-file, whatever the daemon's
	// defaults; containerd: berth's logging binary). Host disk, not counted
	// by the sandbox's disk limit. Defaults 10 MiB and 2.
	SandboxOutputMaxBytes int64
	SandboxOutputMaxFiles int
	// UserNamespaces runs containerd sandboxes in user namespaces: their
	// root is host uid UserNSBase, their uids 0-65535 the host's
	// UserNSBase… (containerd only). Default false.
	UserNamespaces bool
	// UserNSBase is the first host uid/gid of that range. Default 2^30.
	UserNSBase uint32
	// AgentBinary is the static sandbox-agent injected into sandboxes.
	// Default: "sandbox-agent" next to the orchestrator's executable.
	AgentBinary string
	// PreviewDomain is the host suffix of preview URLs
	// ({port}-{lease}.{domain}); browsers resolve *.localhost to loopback.
	// Default "sandbox.localhost"; empty disables host routing.
	PreviewDomain string
	// E2BListen is the address of the E2B listener: E2B's control-plane
	// REST API and the sandboxes' traffic (package e2b, docs/e2b.md).
	// Default empty: off.
	E2BListen string
	// E2BDomain is the domain of the E2B sandboxes' hosts
	// ({port}-{sandbox}.{domain}), returned as their domain. Default empty:
	// clients route by the E2b-Sandbox-Id header (E2B_SANDBOX_URL).
	E2BDomain string
	// E2BTemplates maps E2B templateIDs to images (allowed by
	// Admission.AllowedImages like any acquire's); "base" is berth/base unless set.
	E2BTemplates map[string]string
	// Network is the Docker bridge network for sandboxes. Default "berth".
	Network string
	// AgentInjection is how the agent enters a sandbox: "volume" (copied
	// once per agent version into a read-only named volume mounted at
	// /.berth; the token in the container's environment, which the agent
	// clears for its commands; default, for the faster cold acquire) or
	// "copy" (copied into each container before start, token in a file;
	// about 60-150 ms slower per acquire). Either way the copy goes through
	// the engine's API, so the engine need not share our filesystem.
	AgentInjection string
	// DefaultImage is used when an acquire names none. Default "berth/base".
	DefaultImage string
	// DefaultTTL is a lease's lifetime when the acquire gives none. Default 10m.
	DefaultTTL Duration
	// MaxTTL bounds requested lifetimes. Default 24h.
	MaxTTL Duration
	// DefaultIdleTimeout expires idle leases; 0 disables. Default 0.
	DefaultIdleTimeout Duration
	// Pause is what the idle timeout does to a lease whose acquire names
	// no policy (DefaultIdlePolicy: "expire", "freeze" or "hibernate";
	// freeze needs a backend that can freeze) and how long a lease may
	// stay paused before it expires (PausedRetention; negative keeps
	// paused leases). Defaults: lease.DefaultPauseConfig (expire, 168h).
	Pause lease.PauseConfig
	// OpenHandsPauseMode is how the OpenHands runtime API's /pause pauses
	// a runtime: "hibernate" (the default: stop the container, keep its
	// files) or "freeze" (keep its processes and memory; needs a backend
	// that can freeze). docs/openhands.md.
	OpenHandsPauseMode string
	// OpenHandsAppPort is the port a lease's app (the runtime API's
	// command, lease.AcquireRequest.App) listens on inside the sandbox.
	// Default 0: 8000, the OpenHands agent-server's.
	OpenHandsAppPort int
	// Admission bounds what an acquire may ask for and how many leases
	// there may be (lease.AdmissionConfig; the service's defaults are
	// Defaults'): Admission.MaxLive (setting max-leases) bounds live
	// leases, more acquires get RESOURCE_EXHAUSTED (HTTP 429), default
	// 100; Admission.MaxLivePerOwner (max-leases-per-owner) bounds one
	// owner's, the operator's own acquires are exempt (MaxLive still
	// applies), default 20; Admission.MaxEndedPerOwner bounds the ended
	// lease records kept per owner, older ones are purged before Retention
	// passes, default 100; Admission.MaxEnvBytes bounds the total size of
	// an acquire's env (every KEY=VALUE plus one byte), default 64 KiB;
	// Admission.MaxLabels its labels (keys at most 128 bytes, values at
	// most 256), default 64; Admission.MaxPublicPorts its publicPorts,
	// default 16. Admission.AllowedImages are the images an acquire may
	// name (the default image is always allowed): "*" allows every local
	// image, an entry ending in "/" every repository under it ("berth/"),
	// another entry that repository with any tag or digest; other images
	// are PERMISSION_DENIED naming image; default ["berth/"] (the images
	// berth builds). Admission.DefaultUser is the user commands run as
	// (and that owns files created through the agent) in sandboxes of
	// Admission.DefaultUserImages (image prefixes, "*" for all; default
	// ["berth/"]) when an acquire names no user; sandboxes of other images
	// run commands as the image's own user; "" runs every image's commands
	// as its own user; the agent itself always runs as root; default
	// "sandbox" (uid 1000 in berth's images). Admission.DefaultResources,
	// MaxResources and DenyRootUser have no setting of their own: New
	// sets them from DefaultCPUs…DefaultDiskBytes, MaxCPUs…MaxDiskBytes
	// and AllowRootUser (leaseAdmission).
	Admission lease.AdmissionConfig
	// Retention is how long ended lease records are kept. Default 1h.
	Retention Duration
	// Pools are the warm pools: sandboxes of a profile kept created,
	// started and agent-ready for acquires of that profile to claim (see
	// docs/pools.md). Default none.
	Pools []Pool
	// MaxPooled bounds the unclaimed pooled sandboxes of all pools
	// together (they do not count against Admission.MaxLive until claimed).
	// Default 0: the sum of the pools' Max; negative: no bound.
	MaxPooled int
	// PoolClaimGrace is how long a warm pool's member may stay claimed
	// without a lease record before the elected replica of a fleet
	// removes it (its claimer died mid-claim; docs/pools.md). Default 0:
	// lease.PoolsConfig's, 30s.
	PoolClaimGrace Duration
	// Volumes configures workspace volumes (see docs/workspaces.md):
	// Volumes.PersistWorkspaces makes every acquire keep /workspace on its
	// conversation's volume, as if it set workspace.persist (default
	// false); Volumes.Retention removes a workspace volume unused (no live
	// lease) for longer than it, counted from its last lease's end
	// (default 720h, 30 days; 0 keeps volumes until an operator removes
	// them); Volumes.MaxPerOwner bounds one owner's workspace volumes: a
	// persisting acquire that would create one more gets
	// RESOURCE_EXHAUSTED (HTTP 429) naming the limit; the operator's
	// acquires are exempt (default 50; 0: no limit). The host mounts the
	// lease manager allows are Volumes.HostMounts plus those of
	// AllowHostMounts.
	Volumes lease.VolumeConfig
	// AllowHostMounts are the host directories acquires may mount, as
	// "PATH:ro|rw,..." (a path without a mode is read-only); an acquire may
	// mount a path under one (symlinks resolved), read-write only under a
	// ":rw" one. Default "": no host mounts.
	AllowHostMounts string
	// Restart is the in-place restart of a sandbox whose container exited
	// unexpectedly (agent crash, kill from outside, engine restart): it is
	// restarted, files kept, Limit times within Window, each Delay after
	// the exit; one more exit fails its lease. Here a Limit of 0 or less
	// never restarts (the first exit fails the lease; for lease.Config 0
	// takes the default). Defaults: lease.DefaultRestartConfig (3, 10m,
	// 2s).
	Restart lease.RestartConfig
	// DefaultCPUs is the per-sandbox CPU limit. Default 1.
	DefaultCPUs float64
	// DefaultMemoryBytes is the per-sandbox memory limit (no swap). Default 512 MiB.
	DefaultMemoryBytes int64
	// DefaultPids is the per-sandbox process limit. Default 512.
	DefaultPids int64
	// DefaultDiskBytes is the per-sandbox disk limit (writable layer and
	// volumes) of an acquire that sets no resources.diskBytes; 0 means no
	// limit. Enforced by the engine where its storage driver can bound a
	// container's size, else by berth (see Disk).
	// Default 10 GiB.
	DefaultDiskBytes int64
	// Disk configures berth's enforcement of the disk limit (its defaults:
	// lease.DefaultDiskConfig): Disk.Interval is the base interval between
	// two measurements of a sandbox's disk usage (adapted per lease: more
	// often near the limit, less when far below it and unchanged), default
	// 15s; Disk.Grace how long a sandbox may stay over its disk limit
	// (warned, uploads refused) before berth stops it and fails its lease,
	// keeping the stopped container until Retention passes, default 30s;
	// Disk.Concurrency (no setting) bounds the measurements running at
	// once, default 2.
	Disk lease.DiskConfig
	// UsageInterval is how often the CPU, memory, network and process
	// figures of every READY sandbox are sampled for the Prometheus metrics
	// (one engine call per sandbox; `lease get` samples its lease itself).
	// 0 turns the sampling off. Default 15s.
	UsageInterval Duration
	// MetricsPerLease adds per-lease series (label lease_id) of those
	// figures to /metrics. Default false: aggregate gauges only, so the
	// number of series does not grow with the leases.
	MetricsPerLease bool
	// MaxCPUs bounds an acquire's resources.cpus. Default 4.
	MaxCPUs float64
	// MaxMemoryBytes bounds an acquire's resources.memoryBytes. Default 8 GiB.
	MaxMemoryBytes int64
	// MaxPids bounds an acquire's resources.pids. Default 4096.
	MaxPids int64
	// MaxDiskBytes bounds an acquire's resources.diskBytes. Default 100 GiB.
	MaxDiskBytes int64
	// AllowRootUser lets acquires and commands choose root (uid 0). With
	// false an acquire naming root is PERMISSION_DENIED and the agent
	// refuses commands as uid 0. Default true: with no-new-privileges a
	// non-root user cannot sudo, so root is how a sandbox installs
	// packages.
	AllowRootUser bool
	// HostInput is how the Docker backend keeps sandboxes away from the
	// host's listeners: "auto" (iptables INPUT rules when it can, else a
	// warning), "required" or "off". The containerd backend always installs
	// them. Default "auto".
	HostInput string
	// Egress is how sandboxes' network policies are enforced (host
	// iptables chains and berth's DNS resolver, docs/network-policy.md):
	// "auto" (when the orchestrator is root and iptables exists; else one
	// warning, and only open policies without a deny list are accepted),
	// "required" (fail to start otherwise) or "off". Default "auto".
	Egress string
	// DefaultNetworkMode is the network mode of an acquire that sets none:
	// "none", "restricted" or "open". Default "open".
	DefaultNetworkMode string
	// DefaultNetworkAllow and DefaultNetworkDeny are the allow and deny
	// lists of an acquire that gives no network policy. Default empty.
	DefaultNetworkAllow []string
	DefaultNetworkDeny  []string
	// MaxNetworkMode is the widest network mode any request (acquire or
	// SetNetwork, the operator's too) may ask for: "none", "restricted" or
	// "open". Default "open" (no bound).
	MaxNetworkMode string
	// NetworkAlwaysDeny is added to every lease's deny list when its policy
	// is enforced; no client can remove it. Default empty.
	NetworkAlwaysDeny []string
	// NetworkAllowCeiling bounds restricted policies' allow lists (each
	// entry must be covered by one of these); needs MaxNetworkMode
	// "restricted". Default empty: no bound.
	NetworkAllowCeiling []string
	// EgressUpstreams are the name servers (host:port) berth's sandbox
	// resolver asks. Default empty: the host's (/etc/resolv.conf).
	EgressUpstreams []string
	// Snapshots bounds one owner's snapshots (see docs/snapshots.md):
	// Snapshots.MaxPerOwner their number, Snapshots.MaxBytesPerOwner the
	// bytes they add together; a snapshot beyond either is
	// RESOURCE_EXHAUSTED (HTTP 429) naming the limit. 0 or negative: no
	// limit. Defaults 20 and 10 GiB.
	Snapshots lease.SnapshotConfig
	// MaxWatchesPerPrincipal bounds the concurrent long-lived streams of
	// one caller (the operator, one client owner, or one lease token):
	// lease watches, log follows, and terminal attaches and file watches
	// through the proxy, counted together; more get RESOURCE_EXHAUSTED
	// (HTTP 429) naming the limit. Default 16 (streamlimit.DefaultMax).
	MaxWatchesPerPrincipal int
	// MaxConnections bounds the listener's open connections (gRPC and
	// HTTP together); more wait in the kernel's accept queue. Default 1024.
	MaxConnections int
	// ReadHeaderTimeout bounds how long an HTTP client may take to send a
	// request's headers. Default 10s.
	ReadHeaderTimeout Duration
	// IdleTimeout closes HTTP keep-alive connections idle this long, and
	// gRPC connections with no call for this long. Default 2m.
	IdleTimeout Duration
	// OperatorToken opens every call and every lease. Empty disables
	// operator access. Default "".
	OperatorToken string
	// Clients maps client tokens to owners; a client sees only its own
	// leases. Default none.
	Clients []Client
	// LogLevel is debug, info, warn or error. Default "info".
	LogLevel string
	// LogFormat is text or json. Default "text".
	LogFormat string
}

// Pool is one warm pool: a profile (the fields of an acquire, zero ones
// taking the same defaults) and how many sandboxes to keep ready.
type Pool struct {
	// Name names the pool (1-63 of [a-z0-9-]).
	Name string `json:"name"`
	// Image, User, CPUs, MemoryBytes, Pids and DiskBytes are the profile;
	// an acquire claims from the pool when its own, after defaults, are
	// the same.
	Image       string  `json:"image,omitempty"`
	User        string  `json:"user,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	MemoryBytes int64   `json:"memoryBytes,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	DiskBytes   int64   `json:"diskBytes,omitempty"`
	// Min is how many ready sandboxes the pool keeps; Max bounds them
	// (a pool that missed grows towards it).
	Min int `json:"min"`
	Max int `json:"max"`
}

// leasePools maps Pools and MaxPooled to the lease manager's pools
// configuration, whose agent configurer is ac. Its defaults and rules are
// lease.PoolsConfig's (MaxPooled 0 is the sum of the pools' Max there).
func (c Config) leasePools(ac lease.AgentConfigurer) lease.PoolsConfig {
	out := lease.PoolsConfig{Pools: make([]lease.PoolConfig, 0, len(c.Pools)), MaxPooled: c.MaxPooled, AgentConfigurer: ac,
		ClaimGrace: time.Duration(c.PoolClaimGrace)}
	for _, p := range c.Pools {
		out.Pools = append(out.Pools, lease.PoolConfig{Name: p.Name, Image: p.Image, User: p.User, Min: p.Min, Max: p.Max,
			Resources: runtime.Resources{NanoCPUs: int64(p.CPUs * 1e9), MemoryBytes: p.MemoryBytes, PidsLimit: p.Pids, DiskBytes: p.DiskBytes}})
	}
	return out
}

// Client is one API client: a token bound to an owner.
type Client struct {
	// Owner names the client's leases.
	Owner string
	// Token is the client's bearer token, at least 16 characters.
	Token string
}

// Duration is a time.Duration in the configuration (written "10m" in its
// file, flags and environment).
type Duration time.Duration

// Defaults returns the built-in configuration.
func Defaults() Config {
	home, _ := os.UserHomeDir()
	agent := "sandbox-agent"
	if exe, err := os.Executable(); err == nil {
		agent = filepath.Join(filepath.Dir(exe), "sandbox-agent")
	}
	return Config{
		Listen:                 "127.0.0.1:7070",
		DataDir:                filepath.Join(home, ".local", "share", "berth"),
		Runtime:                "docker",
		AgentBinary:            agent,
		Network:                "berth",
		PreviewDomain:          "sandbox.localhost",
		AgentInjection:         "volume",
		DefaultImage:           "berth/base",
		DefaultTTL:             Duration(10 * time.Minute),
		MaxTTL:                 Duration(24 * time.Hour),
		Retention:              Duration(time.Hour),
		Pause:                  lease.DefaultPauseConfig(),
		Restart:                lease.DefaultRestartConfig(),
		Admission:              defaultAdmission(),
		DefaultCPUs:            1,
		DefaultMemoryBytes:     512 << 20,
		DefaultPids:            512,
		DefaultDiskBytes:       10 << 30,
		Disk:                   lease.DefaultDiskConfig(),
		UsageInterval:          Duration(15 * time.Second),
		MaxCPUs:                4,
		MaxMemoryBytes:         8 << 30,
		MaxPids:                4096,
		MaxDiskBytes:           100 << 30,
		AllowRootUser:          true,
		HostInput:              "auto",
		Egress:                 "auto",
		DefaultNetworkMode:     "open",
		MaxNetworkMode:         "open",
		Snapshots:              defaultSnapshots(), // snapshots.go
		SandboxOutputMaxBytes:  runtime.DefaultOutputMaxBytes,
		SandboxOutputMaxFiles:  runtime.DefaultOutputMaxFiles,
		Volumes:                defaultVolumes(), // volumes.go
		MaxWatchesPerPrincipal: streamlimit.DefaultMax,
		MaxConnections:         1024,
		KubernetesSpareClaims:  2,
		ReadHeaderTimeout:      Duration(10 * time.Second),
		IdleTimeout:            Duration(2 * time.Minute),
		LogLevel:               "info",
		LogFormat:              "text",
	}
}

// defaultAdmission is lease.DefaultAdmissionConfig with the service's
// own defaults: 20 live leases per owner, 100 ended records per owner, the
// images berth builds, and their "sandbox" user.
func defaultAdmission() lease.AdmissionConfig {
	a := lease.DefaultAdmissionConfig()
	a.MaxLivePerOwner, a.MaxEndedPerOwner = 20, 100
	a.AllowedImages, a.DefaultUser = []string{"berth/"}, "sandbox"
	return a
}

// leaseAdmission returns Admission with the settings of another shape
// applied: DefaultResources, MaxResources (CPUs as numbers of CPUs) and
// DenyRootUser (!AllowRootUser).
func (c Config) leaseAdmission() lease.AdmissionConfig {
	a := c.Admission
	a.DefaultResources, a.MaxResources, a.DenyRootUser = c.DefaultResources(), c.maxResources(), !c.AllowRootUser
	return a
}

// maxResources returns the per-sandbox maximums: MaxCPUs, MaxMemoryBytes,
// MaxPids and MaxDiskBytes.
func (c Config) maxResources() runtime.Resources {
	return runtime.Resources{NanoCPUs: int64(c.MaxCPUs * 1e9), MemoryBytes: c.MaxMemoryBytes, PidsLimit: c.MaxPids, DiskBytes: c.MaxDiskBytes}
}

// DefaultResources returns the per-sandbox limits of an acquire that sets
// none: DefaultCPUs, DefaultMemoryBytes, DefaultPids and DefaultDiskBytes.
func (c Config) DefaultResources() runtime.Resources {
	return runtime.Resources{NanoCPUs: int64(c.DefaultCPUs * 1e9), MemoryBytes: c.DefaultMemoryBytes, PidsLimit: c.DefaultPids,
		DiskBytes: c.DefaultDiskBytes}
}

// SandboxOutput returns the bound of each sandbox's output kept on the
// host (SandboxOutputMaxBytes, SandboxOutputMaxFiles).
func (c Config) SandboxOutput() runtime.OutputLimit {
	return runtime.OutputLimit{MaxBytes: c.SandboxOutputMaxBytes, MaxFiles: c.SandboxOutputMaxFiles}
}

// leaseRestart maps Config.Restart to lease.Config.Restart: a Limit of 0
// means no restarts here, the default there.
func leaseRestart(c lease.RestartConfig) lease.RestartConfig {
	if c.Limit <= 0 {
		c.Limit = -1
	}
	return c
}

// Validate checks the configuration for values that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Runtime != "docker" && c.Runtime != "containerd" && c.Runtime != "kubernetes":
		return fmt.Errorf("runtime %q is not supported (supported: docker, containerd, kubernetes)", c.Runtime)
	case c.LeaseStore != "" && c.LeaseStore != "local" && c.LeaseStore != "cluster":
		return fmt.Errorf("lease store must be local or cluster, got %q", c.LeaseStore)
	case c.LeaseStore == "cluster" && c.Runtime != "kubernetes":
		return fmt.Errorf("lease store cluster needs the kubernetes runtime (runtime is %q)", c.Runtime)
	case c.Fleet != "" && !validInstanceID(c.Fleet):
		return fmt.Errorf("fleet %q: want 1-63 characters of [a-z0-9-], starting and ending with a letter or digit", c.Fleet)
	case c.LeaderLeaseDuration < 0 || (c.LeaderLeaseDuration > 0 && c.LeaderLeaseDuration < Duration(2*time.Second)):
		return fmt.Errorf("leader lease duration must be at least 2s, got %s", time.Duration(c.LeaderLeaseDuration))
	case c.InstanceID != "" && !validInstanceID(c.InstanceID):
		return fmt.Errorf("instance id %q: want 1-63 characters of [a-z0-9-], starting and ending with a letter or digit", c.InstanceID)
	case c.KubernetesPullPolicy != "" && c.KubernetesPullPolicy != "IfNotPresent" && c.KubernetesPullPolicy != "Always" && c.KubernetesPullPolicy != "Never":
		return fmt.Errorf("kubernetes pull policy must be IfNotPresent, Always or Never, got %q", c.KubernetesPullPolicy)
	case c.Runtime == "docker" && c.AgentInjection != "copy" && c.AgentInjection != "volume":
		return fmt.Errorf("agent injection must be copy or volume, got %q", c.AgentInjection)
	case c.Admission.MaxLive <= 0:
		return fmt.Errorf("max leases must be positive, got %d", c.Admission.MaxLive)
	case c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL:
		return fmt.Errorf("default ttl must be positive and at most max ttl")
	case c.DataDir == "":
		return errors.New("data dir must be set")
	case math.IsNaN(c.MaxCPUs) || math.IsInf(c.MaxCPUs, 0) || c.MaxCPUs <= 0 || c.MaxCPUs > 1e6:
		return fmt.Errorf("max cpus must be a positive number (at most 1e6), got %v", c.MaxCPUs)
	case c.MaxMemoryBytes <= 0 || c.MaxPids <= 0 || c.MaxDiskBytes <= 0:
		return errors.New("max memory bytes, max pids and max disk bytes must be positive")
	case c.DefaultCPUs > c.MaxCPUs || c.DefaultMemoryBytes > c.MaxMemoryBytes || c.DefaultPids > c.MaxPids || c.DefaultDiskBytes > c.MaxDiskBytes:
		return errors.New("default cpus, memory bytes, pids and disk bytes must not exceed their maximums")
	case c.DefaultDiskBytes < 0 || (c.DefaultDiskBytes > 0 && c.DefaultDiskBytes < 1<<20) || c.DefaultDiskBytes > c.MaxDiskBytes:
		return fmt.Errorf("default disk bytes must be 0 (no limit) or between 1 MiB and max disk bytes (%d), got %d", c.MaxDiskBytes, c.DefaultDiskBytes)
	case c.UsageInterval < 0:
		return errors.New("usage interval must not be negative (0 turns usage sampling off)")
	case c.Admission.MaxLivePerOwner <= 0 || c.Admission.MaxEndedPerOwner <= 0 || c.MaxWatchesPerPrincipal <= 0 || c.MaxConnections <= 0:
		return errors.New("max leases per owner, max ended per owner, max watches per principal and max connections must be positive")
	case c.OpenHandsAppPort < 0 || c.OpenHandsAppPort > 65535 || c.OpenHandsAppPort == runtime.AgentPort:
		return fmt.Errorf("openhands app port must be 1-65535 and not the agent's %d, got %d", runtime.AgentPort, c.OpenHandsAppPort)
	case c.OpenHandsPauseMode != "" && c.OpenHandsPauseMode != "freeze" && c.OpenHandsPauseMode != "hibernate":
		return fmt.Errorf("openhands pause mode must be freeze or hibernate, got %q", c.OpenHandsPauseMode)
	case c.KubernetesSpareClaims < 0:
		return fmt.Errorf("k8s spare claims must not be negative (0 disables them), got %d", c.KubernetesSpareClaims)
	case c.ReadHeaderTimeout <= 0 || c.IdleTimeout <= 0:
		return errors.New("read header timeout and idle timeout must be positive")
	}
	if err := c.leaseAdmission().Validate(); err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	if err := c.Disk.Validate(); err != nil {
		return fmt.Errorf("disk limit enforcement: %w", err)
	}
	if err := c.Restart.Validate(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if err := c.Pause.Validate(); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	if err := c.validateVolumes(); err != nil { // volumes.go
		return err
	}
	if err := c.validateEgress(); err != nil { // network.go
		return err
	}
	for name, image := range c.E2BTemplates {
		if strings.TrimSpace(name) == "" || strings.TrimSpace(image) == "" {
			return fmt.Errorf("e2b template %q=%q: name and image required", name, image)
		}
	}
	if c.E2BListen != "" && c.E2BListen == c.Listen {
		return fmt.Errorf("e2b listen %q must differ from listen", c.E2BListen)
	}
	seen := map[string]bool{}
	for _, cl := range c.Clients {
		if cl.Owner == "" || len(cl.Token) < 16 {
			return fmt.Errorf("client %q: owner required and token at least 16 characters", cl.Owner)
		}
		if seen[cl.Token] || cl.Token == c.OperatorToken {
			return fmt.Errorf("client %q: token reused", cl.Owner)
		}
		seen[cl.Token] = true
	}
	return nil
}
