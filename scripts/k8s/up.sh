#!/usr/bin/env bash
# scripts/k8s/up.sh: build and start a real single-node Kubernetes cluster on
# this machine for berth's Kubernetes backend and its tests (`make k8s-up`).
# scripts/k8s/down.sh (`make k8s-down`) removes every trace of it.
#
#   scripts/k8s/up.sh
#
# What runs, all on loopback, each process recorded by pid in $K8S_RUN:
#   etcd            127.0.0.1:23790
#   kube-apiserver  https://127.0.0.1:16443, --authorization-mode=Node,RBAC,
#                   self-made certificates and a static token file
#   containerd      Debian's binary with its own root, state and socket
#                   ($K8S_RUN/containerd.sock) and the CRI plugin
#   kubelet         node "localhost", its static token as system:node:localhost
#                   in system:nodes, cgroupfs, that containerd
#   kube-controller-manager  only the PersistentVolume binder and the
#                   PV/PVC protection controllers
#   provisioner     tools/k8s/provisioner: StorageClass berth-local (the
#                   default class), one hostPath volume (a mode-0777
#                   directory under $K8S_VAR/volumes) per claim
# No scheduler, kube-proxy or DNS, no other controllers: pods name their node
# (spec.nodeName) and are reached by IP on the pod bridge berth-k8s0
# (10.214.0.0/24). up.sh creates what the missing controllers would: the
# `default` ServiceAccount and the kube-root-ca.crt ConfigMap of the
# namespaces it uses. It applies berth's manifests (deploy/kubernetes) and
# writes two kubeconfigs:
#   .berth/k8s/kubeconfig        the cluster admin (system:masters)
#   .berth/k8s/berth.kubeconfig  the orchestrator's ServiceAccount berth/berth
#                                (a 24 h token; the Role of deploy/kubernetes)
# (The sandbox Pods run as berth/berth-sandbox, which has no rights.)
# Idempotent: a second run only starts what is not running.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

[[ $(id -u) == 0 ]] || die "needs root (it starts containerd and the kubelet)"
for tool in openssl iptables ip ctr containerd runc docker; do
	command -v "$tool" >/dev/null || die "$tool not found (run scripts/deps.sh)"
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || die "CNI plugins not found in /usr/lib/cni (run scripts/deps.sh)"
[[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || die "no cgroup filesystem at /sys/fs/cgroup"

began=$(date +%s.%N)
mkdir -p "$K8S_DIR" "$PKI" "$LOGS" "$K8S_VAR" "$K8S_RUN"
chmod 700 "$PKI"

# ---- what the host had before (down.sh restores it) --------------------
if [[ ! -f $K8S_RUN/host.env ]]; then
	{
		echo "SYSCTL_vm_overcommit_memory=$(sysctl -n vm.overcommit_memory)"
		echo "SYSCTL_kernel_panic=$(sysctl -n kernel.panic)"
		echo "SYSCTL_kernel_panic_on_oops=$(sysctl -n kernel.panic_on_oops)"
		for d in /var/log/containers /var/log/pods /var/lib/cni /var/run/netns /run/containerd/s /run/containerd; do
			echo "EXISTED_$(echo "$d" | tr '/' '_')=$([[ -e $d ]] && echo 1 || echo 0)"
		done
	} >"$K8S_RUN/host.env"
	ls -1 /run/containerd/s 2>/dev/null >"$K8S_RUN/shim-sockets.before" || true
fi

# ---- /var/run/netns: a shared mount point before any pod's netns ----------
# The CRI plugin bind-mounts each pod's network namespace at
# /var/run/netns/cni-UUID. `ip netns add`, and berth's containerd backend
# (make test runs its tests beside these), make that directory a mount
# point by binding it onto itself the first time: a netns mounted before
# is then hidden under the new mount, and the CRI can neither unmount nor
# unlink it ("remove netns: unlinkat ...: device or resource busy"): the
# kubelet cannot report or stop that pod ever after. So the directory is
# made a shared mount point here, before containerd starts; then nobody
# binds it again. down.sh unmounts it if this made it and nothing is
# mounted in it any more.
netns_dir=$(realpath -m /var/run/netns)
mkdir -p "$netns_dir"
if mountpoint -q "$netns_dir"; then
	mount --make-rshared "$netns_dir"
elif awk -v d="$netns_dir/" 'index($5, d) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
	log "warning: $netns_dir holds network namespaces but is no mount point: not binding it (that would hide them); pods created before this may not stop after an \`ip netns add\`"
else
	mount --rbind "$netns_dir" "$netns_dir"
	mount --make-rshared "$netns_dir"
	grep -q '^NETNS_BOUND=' "$K8S_RUN/host.env" || echo "NETNS_BOUND=$netns_dir" >>"$K8S_RUN/host.env"
fi

# ---- binaries ----------------------------------------------------------
t0=$(date +%s)
scripts/k8s/build.sh
log "build: $(($(date +%s) - t0)) s"

# ---- certificates and tokens ---------------------------------------------
cert() { # cert NAME SUBJECT [SAN] [serverAuth|clientAuth|both]
	local name=$1 subj=$2 san=${3:-} usage=${4:-clientAuth}
	[[ -f $PKI/$name.crt ]] && return
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
	openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		case $usage in
		serverAuth) echo "extendedKeyUsage=serverAuth" ;;
		both) echo "extendedKeyUsage=serverAuth,clientAuth" ;;
		*) echo "extendedKeyUsage=clientAuth" ;;
		esac
		[[ -n $san ]] && echo "subjectAltName=$san"
	} >"$PKI/$name.ext"
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 365 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}
if [[ ! -f $PKI/ca.crt ]]; then
	log "certificates and tokens in $PKI"
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=berth-k8s-ca" -days 365 -sha256 -out "$PKI/ca.crt" 2>/dev/null
fi
svc_ip=${SERVICE_CIDR%0/*}1
cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,IP:$svc_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" serverAuth
# The apiserver's client certificate towards the kubelet (logs, exec,
# port-forward); the kubelet asks the apiserver (webhook) what it may do.
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "" clientAuth
cert kubelet "/O=system:nodes/CN=system:node:$NODE" "DNS:$NODE,IP:127.0.0.1" serverAuth
[[ -f $PKI/sa.key ]] || {
	openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
	openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}
if [[ ! -f $PKI/tokens.csv ]]; then
	admin_token=$(openssl rand -hex 24)
	kubelet_token=$(openssl rand -hex 24)
	{
		echo "$admin_token,berth-k8s-admin,berth-k8s-admin,\"system:masters\""
		echo "$kubelet_token,system:node:$NODE,system:node:$NODE,\"system:nodes\""
	} >"$PKI/tokens.csv"
	chmod 600 "$PKI/tokens.csv"
fi
admin_token=$(awk -F, '$2 == "berth-k8s-admin" { print $1 }' "$PKI/tokens.csv")
kubelet_token=$(awk -F, -v u="system:node:$NODE" '$2 == u { print $1 }' "$PKI/tokens.csv")

kubeconfig() { # kubeconfig FILE USER TOKEN
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: berth-k8s
  cluster:
    server: $APISERVER
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    token: $3
contexts:
- name: berth-k8s
  context: {cluster: berth-k8s, user: $2}
current-context: berth-k8s
EOF
	chmod 600 "$1"
}
kubeconfig "$K8S_DIR/admin.kubeconfig" berth-k8s-admin "$admin_token"
kubeconfig "$K8S_DIR/kubelet.kubeconfig" "system:node:$NODE" "$kubelet_token"

# start NAME LOG CMD...: start CMD detached (its own session, so that make
# and the shell can end) unless NAME runs already; record its pid.
start() {
	local name=$1 logf=$2
	shift 2
	if alive "$K8S_RUN/$name.pid"; then
		log "$name runs already"
		return
	fi
	log "starting $name"
	setsid "$@" </dev/null >>"$logf" 2>&1 &
	record "$K8S_RUN/$name.pid" $!
}
# wait_for WHAT SECONDS PIDNAME CMD...: poll CMD until it succeeds; fail
# (with the log's tail) when the process dies or time runs out.
wait_for() {
	local what=$1 secs=$2 name=$3 i
	shift 3
	for ((i = 0; i < secs * 10; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		if ! alive "$K8S_RUN/$name.pid"; then
			tail -n 30 "$LOGS/$name.log" >&2 || true
			die "$name exited while waiting for $what (log: $LOGS/$name.log)"
		fi
		sleep 0.1
	done
	tail -n 30 "$LOGS/$name.log" >&2 || true
	die "$what not ready within ${secs}s (log: $LOGS/$name.log)"
}

# ---- etcd ----------------------------------------------------------------
t_start=$(date +%s.%N)
start etcd "$LOGS/etcd.log" "$BIN/etcd" --name berth-k8s --data-dir "$K8S_VAR/etcd" \
	--listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
	--listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
	--initial-cluster "berth-k8s=http://$ETCD_PEER" --listen-metrics-urls "" \
	--quota-backend-bytes $((512 << 20)) --log-level warn
wait_for etcd 30 etcd curl -fsS "http://$ETCD_CLIENT/health"

# ---- kube-apiserver -------------------------------------------------------
start kube-apiserver "$LOGS/kube-apiserver.log" "$BIN/kube-apiserver" \
	--etcd-servers "http://$ETCD_CLIENT" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
	--client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
	--anonymous-auth=false --allow-privileged=false --profiling=false \
	--service-account-issuer https://kubernetes.default.svc \
	--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
	--service-cluster-ip-range "$SERVICE_CIDR" --endpoint-reconciler-type none \
	--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
	--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority "$PKI/ca.crt" \
	--kubelet-preferred-address-types Hostname \
	--v 1
wait_for kube-apiserver 90 kube-apiserver kctl get --raw /readyz

# ---- containerd -----------------------------------------------------------
mkdir -p "$K8S_VAR/cni/net.d" "$K8S_VAR/cni/networks"
cat >"$K8S_VAR/cni/net.d/10-$CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$K8S_VAR/cni/networks"
      }
    }
  ]
}
EOF
cat >"$K8S_DIR/containerd.toml" <<EOF
# The test cluster's own containerd (scripts/k8s/up.sh); Docker's is not touched.
version = 2
root = "$K8S_VAR/containerd"
state = "$K8S_RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$CTRD_SOCK"

[ttrpc]
  address = "$CTRD_SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$K8S_VAR/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # The session may lack CAP_SYS_RESOURCE: without this runc fails to lower
  # /proc/self/oom_score_adj ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$K8S_VAR/cni/net.d"
    max_conf_num = 1
EOF
start containerd "$LOGS/containerd.log" containerd --config "$K8S_DIR/containerd.toml"
wait_for containerd 30 containerd ctr --address "$CTRD_SOCK" version

# ---- the pause image --------------------------------------------------------
if ! ctrd images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q "$PAUSE_IMAGE"; then
	log "importing $PAUSE_IMAGE"
	tmp=$(mktemp -d)
	cp "$BIN/pause" "$tmp/pause"
	tar -C "$tmp" -c pause | docker import -c 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
	rm -rf "$tmp"
	node_import "$PAUSE_IMAGE"
	docker rmi "$PAUSE_IMAGE" >/dev/null
fi

# ---- the pod network's firewall --------------------------------------------
# Docker sets FORWARD's policy to DROP: pods reach the outside world only
# through the ACCEPT at the end of FW_CHAIN. The rest is what berth's
# NetworkPolicy objects say, enforced here because the bridge plugin
# enforces no NetworkPolicy: pods cannot reach each other, nothing outside
# the host can reach a pod, pods cannot reach Docker's bridges nor the host
# itself (INPUT) except with replies to the host's own connections. The
# host (the orchestrator, the kubelet's probes) reaches pods directly.
ipt() { iptables -w 10 "$@"; }
ipt -N "$FW_CHAIN" 2>/dev/null || ipt -F "$FW_CHAIN"
ipt -A "$FW_CHAIN" -i "$POD_BRIDGE" -o "$POD_BRIDGE" -j DROP
ipt -A "$FW_CHAIN" -o "$POD_BRIDGE" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A "$FW_CHAIN" -o "$POD_BRIDGE" -j DROP
ipt -A "$FW_CHAIN" -i "$POD_BRIDGE" -o docker0 -j DROP
ipt -A "$FW_CHAIN" -i "$POD_BRIDGE" -o br-+ -j DROP
ipt -A "$FW_CHAIN" -i "$POD_BRIDGE" -o berth-+ -j DROP
ipt -A "$FW_CHAIN" -i "$POD_BRIDGE" -j ACCEPT
ipt -N "$FW_CHAIN-INPUT" 2>/dev/null || ipt -F "$FW_CHAIN-INPUT"
ipt -A "$FW_CHAIN-INPUT" -i "$POD_BRIDGE" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A "$FW_CHAIN-INPUT" -i "$POD_BRIDGE" -j DROP
ipt -C FORWARD -j "$FW_CHAIN" 2>/dev/null || ipt -I FORWARD 1 -j "$FW_CHAIN"
if ipt -S DOCKER-USER >/dev/null 2>&1; then
	ipt -C DOCKER-USER -j "$FW_CHAIN" 2>/dev/null || ipt -I DOCKER-USER 1 -j "$FW_CHAIN"
fi
ipt -C INPUT -j "$FW_CHAIN-INPUT" 2>/dev/null || ipt -I INPUT 1 -j "$FW_CHAIN-INPUT"
ipt -t nat -C POSTROUTING -s "$POD_CIDR" ! -o "$POD_BRIDGE" -j MASQUERADE 2>/dev/null ||
	ipt -t nat -A POSTROUTING -s "$POD_CIDR" ! -o "$POD_BRIDGE" -j MASQUERADE
[[ $(sysctl -n net.ipv4.ip_forward) == 1 ]] || log "warning: net.ipv4.ip_forward is 0: pods cannot reach the outside world"
[[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] || log "warning: br_netfilter is not loaded: pod-to-pod traffic on the bridge is not filtered"

# ---- kubelet ------------------------------------------------------------------
mkdir -p "$K8S_VAR/kubelet"
cat >"$K8S_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
containerRuntimeEndpoint: unix://$CTRD_SOCK
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# Images reach the node by import (no registry): never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "2%", imagefs.available: "2%"}
makeIPTablesUtilChains: false
maxPods: 250
EOF
start kubelet "$LOGS/kubelet.log" "$BIN/kubelet" --config "$K8S_DIR/kubelet.yaml" \
	--kubeconfig "$K8S_DIR/kubelet.kubeconfig" --hostname-override "$NODE" \
	--root-dir "$K8S_VAR/kubelet" --v 1
node_ready() {
	[[ $(kctl get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
wait_for "node $NODE Ready" 120 kubelet node_ready

# ---- what the missing controllers would create -----------------------------
# ns_init NS: the `default` ServiceAccount (ServiceAccount admission needs it
# for every pod) and the kube-root-ca.crt ConfigMap (projected token volumes).
ns_init() {
	kctl get namespace "$1" >/dev/null 2>&1 || kctl create namespace "$1" >/dev/null
	kctl -n "$1" get serviceaccount default >/dev/null 2>&1 || kctl -n "$1" create serviceaccount default >/dev/null
	kctl -n "$1" get configmap kube-root-ca.crt >/dev/null 2>&1 ||
		kctl -n "$1" create configmap kube-root-ca.crt --from-file=ca.crt="$PKI/ca.crt" >/dev/null
}
ns_init default
# The Node authorizer learns that a Pod is bound to the node from its own
# informer, a moment after the kubelet does: the kubelet's first status
# update of a Pod is then refused, and retried only at its next periodic
# sync (10 s). On this one-node cluster the node may also read and update
# its Pods through RBAC's system:node role, which closes that window.
kctl get clusterrolebinding berth-k8s-node >/dev/null 2>&1 ||
	kctl create clusterrolebinding berth-k8s-node --clusterrole system:node --user "system:node:$NODE" >/dev/null

# ---- storage: the PersistentVolume binder and a hostPath provisioner -----------
# berth puts each sandbox's /workspace on a PersistentVolumeClaim. A real
# cluster has a StorageClass with a CSI driver for that; this one binds
# claims with kube-controller-manager's binder (the only controllers it
# runs) and provisions them with tools/k8s/provisioner. Both use the admin
# kubeconfig: this is a test cluster.
start kube-controller-manager "$LOGS/kube-controller-manager.log" "$BIN/kube-controller-manager" \
	--kubeconfig "$K8S_DIR/admin.kubeconfig" --leader-elect=false --secure-port 0 \
	--controllers persistentvolume-binder-controller,persistentvolume-protection-controller,persistentvolumeclaim-protection-controller \
	--pvclaimbinder-sync-period 2s --v 1
start provisioner "$LOGS/provisioner.log" "$BIN/provisioner" \
	--kubeconfig "$K8S_DIR/admin.kubeconfig" --class berth-local --dir "$K8S_VAR/volumes"
kctl apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: berth-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: berth.dev/k8s-test-provisioner
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
t_ready=$(date +%s.%N)

# ---- berth's manifests and the orchestrator's kubeconfig -------------------
if [[ -d deploy/kubernetes ]]; then
	kctl apply -f deploy/kubernetes/ >/dev/null
	# The lease store's CRD (crd-berthleases.yaml) serves its resource only
	# once Established; the orchestrator's store needs it at start.
	if [[ -f deploy/kubernetes/crd-berthleases.yaml ]]; then
		kctl wait --for=condition=Established crd/berthleases.berth.dev --timeout=60s >/dev/null
	fi
	# The orchestrator's ServiceAccount: the one the RoleBinding names (the
	# sandboxes' berth-sandbox has none).
	ns=$(kctl get -f deploy/kubernetes/ -o 'jsonpath={range .items[?(@.kind=="RoleBinding")]}{.subjects[0].namespace}{"\n"}{end}' | head -1)
	sa=$(kctl get -f deploy/kubernetes/ -o 'jsonpath={range .items[?(@.kind=="RoleBinding")]}{.subjects[0].name}{"\n"}{end}' | head -1)
	if [[ -n $ns && -n $sa ]]; then
		ns_init "$ns"
		kubeconfig "$K8S_DIR/berth.kubeconfig" "system:serviceaccount:$ns:$sa" \
			"$(kctl -n "$ns" create token "$sa" --duration 24h)"
		sed -i "s|^  context: {cluster: berth-k8s, user: \(.*\)}|  context: {cluster: berth-k8s, user: \1, namespace: $ns}|" "$K8S_DIR/berth.kubeconfig"
		log "orchestrator kubeconfig (ServiceAccount $ns/$sa): $K8S_DIR/berth.kubeconfig"
	fi
fi

# ---- berth's agent image, on the node ------------------------------------------
scripts/k8s/agent-image.sh

cp "$K8S_DIR/admin.kubeconfig" "$KUBECONFIG_FILE"
chmod 600 "$KUBECONFIG_FILE"
log "control plane up in $(awk -v a="$t_start" -v b="$t_ready" 'BEGIN{printf "%.1f", b-a}') s (whole run $(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)"
log "ready: KUBECONFIG=$KUBECONFIG_FILE $BIN/kubectl get nodes"
