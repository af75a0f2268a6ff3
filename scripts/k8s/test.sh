#!/usr/bin/env bash
# scripts/k8s/test.sh: run a command with the Kubernetes test cluster up and
# BERTH_K8S=1 in its environment (`make test`, `make bench`).
#
#   scripts/k8s/test.sh CMD [ARG...]
#
#   - The cluster runs already (any of its processes is alive: a developer's
#     `make k8s-up`, or another run's): it is reused and left running, with
#     this tree's deploy/kubernetes applied to it (up.sh does that too). When
#     it is not healthy (node not Ready, or the orchestrator's 24-hour token
#     refused) up.sh is run first: it starts only what is missing and
#     renews the token.
#   - It does not run: up.sh builds (cached in .berth/k8s/bin) and starts it
#     BEFORE the command (a cold build is not run beside the test binaries),
#     and down.sh removes every trace of it when the command ends, whether
#     it passed, failed or was interrupted. Before down.sh, what the tests
#     left in the cluster is listed (scripts/k8s/leakcheck.sh): a leftover
#     fails a run whose command passed, as `make leakcheck` would (after
#     down.sh nothing of it could be seen).
#   - BERTH_K8S=0 in the environment: the command runs without the cluster
#     (the Kubernetes tests skip: the run's own choice).
#   - Not root, and no cluster running: the command runs without
#     BERTH_K8S (the Kubernetes tests skip, or fail under
#     BERTH_REQUIRE_DOCKER=1).
#
# The exit status is the command's (1 when it passed but left something in
# a cluster this script started; up.sh's when the cluster cannot start).
set -uo pipefail
[[ $# -gt 0 ]] || { echo "usage: $0 CMD [ARG...]" >&2; exit 2; }
here=$PWD
source "$(dirname "$0")/lib.sh" # cd's to the repository

components=(etcd kube-apiserver containerd kubelet kube-controller-manager provisioner)
any_alive() {
	local c
	for c in "${components[@]}"; do
		alive "$K8S_RUN/$c.pid" && return 0
	done
	return 1
}
healthy() {
	local c
	for c in "${components[@]}"; do
		alive "$K8S_RUN/$c.pid" || return 1
	done
	[[ -f $K8S_DIR/admin.kubeconfig && -f $K8S_DIR/berth.kubeconfig ]] || return 1
	[[ $(kctl --request-timeout 10s get node "$NODE" \
		-o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]] || return 1
	# The orchestrator's token (24 h): the tests run with it.
	"$BIN/kubectl" --kubeconfig "$K8S_DIR/berth.kubeconfig" --request-timeout 10s \
		get pods -o name >/dev/null 2>&1
}

run() { # the command, in the caller's directory; its status
	(cd "$here" && "$@")
}

if [[ ${BERTH_K8S:-} == 0 ]]; then
	log "BERTH_K8S=0: running without the test cluster"
	run "$@"
	exit $?
fi

if any_alive; then
	if healthy; then
		log "reusing the running test cluster (left running)"
		# The manifests of this tree (its Role, ServiceAccounts): the
		# cluster may have been started from another one.
		kctl apply -f deploy/kubernetes/ >/dev/null || exit $?
	else
		log "the running test cluster is not healthy: scripts/k8s/up.sh (it starts what is missing; left running)"
		scripts/k8s/up.sh || exit $?
	fi
	BERTH_K8S=1 run "$@"
	exit $?
fi

if [[ $(id -u) != 0 ]]; then
	log "no test cluster running and not root (up.sh needs root): running without it"
	run "$@"
	exit $?
fi

# Ours: up, run, list leftovers, down, even on failure or interrupt.
rc=0
down() {
	trap - EXIT INT TERM
	if alive "$K8S_RUN/kube-apiserver.pid"; then
		if ! scripts/k8s/leakcheck.sh 90; then
			log "the tests left the objects above in the cluster"
			((rc == 0)) && rc=1
		fi
	fi
	log "taking down the test cluster this run started"
	scripts/k8s/down.sh || log "down.sh failed (exit $?): see above"
	exit "$rc"
}
trap down EXIT
trap 'rc=130; exit 130' INT
trap 'rc=143; exit 143' TERM
log "no test cluster running: starting one (scripts/k8s/up.sh), taken down after the run"
t0=$(date +%s)
scripts/k8s/up.sh || { rc=$?; log "up.sh failed (exit $rc)"; exit "$rc"; }
log "test cluster up in $(($(date +%s) - t0)) s"
BERTH_K8S=1 run "$@"
rc=$?
exit "$rc"
