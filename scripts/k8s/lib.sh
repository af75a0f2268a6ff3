# scripts/k8s/lib.sh: what up.sh and down.sh share (sourced, not run).
#
# The test cluster lives in three places, all of them berth's own:
#   $K8S_DIR (.berth/k8s)      binaries, certificates, tokens, kubeconfig, logs
#   $K8S_VAR (/var/lib/berth-k8s)  etcd data, containerd root, kubelet root,
#                                  CNI config and host-local IPAM state
#   $K8S_RUN (/run/berth-k8s)  containerd state and socket, pid files, and
#                              what down.sh must restore (host.env)
# The kubelet and the CNI plugins also touch shared host paths; up.sh records
# what was there before (host.env) and down.sh puts it back.

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
K8S_DIR=$ROOT/.berth/k8s
K8S_VAR=${BERTH_K8S_VAR:-/var/lib/berth-k8s}
K8S_RUN=${BERTH_K8S_RUN:-/run/berth-k8s}
BIN=$K8S_DIR/bin
PKI=$K8S_DIR/pki
LOGS=$K8S_DIR/logs
KUBECONFIG_FILE=$K8S_DIR/kubeconfig
CTRD_SOCK=$K8S_RUN/containerd.sock

# Addresses: loopback only. The ports are uncommon ones so that a cluster
# already on the machine's usual ports is not disturbed.
ETCD_CLIENT=127.0.0.1:23790
ETCD_PEER=127.0.0.1:23800
APISERVER_PORT=16443
APISERVER=https://127.0.0.1:$APISERVER_PORT
KUBELET_PORT=10250
KUBELET_HEALTHZ=10248
NODE=localhost

# The pod network: a Linux bridge with host-local IPAM. No kube-proxy, no
# cluster DNS: pods are reached by IP.
POD_BRIDGE=berth-k8s0
POD_CIDR=10.214.0.0/24
SERVICE_CIDR=10.215.0.0/24
CNI_NETWORK=berth-k8s
# FW_CHAIN holds the pod network's filter rules (see up.sh: firewall).
FW_CHAIN=BERTH-K8S

# The pause image the CRI plugin starts every pod sandbox from, built
# locally (tools/k8s/pause).
PAUSE_IMAGE=berth.local/k8s-pause:1
NS=k8s.io

PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

log() { printf '==> k8s: %s\n' "$*" >&2; }
die() { printf 'k8s: error: %s\n' "$*" >&2; exit 1; }

# ctrd runs ctr against the cluster's own containerd.
ctrd() { ctr --address "$CTRD_SOCK" --namespace "$NS" "$@"; }

# node_import IMAGE: copy a Docker image into the node's containerd
# (docker save | ctr images import). The import fails now and then with
# "content digest ...: not found" while it unpacks (seen once in CI, on
# containerd 1.6): it is tried three times, each failure logged.
node_import() {
	local image=$1 attempt out
	for attempt in 1 2 3; do
		if out=$(docker save "$image" | ctrd images import - 2>&1 >/dev/null); then
			return 0
		fi
		log "import of $image into the node failed (attempt $attempt of 3): $out"
	done
	die "cannot import $image into the node"
}

# alive PIDFILE: the process recorded in PIDFILE still runs (and is the
# same program: the pid file also records its start time).
alive() {
	local f=$1 pid start
	[[ -f $f ]] || return 1
	read -r pid start <"$f" || return 1
	[[ -n $pid && -d /proc/$pid ]] || return 1
	[[ -z $start || $(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null) == "$start" ]]
}

# record PIDFILE PID: write PID and its start time.
record() { echo "$2 $(awk '{print $22}' "/proc/$2/stat")" >"$1"; }

# stop_pid PIDFILE NAME [SECONDS]: SIGTERM the recorded process, SIGKILL it
# after SECONDS (default 15), remove the pid file.
stop_pid() {
	local f=$1 name=$2 secs=${3:-15} pid i
	if alive "$f"; then
		read -r pid _ <"$f"
		log "stopping $name (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < secs * 10; i++)); do
			[[ -d /proc/$pid ]] || break
			sleep 0.1
		done
		if [[ -d /proc/$pid ]]; then
			log "$name did not stop within ${secs}s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.2
		fi
	fi
	rm -f "$f"
}

# kctl runs the built kubectl as the cluster admin.
kctl() { "$BIN/kubectl" --kubeconfig "$K8S_DIR/admin.kubeconfig" "$@"; }
