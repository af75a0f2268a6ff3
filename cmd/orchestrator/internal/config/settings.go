package config

import "github.com/berth-dev/berth/pkg/orchestrator"

// setting is one row of the table: a field of orchestrator.Config and the
// names it has in each source. Every setting has an environment variable;
// every one but the secrets has a flag; every one but the operator token
// has a file key.
type setting struct {
	// Flag is the long flag of `orchestrator serve`, without dashes; ""
	// for a secret, which a flag would show to every user of ps.
	Flag string
	// Env is the BERTH_* environment variable.
	Env string
	// Key is the key in the JSON file; "" when the file cannot set it.
	Key string
	// Group is the heading the flag is listed under in --help.
	Group string
	// Usage is the help text; --help appends the variable and the default.
	Usage string
	// Default describes the default where orchestrator.Defaults cannot
	// show it: a zero value that means the backend's default (shown by
	// --help too), or a value that depends on the host (a home directory;
	// --help shows this host's). "" means the value of Defaults.
	Default string
	// field binds the setting to its field of a Config: how it is parsed
	// and printed.
	field func(*orchestrator.Config) value
}

// Groups of flags, in --help order.
const (
	groupServer    = "Server"
	groupRuntime   = "Runtime"
	groupLeases    = "Leases"
	groupResources = "Sandbox resources"
	groupSecrets   = "Secrets"
)

// groups lists the groups in --help order.
var groups = []string{groupServer, groupRuntime, groupLeases, groupResources}

// Constructors of the value column, so that each row reads on one line.
func str(f func(*orchestrator.Config) *string) func(*orchestrator.Config) value {
	return func(c *orchestrator.Config) value { return stringValue{f(c)} }
}

func list(f func(*orchestrator.Config) *[]string) func(*orchestrator.Config) value {
	return func(c *orchestrator.Config) value { return listValue{f(c)} }
}

func dur(f func(*orchestrator.Config) *orchestrator.Duration) func(*orchestrator.Config) value {
	return func(c *orchestrator.Config) value { return durationValue{f(c)} }
}

func num[T integer](f func(*orchestrator.Config) *T) func(*orchestrator.Config) value {
	return func(c *orchestrator.Config) value { return intValue[T]{p: f(c)} }
}

func size[T integer](f func(*orchestrator.Config) *T) func(*orchestrator.Config) value {
	return func(c *orchestrator.Config) value { return intValue[T]{p: f(c), bytes: true} }
}

func cpus(f func(*orchestrator.Config) *float64) func(*orchestrator.Config) value {
	return func(c *orchestrator.Config) value { return cpusValue{f(c)} }
}

func boolean(f func(*orchestrator.Config) *bool, optional bool) func(*orchestrator.Config) value {
	return func(c *orchestrator.Config) value { return boolValue{p: f(c), optional: optional} }
}

// settings is the table. Names of flags, variables and keys that existed
// before the table must not change: scripts use them.
var settings = []setting{
	// Server.
	{Flag: "listen", Env: "BERTH_LISTEN", Key: "listen", Group: groupServer,
		Usage: "address of the listener (gRPC, REST, proxy, metrics)",
		field: str(func(c *orchestrator.Config) *string { return &c.Listen })},
	{Flag: "data-dir", Env: "BERTH_DATA_DIR", Key: "dataDir", Group: groupServer, Default: "$HOME/.local/share/berth",
		Usage: "data directory: lease store, server secret, instance id",
		field: str(func(c *orchestrator.Config) *string { return &c.DataDir })},
	{Flag: "preview-domain", Env: "BERTH_PREVIEW_DOMAIN", Key: "previewDomain", Group: groupServer,
		Usage: "host suffix of preview URLs ({port}-{lease}.{domain}); empty (file only) disables host routing",
		field: str(func(c *orchestrator.Config) *string { return &c.PreviewDomain })},
	{Flag: "e2b-listen", Env: "BERTH_E2B_LISTEN", Key: "e2bListen", Group: groupServer,
		Usage: "address of the E2B listener: E2B's control-plane API and the sandboxes' traffic (docs/e2b.md); empty: off",
		field: str(func(c *orchestrator.Config) *string { return &c.E2BListen })},
	{Flag: "e2b-domain", Env: "BERTH_E2B_DOMAIN", Key: "e2bDomain", Group: groupServer,
		Usage: "domain of E2B sandbox hosts ({port}-{sandbox}.{domain}) on the E2B listener; empty: E2b-Sandbox-Id headers only",
		field: str(func(c *orchestrator.Config) *string { return &c.E2BDomain })},
	{Flag: "e2b-template", Env: "BERTH_E2B_TEMPLATES", Key: "e2bTemplates", Group: groupServer, Default: "base=berth/e2b",
		Usage: "E2B templateID aliases NAME=IMAGE, comma-separated or the flag repeated (they add up); base is berth/e2b unless set",
		field: func(c *orchestrator.Config) value { return pairsValue{&c.E2BTemplates} }},
	{Flag: "max-connections", Env: "BERTH_MAX_CONNECTIONS", Key: "maxConnections", Group: groupServer,
		Usage: "open connections on the listener (gRPC and HTTP); more wait in the accept queue",
		field: num(func(c *orchestrator.Config) *int { return &c.MaxConnections })},
	{Flag: "read-header-timeout", Env: "BERTH_READ_HEADER_TIMEOUT", Key: "readHeaderTimeout", Group: groupServer,
		Usage: "time an HTTP client may take to send a request's headers",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.ReadHeaderTimeout })},
	{Flag: "idle-timeout", Env: "BERTH_IDLE_TIMEOUT", Key: "idleTimeout", Group: groupServer,
		Usage: "close HTTP keep-alive and gRPC connections idle this long",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.IdleTimeout })},
	{Flag: "log-level", Env: "BERTH_LOG_LEVEL", Key: "logLevel", Group: groupServer,
		Usage: "log level: debug, info, warn or error",
		field: str(func(c *orchestrator.Config) *string { return &c.LogLevel })},
	{Flag: "log-format", Env: "BERTH_LOG_FORMAT", Key: "logFormat", Group: groupServer,
		Usage: "log format: text or json",
		field: str(func(c *orchestrator.Config) *string { return &c.LogFormat })},

	// Runtime.
	{Flag: "runtime", Env: "BERTH_RUNTIME", Key: "runtime", Group: groupRuntime,
		Usage: "container runtime: docker, containerd or kubernetes",
		field: str(func(c *orchestrator.Config) *string { return &c.Runtime })},
	{Flag: "agent-binary", Env: "BERTH_AGENT_BINARY", Key: "agentBinary", Group: groupRuntime, Default: "sandbox-agent next to the executable",
		Usage: "static sandbox-agent injected into sandboxes",
		field: str(func(c *orchestrator.Config) *string { return &c.AgentBinary })},
	{Flag: "agent-injection", Env: "BERTH_AGENT_INJECTION", Key: "agentInjection", Group: groupRuntime,
		Usage: "docker: volume (read-only volume, token in the container env; faster) or copy (per-container copy, token in a file)",
		field: str(func(c *orchestrator.Config) *string { return &c.AgentInjection })},
	{Flag: "network", Env: "BERTH_NETWORK", Key: "network", Group: groupRuntime,
		Usage: "docker: bridge network of the sandboxes",
		field: str(func(c *orchestrator.Config) *string { return &c.Network })},
	{Flag: "host-input", Env: "BERTH_HOST_INPUT", Key: "hostInput", Group: groupRuntime,
		Usage: "docker: keep sandboxes off the host's own addresses: auto, required or off",
		field: str(func(c *orchestrator.Config) *string { return &c.HostInput })},
	{Flag: "egress", Env: "BERTH_EGRESS", Key: "egress", Group: groupRuntime,
		Usage: "enforce sandboxes' network policies (iptables, berth's DNS resolver): auto, required or off",
		field: str(func(c *orchestrator.Config) *string { return &c.Egress })},
	{Flag: "egress-upstreams", Env: "BERTH_EGRESS_UPSTREAMS", Key: "egressUpstreams", Group: groupRuntime, Default: "the host's name servers",
		Usage: "name servers (host:port, comma-separated) berth's sandbox resolver asks",
		field: list(func(c *orchestrator.Config) *[]string { return &c.EgressUpstreams })},
	{Flag: "containerd-address", Env: "BERTH_CONTAINERD_ADDRESS", Key: "containerdAddress", Group: groupRuntime, Default: "/run/containerd/containerd.sock, else Docker's containerd",
		Usage: "containerd: socket",
		field: str(func(c *orchestrator.Config) *string { return &c.ContainerdAddress })},
	{Flag: "containerd-namespace", Env: "BERTH_CONTAINERD_NAMESPACE", Key: "containerdNamespace", Group: groupRuntime, Default: "berth",
		Usage: "containerd: namespace of sandboxes and imported images",
		field: str(func(c *orchestrator.Config) *string { return &c.ContainerdNamespace })},
	{Flag: "containerd-state-dir", Env: "BERTH_CONTAINERD_STATE_DIR", Key: "containerdStateDir", Group: groupRuntime, Default: "/var/lib/berth/containerd",
		Usage: "containerd: per-sandbox host state",
		field: str(func(c *orchestrator.Config) *string { return &c.ContainerdStateDir })},
	{Flag: "sandbox-output-max-bytes", Env: "BERTH_SANDBOX_OUTPUT_MAX_BYTES", Key: "sandboxOutputMaxBytes", Group: groupRuntime,
		Usage: "size of one file of a sandbox's output (its main process's stdout and stderr) kept on the host; rotated",
		field: size(func(c *orchestrator.Config) *int64 { return &c.SandboxOutputMaxBytes })},
	{Flag: "sandbox-output-max-files", Env: "BERTH_SANDBOX_OUTPUT_MAX_FILES", Key: "sandboxOutputMaxFiles", Group: groupRuntime,
		Usage: "files of a sandbox's output kept on the host, the one being written included",
		field: num(func(c *orchestrator.Config) *int { return &c.SandboxOutputMaxFiles })},
	{Flag: "cni-bin-dir", Env: "BERTH_CNI_BIN_DIR", Key: "cniBinDir", Group: groupRuntime, Default: "/usr/lib/cni, then /opt/cni/bin",
		Usage: "containerd: directory of the CNI plugins",
		field: str(func(c *orchestrator.Config) *string { return &c.CNIBinDir })},
	{Flag: "sandbox-subnet", Env: "BERTH_SANDBOX_SUBNET", Key: "sandboxSubnet", Group: groupRuntime, Default: "10.213.0.0/16",
		Usage: "containerd: subnet of the sandboxes",
		field: str(func(c *orchestrator.Config) *string { return &c.SandboxSubnet })},
	{Flag: "sandbox-bridge", Env: "BERTH_SANDBOX_BRIDGE", Key: "sandboxBridge", Group: groupRuntime, Default: "berth-ctrd0",
		Usage: "containerd: bridge of the sandboxes",
		field: str(func(c *orchestrator.Config) *string { return &c.SandboxBridge })},
	{Flag: "userns", Env: "BERTH_USERNS", Key: "userNamespaces", Group: groupRuntime,
		Usage: "containerd: run sandboxes in user namespaces, root mapped to an unprivileged host uid",
		field: boolean(func(c *orchestrator.Config) *bool { return &c.UserNamespaces }, true)},
	{Flag: "userns-base", Env: "BERTH_USERNS_BASE", Key: "userNSBase", Group: groupRuntime, Default: "1073741824 (2^30)",
		Usage: "containerd: first host uid/gid of the user-namespace range",
		field: num(func(c *orchestrator.Config) *uint32 { return &c.UserNSBase })},
	{Flag: "instance-id", Env: "BERTH_INSTANCE_ID", Key: "instanceID", Group: groupRuntime, Default: "kept in the data dir",
		Usage: "name of this orchestrator (sandbox labels, home of its leases, election identity); set it per replica on Kubernetes",
		field: str(func(c *orchestrator.Config) *string { return &c.InstanceID })},
	{Flag: "lease-store", Env: "BERTH_LEASE_STORE", Key: "leaseStore", Group: groupRuntime, Default: "cluster on kubernetes, else local",
		Usage: "where lease records live: local (bbolt in the data dir) or cluster (BerthLease objects shared by replicas)",
		field: str(func(c *orchestrator.Config) *string { return &c.LeaseStore })},
	{Flag: "fleet", Env: "BERTH_FLEET", Key: "fleet", Group: groupRuntime, Default: "default",
		Usage: "kubernetes: the replicas sharing leases, leader and conversation locks (cluster lease store)",
		field: str(func(c *orchestrator.Config) *string { return &c.Fleet })},
	{Flag: "leader-lease-duration", Env: "BERTH_LEADER_LEASE_DURATION", Key: "leaderLeaseDuration", Group: groupRuntime, Default: "15s",
		Usage: "kubernetes: lifetime of the elected replica's Lease without renewal (how long a dead leader delays expiry)",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.LeaderLeaseDuration })},
	{Flag: "kubeconfig", Env: "BERTH_KUBECONFIG", Key: "kubeconfig", Group: groupRuntime, Default: "in-cluster configuration",
		Usage: "kubernetes: kubeconfig file",
		field: str(func(c *orchestrator.Config) *string { return &c.Kubeconfig })},
	{Flag: "namespace", Env: "BERTH_NAMESPACE", Key: "namespace", Group: groupRuntime, Default: "the kubeconfig context's, else berth",
		Usage: "kubernetes: namespace of the sandbox Pods",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesNamespace })},
	{Flag: "k8s-node", Env: "BERTH_K8S_NODE", Key: "k8sNode", Group: groupRuntime, Default: "none: the scheduler places Pods",
		Usage: "kubernetes: node every sandbox Pod is pinned to (a cluster without a scheduler)",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesNode })},
	{Flag: "k8s-agent-image", Env: "BERTH_K8S_AGENT_IMAGE", Key: "k8sAgentImage", Group: groupRuntime, Default: "berth/k8s-agent:latest",
		Usage: "kubernetes: image of the init container that copies the agent into each sandbox",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesAgentImage })},
	{Flag: "k8s-agent-claim", Env: "BERTH_K8S_AGENT_CLAIM", Key: "k8sAgentClaim", Group: groupRuntime, Default: "none: the agent image's init container",
		Usage: "kubernetes: PersistentVolumeClaim holding the agent (sandbox-agent at its root) that every sandbox Pod mounts read-only instead of copying it (a faster cold start; docs/kubernetes.md)",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesAgentClaim })},
	{Flag: "k8s-pull-policy", Env: "BERTH_K8S_PULL_POLICY", Key: "k8sPullPolicy", Group: groupRuntime, Default: "IfNotPresent",
		Usage: "kubernetes: pull policy of the agent and sandbox images: IfNotPresent, Always or Never",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesPullPolicy })},
	{Flag: "k8s-storage-class", Env: "BERTH_K8S_STORAGE_CLASS", Key: "k8sStorageClass", Group: groupRuntime,
		Usage: "kubernetes: StorageClass of each sandbox's /workspace claim (default: the cluster's default class)",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesStorageClass })},
	{Flag: "k8s-spare-claims", Env: "BERTH_K8S_SPARE_CLAIMS", Key: "k8sSpareClaims", Group: groupRuntime,
		Usage: "kubernetes: spare /workspace claims kept made and bound, which a cold acquire takes instead of waiting for a claim's binding (one replica refills them); 0 disables",
		field: num(func(c *orchestrator.Config) *int { return &c.KubernetesSpareClaims })},
	{Flag: "k8s-sandbox-service-account", Env: "BERTH_K8S_SANDBOX_SERVICE_ACCOUNT", Key: "k8sSandboxServiceAccount", Group: groupRuntime, Default: "berth-sandbox",
		Usage: "kubernetes: ServiceAccount of the sandbox Pods (must exist; give it no RoleBinding; its token is never mounted)",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesSandboxServiceAccount })},
	{Flag: "k8s-dns-namespace", Env: "BERTH_K8S_DNS_NAMESPACE", Key: "k8sDNSNamespace", Group: groupRuntime, Default: "kube-system",
		Usage: "kubernetes: namespace of the cluster's DNS Pods, the only port-53 peers of the sandboxes' NetworkPolicy",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesDNSNamespace })},
	{Flag: "k8s-dns-pod-labels", Env: "BERTH_K8S_DNS_POD_LABELS", Key: "k8sDNSPodLabels", Group: groupRuntime, Default: "k8s-app=kube-dns",
		Usage: "kubernetes: labels (k=v,k2=v2) of the cluster's DNS Pods in --k8s-dns-namespace",
		field: str(func(c *orchestrator.Config) *string { return &c.KubernetesDNSPodLabels })},

	// Leases.
	{Flag: "default-image", Env: "BERTH_DEFAULT_IMAGE", Key: "defaultImage", Group: groupLeases,
		Usage: "image of an acquire that names none (always allowed)",
		field: str(func(c *orchestrator.Config) *string { return &c.DefaultImage })},
	{Flag: "allowed-images", Env: "BERTH_ALLOWED_IMAGES", Key: "allowedImages", Group: groupLeases,
		Usage: "images acquires may name, comma-separated: * for all, a prefix ending in / for every repository under it, else a repository",
		field: list(func(c *orchestrator.Config) *[]string { return &c.Admission.AllowedImages })},
	{Flag: "default-network-mode", Env: "BERTH_DEFAULT_NETWORK_MODE", Key: "defaultNetworkMode", Group: groupLeases,
		Usage: "network mode of an acquire that sets none: none, restricted or open",
		field: str(func(c *orchestrator.Config) *string { return &c.DefaultNetworkMode })},
	{Flag: "default-network-allow", Env: "BERTH_DEFAULT_NETWORK_ALLOW", Key: "defaultNetworkAllow", Group: groupLeases,
		Usage: "allow list (CIDR, host:port, name, *.suffix; comma-separated) of an acquire that gives no network policy",
		field: list(func(c *orchestrator.Config) *[]string { return &c.DefaultNetworkAllow })},
	{Flag: "default-network-deny", Env: "BERTH_DEFAULT_NETWORK_DENY", Key: "defaultNetworkDeny", Group: groupLeases,
		Usage: "deny list (same forms) of an acquire that gives no network policy",
		field: list(func(c *orchestrator.Config) *[]string { return &c.DefaultNetworkDeny })},
	{Flag: "max-network-mode", Env: "BERTH_MAX_NETWORK_MODE", Key: "maxNetworkMode", Group: groupLeases,
		Usage: "widest network mode any acquire or policy change may ask for (the operator's too): none, restricted or open",
		field: str(func(c *orchestrator.Config) *string { return &c.MaxNetworkMode })},
	{Flag: "network-always-deny", Env: "BERTH_NETWORK_ALWAYS_DENY", Key: "networkAlwaysDeny", Group: groupLeases,
		Usage: "deny list (same forms) added to every lease's policy; no client can remove it",
		field: list(func(c *orchestrator.Config) *[]string { return &c.NetworkAlwaysDeny })},
	{Flag: "network-allow-ceiling", Env: "BERTH_NETWORK_ALLOW_CEILING", Key: "networkAllowCeiling", Group: groupLeases,
		Usage: "entries that must cover every allow entry of a restricted policy (needs max-network-mode restricted); empty: no bound",
		field: list(func(c *orchestrator.Config) *[]string { return &c.NetworkAllowCeiling })},
	{Flag: "default-ttl", Env: "BERTH_DEFAULT_TTL", Key: "defaultTTL", Group: groupLeases,
		Usage: "lifetime of a lease whose acquire gives none",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.DefaultTTL })},
	{Flag: "max-ttl", Env: "BERTH_MAX_TTL", Key: "maxTTL", Group: groupLeases,
		Usage: "longest lifetime an acquire or renew may ask for",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.MaxTTL })},
	{Flag: "default-idle-timeout", Env: "BERTH_DEFAULT_IDLE_TIMEOUT", Key: "defaultIdleTimeout", Group: groupLeases,
		Usage: "expire leases idle this long; 0 disables",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.DefaultIdleTimeout })},
	{Flag: "default-idle-policy", Env: "BERTH_DEFAULT_IDLE_POLICY", Key: "defaultIdlePolicy", Group: groupLeases,
		Usage: "what the idle timeout does to a lease whose acquire names no policy: expire, freeze or hibernate",
		field: str(func(c *orchestrator.Config) *string { return (*string)(&c.Pause.DefaultIdlePolicy) })},
	{Flag: "openhands-pause-mode", Env: "BERTH_OPENHANDS_PAUSE_MODE", Key: "openHandsPauseMode", Group: groupLeases,
		Usage: "how the OpenHands runtime API's /pause pauses a runtime: hibernate (default) or freeze",
		field: str(func(c *orchestrator.Config) *string { return &c.OpenHandsPauseMode })},
	{Flag: "openhands-app-port", Env: "BERTH_OPENHANDS_APP_PORT", Key: "openHandsAppPort", Group: groupLeases,
		Usage: "the port a lease's app (the OpenHands runtime API's command) listens on inside the sandbox; 0 takes 8000, the agent-server's",
		field: num(func(c *orchestrator.Config) *int { return &c.OpenHandsAppPort })},
	{Flag: "paused-retention", Env: "BERTH_PAUSED_RETENTION", Key: "pausedRetention", Group: groupLeases,
		Usage: "how long a lease may stay paused before it expires; negative keeps paused leases",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration {
			return (*orchestrator.Duration)(&c.Pause.PausedRetention)
		})},
	{Flag: "retention", Env: "BERTH_RETENTION", Key: "retention", Group: groupLeases,
		Usage: "how long ended lease records are kept",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.Retention })},
	{Flag: "max-leases", Env: "BERTH_MAX_LEASES", Key: "maxLeases", Group: groupLeases,
		Usage: "live leases; more acquires get RESOURCE_EXHAUSTED (HTTP 429)",
		field: num(func(c *orchestrator.Config) *int { return &c.Admission.MaxLive })},
	{Flag: "max-leases-per-owner", Env: "BERTH_MAX_LEASES_PER_OWNER", Key: "maxLeasesPerOwner", Group: groupLeases,
		Usage: "live leases of one owner (the operator is exempt)",
		field: num(func(c *orchestrator.Config) *int { return &c.Admission.MaxLivePerOwner })},
	{Flag: "max-ended-per-owner", Env: "BERTH_MAX_ENDED_PER_OWNER", Key: "maxEndedPerOwner", Group: groupLeases,
		Usage: "ended lease records kept per owner",
		field: num(func(c *orchestrator.Config) *int { return &c.Admission.MaxEndedPerOwner })},
	{Flag: "max-snapshots-per-owner", Env: "BERTH_MAX_SNAPSHOTS_PER_OWNER", Key: "maxSnapshotsPerOwner", Group: groupLeases,
		Usage: "snapshots of one owner; more get RESOURCE_EXHAUSTED (HTTP 429); 0 or negative: no limit",
		field: num(func(c *orchestrator.Config) *int { return &c.Snapshots.MaxPerOwner })},
	{Flag: "max-snapshot-bytes-per-owner", Env: "BERTH_MAX_SNAPSHOT_BYTES_PER_OWNER", Key: "maxSnapshotBytesPerOwner", Group: groupLeases,
		Usage: "bytes the snapshots of one owner add together; more get RESOURCE_EXHAUSTED (HTTP 429); 0 or negative: no limit",
		field: size(func(c *orchestrator.Config) *int64 { return &c.Snapshots.MaxBytesPerOwner })},
	{Flag: "max-watches-per-principal", Env: "BERTH_MAX_WATCHES_PER_PRINCIPAL", Key: "maxWatchesPerPrincipal", Group: groupLeases,
		Usage: "concurrent long-lived streams of one caller (token): lease watches, log follows, terminal attaches and file watches together",
		field: num(func(c *orchestrator.Config) *int { return &c.MaxWatchesPerPrincipal })},
	{Flag: "pool", Env: "BERTH_POOLS", Key: "pools", Group: groupLeases,
		Usage: "a warm pool, repeatable: name=NAME,image=IMAGE,min=N,max=N[,cpus=C,memory=SIZE,pids=N,disk=SIZE,user=USER] (';' between pools in the variable); see docs/pools.md",
		field: func(c *orchestrator.Config) value { return poolsValue{&c.Pools} }},
	{Flag: "max-pooled", Env: "BERTH_MAX_POOLED", Key: "maxPooled", Group: groupLeases, Default: "the sum of the pools' max",
		Usage: "unclaimed pooled sandboxes of all pools together (not counted in max-leases); negative: no bound",
		field: num(func(c *orchestrator.Config) *int { return &c.MaxPooled })},
	{Flag: "pool-claim-grace", Env: "BERTH_POOL_CLAIM_GRACE", Key: "poolClaimGrace", Group: groupLeases, Default: "30s",
		Usage: "with several replicas: how long a pool member may stay claimed without a lease record (its claimer died mid-claim) before the elected replica removes it",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.PoolClaimGrace })},
	{Flag: "restart-limit", Env: "BERTH_RESTART_LIMIT", Key: "restartLimit", Group: groupLeases,
		Usage: "in-place restarts of a sandbox that exited, within the restart window; 0 or -1: none",
		field: num(func(c *orchestrator.Config) *int { return &c.Restart.Limit })},
	{Flag: "restart-window", Env: "BERTH_RESTART_WINDOW", Key: "restartWindow", Group: groupLeases,
		Usage: "sliding window the restart limit counts in",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration {
			return (*orchestrator.Duration)(&c.Restart.Window)
		})},
	{Flag: "restart-delay", Env: "BERTH_RESTART_DELAY", Key: "restartDelay", Group: groupLeases,
		Usage: "how long after a sandbox's container exited its in-place restart begins (an engine going down stops its event stream within it; the restart then waits for the engine)",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return (*orchestrator.Duration)(&c.Restart.Delay) })},
	{Flag: "default-user", Env: "BERTH_DEFAULT_USER", Key: "defaultUser", Group: groupLeases,
		Usage: "user of commands in sandboxes of the default-user images when an acquire names none; image: each image's own",
		field: func(c *orchestrator.Config) value { return userValue{stringValue{&c.Admission.DefaultUser}} }},
	{Flag: "default-user-images", Env: "BERTH_DEFAULT_USER_IMAGES", Key: "defaultUserImages", Group: groupLeases,
		Usage: "image prefixes the default user applies to, comma-separated; * for all",
		field: list(func(c *orchestrator.Config) *[]string { return &c.Admission.DefaultUserImages })},
	{Flag: "allow-root-user", Env: "BERTH_ALLOW_ROOT_USER", Key: "allowRootUser", Group: groupLeases,
		Usage: "whether acquires and commands may run as root (uid 0)",
		field: boolean(func(c *orchestrator.Config) *bool { return &c.AllowRootUser }, false)},
	{Flag: "persist-workspaces", Env: "BERTH_PERSIST_WORKSPACES", Key: "persistWorkspaces", Group: groupLeases,
		Usage: "keep every acquire's /workspace on its conversation's volume, as workspace.persist (docs/workspaces.md)",
		field: boolean(func(c *orchestrator.Config) *bool { return &c.Volumes.PersistWorkspaces }, true)},
	{Flag: "volume-retention", Env: "BERTH_VOLUME_RETENTION", Key: "volumeRetention", Group: groupLeases,
		Usage: "remove a workspace volume unused this long after its last lease ended; 0 keeps volumes",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration {
			return (*orchestrator.Duration)(&c.Volumes.Retention)
		})},
	{Flag: "max-volumes-per-owner", Env: "BERTH_MAX_VOLUMES_PER_OWNER", Key: "maxVolumesPerOwner", Group: groupLeases,
		Usage: "workspace volumes of one owner; an acquire that would create one more gets RESOURCE_EXHAUSTED (HTTP 429); the operator is exempt; 0: no limit",
		field: num(func(c *orchestrator.Config) *int { return &c.Volumes.MaxPerOwner })},
	{Flag: "allow-host-mount", Env: "BERTH_ALLOW_HOST_MOUNT", Key: "allowHostMount", Group: groupLeases,
		Usage: "host directories acquires may mount, PATH:ro|rw comma-separated (/srv/projects:rw,/data:ro); empty allows none",
		field: str(func(c *orchestrator.Config) *string { return &c.AllowHostMounts })},

	// Sandbox resources.
	{Flag: "default-cpus", Env: "BERTH_DEFAULT_CPUS", Key: "defaultCPUs", Group: groupResources,
		Usage: "CPU limit of a sandbox whose acquire sets none (1.5, 500m)",
		field: cpus(func(c *orchestrator.Config) *float64 { return &c.DefaultCPUs })},
	{Flag: "default-memory-bytes", Env: "BERTH_DEFAULT_MEMORY_BYTES", Key: "defaultMemoryBytes", Group: groupResources,
		Usage: "memory limit (no swap) of a sandbox whose acquire sets none",
		field: size(func(c *orchestrator.Config) *int64 { return &c.DefaultMemoryBytes })},
	{Flag: "default-pids", Env: "BERTH_DEFAULT_PIDS", Key: "defaultPids", Group: groupResources,
		Usage: "process limit of a sandbox whose acquire sets none",
		field: num(func(c *orchestrator.Config) *int64 { return &c.DefaultPids })},
	{Flag: "default-disk-bytes", Env: "BERTH_DEFAULT_DISK_BYTES", Key: "defaultDiskBytes", Group: groupResources,
		Usage: "disk limit of a sandbox whose acquire sets none; 0: none",
		field: size(func(c *orchestrator.Config) *int64 { return &c.DefaultDiskBytes })},
	{Flag: "disk-interval", Env: "BERTH_DISK_INTERVAL", Key: "diskInterval", Group: groupResources,
		Usage: "base interval of disk usage measurements",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return (*orchestrator.Duration)(&c.Disk.Interval) })},
	{Flag: "disk-grace", Env: "BERTH_DISK_GRACE", Key: "diskGrace", Group: groupResources,
		Usage: "time over the disk limit before the sandbox is stopped and its lease failed",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return (*orchestrator.Duration)(&c.Disk.Grace) })},
	{Flag: "usage-interval", Env: "BERTH_USAGE_INTERVAL", Key: "usageInterval", Group: groupResources,
		Usage: "interval of the CPU, memory, network and process samples of READY sandboxes for /metrics; 0: off",
		field: dur(func(c *orchestrator.Config) *orchestrator.Duration { return &c.UsageInterval })},
	{Flag: "metrics-per-lease", Env: "BERTH_METRICS_PER_LEASE", Key: "metricsPerLease", Group: groupResources,
		Usage: "also export per-lease usage series (label lease_id) in /metrics",
		field: boolean(func(c *orchestrator.Config) *bool { return &c.MetricsPerLease }, false)},
	{Flag: "max-cpus", Env: "BERTH_MAX_CPUS", Key: "maxCPUs", Group: groupResources,
		Usage: "largest resources.cpus of an acquire",
		field: cpus(func(c *orchestrator.Config) *float64 { return &c.MaxCPUs })},
	{Flag: "max-memory-bytes", Env: "BERTH_MAX_MEMORY_BYTES", Key: "maxMemoryBytes", Group: groupResources,
		Usage: "largest resources.memoryBytes of an acquire",
		field: size(func(c *orchestrator.Config) *int64 { return &c.MaxMemoryBytes })},
	{Flag: "max-pids", Env: "BERTH_MAX_PIDS", Key: "maxPids", Group: groupResources,
		Usage: "largest resources.pids of an acquire",
		field: num(func(c *orchestrator.Config) *int64 { return &c.MaxPids })},
	{Flag: "max-disk-bytes", Env: "BERTH_MAX_DISK_BYTES", Key: "maxDiskBytes", Group: groupResources,
		Usage: "largest resources.diskBytes of an acquire",
		field: size(func(c *orchestrator.Config) *int64 { return &c.MaxDiskBytes })},
	{Flag: "max-env-bytes", Env: "BERTH_MAX_ENV_BYTES", Key: "maxEnvBytes", Group: groupResources,
		Usage: "total size of an acquire's env (every KEY=VALUE plus one byte)",
		field: size(func(c *orchestrator.Config) *int { return &c.Admission.MaxEnvBytes })},
	{Flag: "max-labels", Env: "BERTH_MAX_LABELS", Key: "maxLabels", Group: groupResources,
		Usage: "labels of an acquire (keys up to 128 bytes, values up to 256)",
		field: num(func(c *orchestrator.Config) *int { return &c.Admission.MaxLabels })},
	{Flag: "max-public-ports", Env: "BERTH_MAX_PUBLIC_PORTS", Key: "maxPublicPorts", Group: groupResources,
		Usage: "public ports of an acquire",
		field: num(func(c *orchestrator.Config) *int { return &c.Admission.MaxPublicPorts })},

	// Secrets: no flag, since a flag's value is visible to every user of
	// the host in ps and /proc/PID/cmdline.
	{Env: "BERTH_OPERATOR_TOKEN", Group: groupSecrets,
		Usage: "operator token: every call on every lease; empty disables operator access",
		field: str(func(c *orchestrator.Config) *string { return &c.OperatorToken })},
	{Env: "BERTH_CLIENT_TOKENS", Key: "clients", Group: groupSecrets,
		Usage: `client tokens, each bound to an owner that sees only its own leases: owner:token[,owner:token] in the environment, [{"owner": "o", "token": "t"}] in the file; the environment's add to the file's`,
		field: func(c *orchestrator.Config) value { return clientsValue{&c.Clients} }},
}
