// Package containerd is berth's containerd backend: a runtime.Runtime that
// runs each sandbox as a hardened containerd container, with the static
// sandbox-agent bind-mounted read-only as its PID 1 and its own network
// namespace on a CNI bridge, so berth runs on a host without dockerd. It
// uses the containerd v2 Go client (github.com/containerd/containerd/v2/client)
// and works with containerd 1.6 and newer (it avoids the transfer, sandbox
// and streaming services and introspection's PluginInfo, which 1.6 lacks).
// It passes the shared suite in runtime/conformance.
//
// # Socket, namespace, images
//
// Config.Address defaults to /run/containerd/containerd.sock, or to the
// containerd the Docker Engine runs (/var/run/docker/containerd/containerd.sock)
// when only that one exists. Images and containers live in Config.Namespace
// (default "berth"). Nothing is pulled: images are imported with Import (a
// `docker save` or OCI archive stream) or ImportFromDocker (straight from
// the local Engine, skipping images already imported) and unpacked with the
// snapshotter (default overlayfs). By hand:
//
//	docker save berth/base:latest | ctr -a SOCKET -n berth images import -
//
// A missing image is errdefs.ErrNotFound naming it and that command.
//
// # Create
//
//  1. The image is resolved (Docker-style names are normalized:
//     berth/base → docker.io/berth/base:latest; image ids work too) and
//     unpacked if needed.
//  2. The host is prepared once: StateDir, one copy of the agent per
//     version under StateDir/agents, the CNI plugins, the firewall rules.
//  3. The container ContainerID(lease) = "berth-"+lease is created with an
//     overlayfs snapshot and its OCI spec — at most one per lease, a second
//     Create is errdefs.ErrAlreadyExists. The commands' user (Spec.User,
//     else the image's) is resolved from the image's /etc/passwd (a user
//     that does not exist fails here, at once); /workspace is created owned
//     by it when the image has no working directory. The process, the
//     agent, runs as root and gets --user (and --allow-root=false under
//     Spec.DenyRootUser). With Config.UserNamespaces the snapshot is made on
//     the image's remapped copy and the spec gets a user namespace.
//  4. StateDir/sandboxes/ID is written: berth/sandbox-agent (a hard link to
//     the agent copy) and berth/token, bind-mounted read-only at /.berth, and
//     hosts, hostname, resolv.conf bind-mounted at /etc.
//  5. A network namespace is created and bind-mounted at NetnsDir/ID (like
//     `ip netns add`, so `ip netns` lists it), loopback up; CNI ADD (bridge
//     plugin, host-local IPAM) gives it eth0 on the bridge; the host end of
//     the veth becomes an isolated bridge port; the address is recorded in
//     the container's "dev.berth.network" extension.
//  6. The task is created (its output appended to StateDir/sandboxes/ID/log)
//     and started, and GET http://IP:7000/healthz is polled (2 ms doubling to
//     50 ms) until 200; the task's status is checked every 50 ms, so an agent
//     that exits fails Create at once.
//
// Everything is bounded by Spec.ReadyTimeout. On any failure — including a
// cancelled caller — the last 20 lines of the sandbox's output are added to
// the error and everything created is removed as Remove does.
//
// # Hardening
//
// containerd's default spec (masked and read-only /proc paths, private PID,
// IPC, UTS and mount namespaces, NoNewPrivileges) plus: a private cgroup
// namespace, capabilities cut to runtime.Capabilities() (bounding, effective, permitted; no
// inheritable or ambient ones), no-new-privileges, the default seccomp
// profile, CFS quota from NanoCPUs (period 100 ms), memory limit with
// memory+swap equal to it (no swap), pids limit, the cgroup file system
// mounted read-only, and no RLIMIT_NOFILE override (containerd's limit is
// inherited, as Docker's containers inherit dockerd's).
//
// # Networking and isolation
//
// Sandboxes are attached to the bridge Config.Bridge (default berth-ctrd0,
// subnet 10.213.0.0/16, gateway .1). They cannot reach each other: every
// veth is an isolated bridge port (IFLA_BRPORT_ISOLATED), and the iptables
// chain BERTH-<bridge>, jumped to first from FORWARD (and from DOCKER-USER
// when Docker runs), drops forwarded traffic between sandboxes, drops
// anything entering the bridge that is not a reply (so no other host,
// Docker container or VM can reach a sandbox) and drops sandbox traffic
// towards Docker's bridges (docker0, br-*). The orchestrator's host reaches
// sandboxes directly, without forwarding: the endpoint is IP:7000 on the
// bridge. Outbound traffic is NATed (one MASQUERADE rule for the subnet).
//
// # Cleanup
//
// Remove kills and deletes the task (thawing a paused one first), runs CNI
// DEL (releasing the address and the veth), unmounts and deletes the
// network namespace, deletes the host directory, then the container and its
// snapshot — in that order, so a failure leaves the container for List to
// find and Remove to retry. Remove of an id with no container still cleans
// any leftovers under that id.
//
// # Ownership and events
//
// Containers carry the same labels as the Docker backend's
// (runtime.LabelManaged and the lease, conversation, instance and user
// labels); Get, Stop, Pause and Resume report a container without the
// managed label as not found and Remove refuses it. List filters by label in
// containerd. Watch turns containerd's /tasks/exit, /tasks/oom and
// /containers/delete events into runtime.Events.
package containerd
