// Package docker is berth's Docker Engine backend: a runtime.Runtime that
// runs each sandbox as a hardened container with the static sandbox-agent
// injected as its entrypoint.
//
// # Create
//
// Create works with any locally present image — Debian, Alpine, distroless,
// or one with no files at all — because it brings its own PID 1:
//
//  1. ImageInspect: an invalid reference is errdefs.ErrInvalidArgument
//     (field "image"); a missing image is errdefs.ErrNotFound telling the
//     user to run `make images` (no registry is reachable, nothing is pulled).
//  2. The sandbox network is created on first use (see Networking).
//  3. ContainerCreate named ContainerName(lease, token) — a name that says
//     nothing of the lease, at most one container per lease; a second
//     Create for a live lease is errdefs.ErrAlreadyExists —
//     with entrypoint
//     `/.berth/sandbox-agent --listen 0.0.0.0:7000 --envd-listen 0.0.0.0:49983 --workdir WORKDIR [--user USER] [--allow-root=false] --token-file /.berth/token`
//     and no command (the image's entrypoint and command do not run), the
//     image's environment plus Spec.Env and berth's labels. The container
//     runs as root (the agent); USER, the user of the commands, is
//     Spec.User or else the image's user. WORKDIR is the image's
//     WorkingDir, or /workspace (created owned by USER) when it sets none.
//  4. The agent is injected through the engine's archive API, so the engine
//     need not share the orchestrator's filesystem (remote DOCKER_HOST,
//     rootless, VMs). With InjectCopy (the default) each Create copies a tar
//     holding /.berth/sandbox-agent (mode 0755) and /.berth/token (mode
//     0400), both owned by root, streaming the binary from disk. With
//     InjectVolume the agent is copied once per agent version into a named
//     volume mounted read-only at /.berth, and the token is passed in
//     BERTH_AGENT_TOKEN; this saves the per-Create copy.
//  5. ContainerStart, then the agent's GET /healthz is polled at
//     CONTAINER_IP:7000 (2 ms, doubling to 50 ms) until it answers 200; the
//     container state is checked every 50 ms so an agent that cannot start
//     fails Create at once instead of at the ready timeout.
//
// Everything is bounded by Spec.ReadyTimeout (default 30s). On any failure
// the container's last 20 log lines are added to the error and the container
// is force-removed, even when the caller's context is done
// (context.WithoutCancel plus a timeout): a failed Create leaves nothing.
//
// # Hardening defaults, and why
//
//   - no-new-privileges: setuid binaries and file capabilities cannot raise
//     privileges (NoNewPrivs: 1 in /proc/self/status).
//   - CapDrop ALL, CapAdd runtime.Capabilities() (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL,
//     SETGID, SETUID, SETPCAP, NET_BIND_SERVICE): what package managers and
//     build tools need as root in a container. Docker's default set is
//     reduced by NET_RAW (raw sockets, ARP/ICMP spoofing on the bridge),
//     MKNOD, SYS_CHROOT, AUDIT_WRITE and SETFCAP. Never privileged.
//   - Limits: NanoCPUs (default 1 CPU), Memory (default 512 MiB) with
//     MemorySwap = Memory (no swap, so the memory limit is real), PidsLimit
//     (default 512; the kernel counts threads too, and the agent itself uses
//     a few dozen). Spec.Resources override them per sandbox.
//   - No init from Docker (Init false): the agent is PID 1, reaps orphans and
//     forwards SIGTERM itself.
//   - Private IPC and cgroup namespaces, restart policy "no" (a dead sandbox
//     is reported through Watch, not silently restarted).
//   - The engine's default seccomp and AppArmor profiles stay in force.
//
// # Networking
//
// Sandboxes join a dedicated bridge network (Config.Network, default
// "berth"), created on demand with com.docker.network.bridge.enable_icc=false
// and labelled dev.berth.managed=true: the engine drops traffic between
// containers on that bridge, so sandboxes cannot reach each other's agents or
// servers. The agent's port is not published on any host interface; the
// endpoint is CONTAINER_IP:7000 on the bridge, which only the host (the
// orchestrator) can reach. Sandboxes keep outbound access (NAT) but not the
// host's own listeners: with Config.HostInput (default auto) iptables INPUT
// rules (package hostfw, chain BERTH-INPUT) drop what arrives on the
// network's bridge for any host address, except replies to the host's own
// connections. An existing network of that name that allows
// inter-container communication is refused with ErrFailedPrecondition.
//
// # Ownership
//
// Every container carries dev.berth.managed=true and the lease,
// conversation and instance labels; user labels get the dev.berth.label.
// prefix. Get, Stop, Pause and Resume report a container without the managed
// label as not found, and Remove refuses it: berth never touches containers
// it did not create.
//
// # Errors
//
// Engine errors are wrapped with the errdefs category that matches them and
// the ids involved (errors.Is works for both the berth category and the
// engine's); an unreachable engine is errdefs.ErrUnavailable with a hint
// naming DOCKER_HOST.
package docker
