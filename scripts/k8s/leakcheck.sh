#!/usr/bin/env bash
# scripts/k8s/leakcheck.sh: what berth's tests left in the Kubernetes test
# cluster, or what down.sh left of it (run by `make leakcheck` after
# scripts/leakcheck.sh, and by scripts/k8s/test.sh before it takes down a
# cluster it started). Like scripts/leakcheck.sh, run it when no berth
# orchestrator serves sandboxes on the cluster: everything it lists then
# belongs to nobody.
#
#   The cluster runs (its API server is alive):
#     - every Pod, in any namespace (the cluster runs nothing of its own:
#       no DaemonSet, no system Pod; a Pod is a sandbox or a test's);
#     - every Secret and PersistentVolumeClaim labelled dev.berth.managed
#       (a sandbox's token Secret and workspace claim);
#     - every PersistentVolume (the test provisioner deletes a released
#       one);
#     - every task of the node's containerd (a Pod's containers);
#     - the lease records (BerthLeases) and leader Leases of the tests'
#       fleets (e2e-*).
#     The cluster itself, its namespaces, berth's manifests, the
#     NetworkPolicy, the shared token Secret and the leader Lease are not
#     leftovers.
#   It does not run: any trace of it (down.sh removes them all): a process
#     of it, its directories, mounts under them, the pod bridge, its
#     iptables chains, the kubelet's KUBE-* chains, the kubepods cgroups,
#     shims of its containerd, CNI network namespaces, the agent image.
#
#   scripts/k8s/leakcheck.sh [SECONDS]
#
# A released lease's Pod, claim and volume go a moment after the release
# (grace period, finalizers, the provisioner): while the cluster runs and
# something is found, the check is repeated every 2 s for up to SECONDS
# (default 30) before it reports. Exit 0 when nothing is left, 1 otherwise.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
settle=${1:-30}

found=0
leaks=()
leak() { leaks+=("leak: k8s: $*"); found=$((found + 1)); }

components=(etcd kube-apiserver containerd kubelet kube-controller-manager provisioner)
check_cluster() {
	if out=$(kctl --request-timeout 20s get pods --all-namespaces --no-headers \
		-o 'custom-columns=NS:.metadata.namespace,NAME:.metadata.name,PHASE:.status.phase,LEASE:.metadata.labels.dev\.berth\.lease' 2>&1); then
		while read -r ns name phase lease; do
			[[ -n $name ]] && leak "pod $ns/$name ($phase, lease $lease)"
		done <<<"$out"
	else
		leak "cannot list pods: $out"
	fi
	for kind in secrets persistentvolumeclaims; do
		if out=$(kctl --request-timeout 20s get "$kind" --all-namespaces -l dev.berth.managed=true --no-headers \
			-o 'custom-columns=NS:.metadata.namespace,NAME:.metadata.name' 2>&1); then
			while read -r ns name; do
				[[ -n $name ]] && leak "${kind%s} $ns/$name"
			done <<<"$out"
		else
			leak "cannot list $kind: $out"
		fi
	done
	if out=$(kctl --request-timeout 20s get persistentvolumes --no-headers \
		-o 'custom-columns=NAME:.metadata.name,PHASE:.status.phase,CLAIM:.spec.claimRef.name' 2>&1); then
		while read -r name phase claim; do
			[[ -n $name ]] && leak "persistentvolume $name ($phase, claim $claim)"
		done <<<"$out"
	else
		leak "cannot list persistentvolumes: $out"
	fi
	# The tests' fleets (e2e-*): their lease records and leader Leases.
	if out=$(kctl --request-timeout 20s get berthleases --all-namespaces --no-headers \
		-o 'custom-columns=NS:.metadata.namespace,NAME:.metadata.name,FLEET:.metadata.labels.berth\.dev/fleet' 2>&1); then
		while read -r ns name fleet; do
			[[ -n $name && $fleet == e2e-* ]] && leak "berthlease $ns/$name (fleet $fleet)"
		done <<<"$out"
	elif [[ $out != *"the server doesn't have a resource type"* ]]; then
		leak "cannot list berthleases: $out"
	fi
	if out=$(kctl --request-timeout 20s get leases.coordination.k8s.io --all-namespaces --no-headers \
		-o 'custom-columns=NS:.metadata.namespace,NAME:.metadata.name' 2>&1); then
		while read -r ns name; do
			[[ $name == berth-leader-e2e-* ]] && leak "leader lease $ns/$name"
		done <<<"$out"
	else
		leak "cannot list leases: $out"
	fi
	if [[ -S $CTRD_SOCK ]]; then
		while read -r id pid status; do
			[[ -n $id && $id != TASK ]] && leak "node containerd task $id (pid $pid, $status)"
		done < <(ctrd tasks ls 2>/dev/null)
	fi
}
if alive "$K8S_RUN/kube-apiserver.pid" && [[ -f $K8S_DIR/admin.kubeconfig ]]; then
	deadline=$((SECONDS + settle))
	while :; do
		found=0 leaks=()
		check_cluster
		((found == 0 || SECONDS >= deadline)) && break
		sleep 2
	done
else
	for c in "${components[@]}"; do
		alive "$K8S_RUN/$c.pid" && leak "$c runs (pid $(cut -d' ' -f1 "$K8S_RUN/$c.pid")) but the API server does not"
	done
	for d in "$K8S_VAR" "$K8S_RUN"; do
		[[ -e $d ]] && leak "directory $d"
		while read -r m; do
			[[ -n $m ]] && leak "mount $m"
		done < <(awk -v d="$d" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo)
	done
	for f in "$K8S_DIR"/*; do
		[[ -e $f && $f != "$BIN" ]] && leak "file $f"
	done
	ip link show "$POD_BRIDGE" >/dev/null 2>&1 && leak "bridge $POD_BRIDGE"
	if [[ $(id -u) == 0 ]] && command -v iptables >/dev/null; then
		for table in filter nat mangle raw; do
			while read -r c; do
				[[ -n $c ]] && leak "iptables chain $c ($table)"
			done < <(iptables -w 10 -t "$table" -S 2>/dev/null | awk '$1 == "-N" && ($2 ~ /^BERTH-K8S/ || $2 ~ /^KUBE-/) { print $2 }')
		done
		iptables -w 10 -t nat -S POSTROUTING 2>/dev/null | grep -qF -- "-s $POD_CIDR" && leak "iptables nat POSTROUTING rule for $POD_CIDR"
	fi
	for top in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
		[[ -d $top ]] && leak "cgroup $top"
	done
	for p in /proc/[0-9]*; do
		cmd=$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
		[[ $cmd == *containerd-shim* && $cmd == *"$CTRD_SOCK"* ]] && leak "shim ${p#/proc/}: $cmd"
	done
	for ns in /var/run/netns/cni-*; do
		[[ -e $ns ]] && leak "network namespace $ns"
	done
	if command -v docker >/dev/null && docker image inspect berth/k8s-agent:latest >/dev/null 2>&1; then
		leak "docker image berth/k8s-agent:latest"
	fi
fi

((found)) && printf '%s\n' "${leaks[@]}"
if ((found)); then
	echo "k8s leakcheck: $found leftover(s) (see above)"
	exit 1
fi
echo "k8s leakcheck: nothing left behind"
