#!/usr/bin/env bash
# scripts/k8s/down.sh: stop the test cluster that scripts/k8s/up.sh started
# and remove every trace of it (`make k8s-down`), leaving the Docker Engine
# as it was:
#   - every pod is deleted while the kubelet still runs, so that the CRI
#     tears their sandboxes down (network namespaces, veths, CNI state);
#     what is left is killed through the cluster's containerd;
#   - the processes up.sh started (by the pids it recorded) and the
#     containerd shims of that containerd (found by its socket address);
#   - the mounts under the cluster's directories (the kubelet bind-mounts
#     its root dir; token volumes, rootfs and shm mounts), the pod bridge,
#     the network namespaces its containerd created;
#   - the iptables rules up.sh added and the KUBE-* chains the kubelet made;
#   - the sysctls the kubelet set, /var/log/containers and /var/log/pods,
#     the kubepods cgroups, the CNI cache entries of its network and the
#     shim sockets under /run/containerd/s, as far as up.sh found them absent;
#   - the cluster's directories: /var/lib/berth-k8s, /run/berth-k8s and,
#     except for the built binaries (.berth/k8s/bin, kept so that the next
#     up is fast), .berth/k8s.
# Safe to run when nothing runs, and twice.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

[[ $(id -u) == 0 ]] || die "needs root"
host_env=$K8S_RUN/host.env
[[ -f $host_env ]] && source "$host_env"

# ---- pods, while the kubelet can still tear them down ---------------------
if alive "$K8S_RUN/kubelet.pid" && alive "$K8S_RUN/kube-apiserver.pid" && [[ -f $K8S_DIR/admin.kubeconfig ]]; then
	log "deleting every pod"
	kctl delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1 || true
	for ((i = 0; i < 600; i++)); do
		n=$(kctl get pods --all-namespaces --no-headers 2>/dev/null | wc -l)
		running=$(ctrd tasks ls -q 2>/dev/null | wc -l)
		((n == 0 && running == 0)) && break
		sleep 0.1
	done
	((n == 0 && running == 0)) || log "after 60 s: $n pods, $running tasks still there; removing them by force"
fi
stop_pid "$K8S_RUN/kubelet.pid" kubelet 30
stop_pid "$K8S_RUN/provisioner.pid" provisioner 10
stop_pid "$K8S_RUN/kube-controller-manager.pid" kube-controller-manager 10

# ---- what is left in the cluster's containerd -------------------------------
netns_of_ours=()
if alive "$K8S_RUN/containerd.pid"; then
	for id in $(ctrd tasks ls -q 2>/dev/null); do
		ctrd tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
	done
	sleep 0.5
	for id in $(ctrd tasks ls -q 2>/dev/null); do
		ctrd tasks delete -f "$id" >/dev/null 2>&1 || true
	done
	for id in $(ctrd containers ls -q 2>/dev/null); do
		ctrd containers delete "$id" >/dev/null 2>&1 || true
	done
fi
# The network namespaces the CRI plugin made (/var/run/netns/cni-UUID) are
# named in its metadata; a pod the kubelet stopped took its own away.
meta=$K8S_VAR/containerd/io.containerd.metadata.v1.bolt/meta.db
if [[ -f $meta ]]; then
	mapfile -t netns_of_ours < <(grep -aoE '/var/run/netns/cni-[0-9a-f-]{36}' "$meta" | sort -u)
fi
stop_pid "$K8S_RUN/containerd.pid" containerd 15
# Shims outlive containerd: end those of this containerd (their command
# line names its socket), by pid.
for p in /proc/[0-9]*; do
	cmd=$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
	if [[ $cmd == *containerd-shim* && $cmd == *"$CTRD_SOCK"* ]]; then
		log "killing shim ${p#/proc/}"
		kill -KILL "${p#/proc/}" 2>/dev/null || true
	fi
done

# ---- control plane ------------------------------------------------------------
stop_pid "$K8S_RUN/kube-apiserver.pid" kube-apiserver 15
stop_pid "$K8S_RUN/etcd.pid" etcd 15

# ---- mounts and network namespaces --------------------------------------------
for ns in "${netns_of_ours[@]}"; do
	[[ -e $ns ]] || continue
	log "removing network namespace $ns"
	umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
	rm -f "$ns"
done
unmount_under() { # every mount point under $1, deepest first
	local dir=$1 m
	for m in $(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
	done
}
for d in "$K8S_VAR" "$K8S_RUN"; do
	unmount_under "$d"
	unmount_under "$d" # a bind mount can be stacked on itself
done
if ip link show "$POD_BRIDGE" >/dev/null 2>&1; then
	log "removing bridge $POD_BRIDGE"
	ip link delete "$POD_BRIDGE" || true
fi

# ---- iptables -----------------------------------------------------------------
ipt() { iptables -w 10 "$@"; }
while ipt -D FORWARD -j "$FW_CHAIN" 2>/dev/null; do :; done
while ipt -D DOCKER-USER -j "$FW_CHAIN" 2>/dev/null; do :; done
while ipt -D INPUT -j "$FW_CHAIN-INPUT" 2>/dev/null; do :; done
for c in "$FW_CHAIN" "$FW_CHAIN-INPUT"; do
	ipt -F "$c" 2>/dev/null && ipt -X "$c" 2>/dev/null
done
while ipt -t nat -D POSTROUTING -s "$POD_CIDR" ! -o "$POD_BRIDGE" -j MASQUERADE 2>/dev/null; do :; done
# The kubelet's own chains (KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT,
# KUBE-FIREWALL...) in every table, IPv4 and IPv6, with the rules that jump
# to them. There is no kube-proxy: every KUBE-* chain on this host is the
# kubelet's.
for cmd in iptables ip6tables; do
	command -v "$cmd" >/dev/null || continue
	for table in filter nat mangle raw; do
		rules=$("$cmd" -w 10 -t "$table" -S 2>/dev/null) || continue
		grep -E '^-A [^ ]+ .*-j KUBE-' <<<"$rules" | grep -v '^-A KUBE-' | while read -r -a rule; do
			rule[0]=-D
			"$cmd" -w 10 -t "$table" "${rule[@]}" 2>/dev/null || true
		done
		for c in $(grep -oE '^-N KUBE-[^ ]+' <<<"$rules" | cut -d' ' -f2); do
			"$cmd" -w 10 -t "$table" -F "$c" 2>/dev/null || true
		done
		for c in $(grep -oE '^-N KUBE-[^ ]+' <<<"$rules" | cut -d' ' -f2); do
			"$cmd" -w 10 -t "$table" -X "$c" 2>/dev/null || true
		done
	done
done

# ---- what the kubelet changed on the host ---------------------------------------
for kv in vm.overcommit_memory kernel.panic kernel.panic_on_oops; do
	var=SYSCTL_${kv//./_}
	if [[ -n ${!var:-} && $(sysctl -n "$kv") != "${!var}" ]]; then
		log "sysctl $kv=${!var}"
		sysctl -qw "$kv=${!var}" || true
	fi
done
existed() { local v=EXISTED_${1//\//_}; [[ ${!v:-1} == 1 ]]; }
if [[ -f $host_env ]]; then
	for d in /var/log/containers /var/log/pods; do
		existed "$d" || rm -rf "$d"
	done
	# The CNI cache: libcni's results for this network. Other users of
	# CNI on the host (berth's containerd backend) keep theirs: only empty
	# directories up.sh did not find are removed.
	rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null
	existed /var/lib/cni || { rmdir /var/lib/cni/results /var/lib/cni/networks 2>/dev/null; rmdir /var/lib/cni 2>/dev/null; }
	# up.sh made /var/run/netns a shared mount point: undo it when nothing
	# (another cluster's or `ip netns`' namespaces) is mounted in it.
	if [[ -n ${NETNS_BOUND:-} ]] && mountpoint -q "$NETNS_BOUND" &&
		! awk -v d="$NETNS_BOUND/" 'index($5, d) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
		umount "$NETNS_BOUND" 2>/dev/null || log "cannot unmount $NETNS_BOUND"
	fi
	existed /var/run/netns || rmdir /var/run/netns 2>/dev/null
	# Shim sockets that were not there before and that nothing listens on.
	if [[ -d /run/containerd/s ]]; then
		listening=$(awk 'NR > 1 { print $8 }' /proc/net/unix | sort -u)
		for s in /run/containerd/s/*; do
			[[ -e $s ]] || continue
			grep -qxF "$(basename "$s")" "$K8S_RUN/shim-sockets.before" 2>/dev/null && continue
			grep -qxF "@$s" <<<"$listening" && continue
			grep -qxF "$s" <<<"$listening" && continue
			rm -f "$s"
		done
		existed /run/containerd/s || rmdir /run/containerd/s 2>/dev/null
		existed /run/containerd || rmdir /run/containerd 2>/dev/null
	fi
fi
# kubepods cgroups (cgroupfs driver), deepest first, in every hierarchy.
for top in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
	[[ -d $top ]] || continue
	find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null
	[[ -d $top ]] && log "cannot remove cgroup $top (processes left in it?)"
done

# The agent image agent-image.sh left in Docker (rebuilt by every up).
docker image inspect berth/k8s-agent:latest >/dev/null 2>&1 && docker rmi berth/k8s-agent:latest >/dev/null

# ---- the cluster's directories ---------------------------------------------------
rm -rf "$K8S_VAR" "$K8S_RUN"
# -H: .berth/k8s may be a symlink (a worktree sharing the main checkout's
# binaries), whose contents go too.
find -H "$K8S_DIR" -mindepth 1 -maxdepth 1 ! -name bin -exec rm -rf {} + 2>/dev/null
log "down: nothing of the test cluster is left (binaries kept in $BIN)"
