#!/usr/bin/env bash
# scripts/k8s/build.sh: build the test cluster's binaries into .berth/k8s/bin
# (kube-apiserver, kube-controller-manager, kubelet, kubectl from
# k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3, the pause program
# and the storage provisioner). Only the Go module
# proxy is used; the versions are pinned in tools/k8s/go.mod and
# tools/k8s/etcd/go.mod. A cold build takes minutes (and ~3 GB of build
# cache); a warm one seconds. Run by scripts/k8s/up.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=$ROOT/.berth/k8s/bin
mkdir -p "$BIN"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}
log() { printf '==> k8s build: %s\n' "$*" >&2; }

# The required version, in a one-line require or a require block.
kver=$(awk '$1 == "require" { $1 = ""; $0 = $0 } $1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' tools/k8s/go.mod)
[[ $kver == v* ]] || { echo "k8s build: no k8s.io/kubernetes version in tools/k8s/go.mod" >&2; exit 1; }
major=${kver#v}; major=${major%%.*}
minor=${kver#v*.}; minor=${minor%%.*}
# kubectl-style clients parse the server's version: without these the build
# reports v0.0.0-master and version checks fail.
ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ld+=" -X $pkg.gitVersion=$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

log "kube-apiserver, kube-controller-manager, kubelet, kubectl $kver"
(cd tools/k8s && go build -trimpath -ldflags "$ld" -o "$BIN/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl)

ever=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" { print $3 }' tools/k8s/etcd/go.mod)
log "etcd $ever"
(cd tools/k8s/etcd && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .)

log "pause, provisioner"
(cd tools/k8s && go build -trimpath -ldflags "-s -w" -o "$BIN/pause" ./pause)
(cd tools/k8s && go build -trimpath -ldflags "-s -w" -o "$BIN/provisioner" ./provisioner)
log "done: $(ls "$BIN" | tr '\n' ' ')"
