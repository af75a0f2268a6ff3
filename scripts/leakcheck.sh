#!/usr/bin/env bash
# scripts/leakcheck.sh: list what berth's tests (or a crashed orchestrator)
# left behind on this host, and exit 1 if anything is found. Run by
# `make leakcheck`, and by CI after `make test`.
#
# Run it when no berth orchestrator is serving sandboxes on this host (after
# the tests, or with `make run` stopped and its leases released): everything
# it lists then belongs to nobody. What counts as left behind:
#
#   Docker
#     - every container labelled dev.berth.managed, in any state (sandboxes,
#       agent-volume helpers);
#     - every volume labelled dev.berth.managed, except the agent volume of
#       ./bin/sandbox-agent (the one `make run` serves sandboxes from, named
#       berth-agent-<sha256 prefix>, reused by the next `make run`): among
#       them the persistent workspace volumes (berth-ws-*, label
#       dev.berth.volume=workspace), which outlive leases on purpose — a
#       developer's own are listed too; `orchestrator volume rm` removes them;
#     - every image labelled dev.berth.managed (snapshots) or
#       dev.berth.image.name other than berth/base, berth/minimal, berth/e2b and
#       berth/dev (what make images builds);
#     - every network labelled dev.berth.managed except the one named
#       "berth" (the sandbox network `make run` creates once and reuses),
#       and every network named berth-test-* (tests' own, unlabelled).
#   containerd, on each socket that exists of /run/containerd/containerd.sock
#   and /var/run/docker/containerd/containerd.sock ($BERTH_CONTAINERD_ADDRESS
#   too), in every namespace whose name contains "berth"
#     - every container and every task;
#     - every snapshot that is not a committed image layer (active and view
#       snapshots: a container's writable layer). Images are not leaks: they
#       are the imported cache.
#     - every berth snapshot image (label dev.berth.snapshot: made by
#       `orchestrator lease snapshot`; a serving orchestrator's are kept on
#       purpose, so run this with none serving).
#   Host
#     - network namespaces named berth-* (`ip netns list`);
#     - links attached to a bridge named berth-ctrd* (sandbox veths);
#     - host-local IP allocations in /var/lib/cni/networks/berth-ctrd*;
#     - per-sandbox directories in /var/lib/berth/containerd/sandboxes;
#     - containerd workspace volumes: directories in
#       /var/lib/berth/containerd/volumes (see docs/workspaces.md);
#     - egress policy rules (docs/network-policy.md): per-sandbox iptables
#       chains BERTH-E-* and BERTH-EI-*, and rules whose comment starts with
#       "berth-egress" (filter and nat); the shared chains BERTH-EGRESS,
#       BERTH-EGRESS-IN, BERTH-EGRESS-REJECT and BERTH-EGRESS-DNS stay, like
#       BERTH-INPUT;
#     - the egress tests' veths (begt*).
#
# Usage: scripts/leakcheck.sh   (prints each leftover on a line; exit 0 when
# nothing is left, 1 otherwise, 2 when a check itself could not run)
set -uo pipefail
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
found=0
broken=0
leak() { printf 'leak: %s\n' "$*"; found=$((found + 1)); }
warn() { printf 'leakcheck: cannot check %s\n' "$*" >&2; broken=1; }

# --- Docker ------------------------------------------------------------------
if command -v docker >/dev/null 2>&1 && docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
	if out=$(docker ps -a --filter label=dev.berth.managed \
		--format '{{.ID}} {{.Names}} {{.State}} image={{.Image}} lease={{.Label "dev.berth.lease"}} instance={{.Label "dev.berth.instance"}}'); then
		while read -r line; do [[ -n $line ]] && leak "docker container $line"; done <<<"$out"
	else
		warn "Docker containers"
	fi

	keep_volume=""
	if [[ -f $repo/bin/sandbox-agent ]]; then
		sum=$(sha256sum "$repo/bin/sandbox-agent" | cut -d' ' -f1)
		keep_volume=berth-agent-${sum:0:16}
	fi
	if out=$(docker volume ls -q --filter label=dev.berth.managed); then
		while read -r v; do
			[[ -n $v && $v != "$keep_volume" ]] || continue
			# Which instance and lease it came from tells the test that left it.
			leak "docker volume $v $(docker volume inspect --format 'created={{.CreatedAt}} instance={{index .Labels "dev.berth.instance"}} lease={{index .Labels "dev.berth.lease"}} conversation={{index .Labels "dev.berth.conversation"}}' "$v" 2>/dev/null)"
		done <<<"$out"
	else
		warn "Docker volumes"
	fi

	# Images: snapshots (dev.berth.managed, dev.berth.snapshot) and any
	# other image labelled by berth except the ones make images builds.
	if out=$( (docker images --no-trunc --filter label=dev.berth.managed --format '{{.Repository}}:{{.Tag}} {{.ID}}'
		docker images --no-trunc --filter label=dev.berth.image.name --format '{{.Repository}}:{{.Tag}} {{.ID}}') | sort -u); then
		while read -r ref id; do
			[[ -n $ref ]] || continue
			case ${ref%%:*} in berth/base | berth/minimal | berth/e2b | berth/dev) continue ;; esac
			leak "docker image $ref ($id)"
		done <<<"$out"
	else
		warn "Docker images"
	fi

	if out=$(docker network ls --format '{{.ID}} {{.Name}} managed={{.Label "dev.berth.managed"}}'); then
		while read -r id name managed; do
			[[ -n $id ]] || continue
			if [[ $name == berth-test-* ]] || [[ $managed == managed=true && $name != berth ]]; then
				leak "docker network $name ($id)"
			fi
		done <<<"$out"
	else
		warn "Docker networks"
	fi
else
	echo "leakcheck: no Docker Engine reachable; Docker not checked" >&2
fi

# --- containerd --------------------------------------------------------------
sockets=(/run/containerd/containerd.sock /var/run/docker/containerd/containerd.sock)
[[ -n ${BERTH_CONTAINERD_ADDRESS:-} ]] && sockets+=("${BERTH_CONTAINERD_ADDRESS#unix://}")
seen=" "
for sock in "${sockets[@]}"; do
	[[ -S $sock ]] || continue
	real=$(readlink -f "$sock")
	[[ $seen == *" $real "* ]] && continue
	seen+="$real "
	if ! command -v ctr >/dev/null 2>&1; then
		warn "containerd at $sock: ctr not found (make deps)"
		continue
	fi
	ctr=(ctr --address "$sock" --connect-timeout 5s)
	if ! nss=$("${ctr[@]}" namespaces ls -q 2>&1); then
		warn "containerd at $sock: $nss"
		continue
	fi
	for ns in $nss; do
		[[ $ns == *berth* ]] || continue
		where="containerd $sock namespace $ns"
		if out=$("${ctr[@]}" -n "$ns" tasks ls 2>&1); then
			while read -r id pid status; do
				[[ -n $id && $id != TASK ]] && leak "$where task $id (pid $pid, $status)"
			done <<<"$out"
		else
			warn "$where tasks: $out"
		fi
		if out=$("${ctr[@]}" -n "$ns" containers ls 2>&1); then
			while read -r id image runtime; do
				[[ -n $id && $id != CONTAINER ]] && leak "$where container $id (image $image)"
			done <<<"$out"
		else
			warn "$where containers: $out"
		fi
		if out=$("${ctr[@]}" -n "$ns" images ls -q 'labels."dev.berth.snapshot"' 2>&1); then
			while read -r ref; do
				[[ -n $ref ]] && leak "$where snapshot image $ref"
			done <<<"$out"
		else
			warn "$where images: $out"
		fi
		if out=$("${ctr[@]}" -n "$ns" snapshots --snapshotter overlayfs ls 2>&1); then
			# KEY [PARENT] KIND: a base layer has no parent, so KIND is the
			# last field.
			while read -r key rest; do
				kind=${rest##* }
				[[ -n $key && $key != KEY && $kind != Committed ]] && leak "$where snapshot $key ($kind)"
			done <<<"$out"
		else
			warn "$where snapshots: $out"
		fi
	done
done

# --- host --------------------------------------------------------------------
if command -v ip >/dev/null 2>&1; then
	while read -r ns _; do
		[[ $ns == berth* ]] && leak "network namespace $ns"
	done < <(ip netns list 2>/dev/null)
	for br in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
		[[ $br == berth-ctrd* ]] || continue
		while read -r link; do
			[[ -n $link ]] && leak "link $link on bridge $br"
		done < <(ip -o link show master "$br" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1)
	done
else
	warn "network namespaces and veths: ip not found (make deps)"
fi
for d in /var/lib/cni/networks/berth-ctrd*; do
	[[ -d $d ]] || continue
	for f in "$d"/*; do
		b=${f##*/}
		[[ -f $f && $b != last_reserved_ip.* && $b != lock ]] || continue
		leak "IP allocation $f ($(head -n1 "$f" 2>/dev/null))"
	done
done
for d in /var/lib/berth/containerd/sandboxes/*; do
	[[ -e $d ]] && leak "sandbox directory $d"
done
for d in /var/lib/berth/containerd/volumes/*; do
	[[ -e $d ]] && leak "containerd workspace volume $d"
done
if command -v ip >/dev/null 2>&1; then
	while read -r link; do
		[[ $link == begt* ]] && leak "egress test link $link"
	done < <(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1)
fi
if command -v iptables >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
	for table in filter nat; do
		if ! out=$(iptables -w 10 -t "$table" -S 2>/dev/null); then
			warn "iptables $table table"
			continue
		fi
		while read -r line; do
			case $line in
			"-N BERTH-E-"* | "-N BERTH-EI-"*) leak "egress chain ${line#-N } ($table)" ;;
			*"--comment \"berth-egress "* | *"--comment berth-egress "*) leak "egress rule ($table): $line" ;;
			esac
		done <<<"$out"
	done
else
	echo "leakcheck: not root or no iptables; egress rules not checked" >&2
fi

if ((found)); then
	echo "leakcheck: $found leftover(s) (see above)"
	exit 1
fi
if ((broken)); then
	echo "leakcheck: nothing found, but some checks could not run (see above)"
	exit 2
fi
echo "leakcheck: nothing left behind"
