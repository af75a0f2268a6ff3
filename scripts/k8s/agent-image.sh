#!/usr/bin/env bash
# scripts/k8s/agent-image.sh: build berth's agent image for the Kubernetes
# backend and load it into the test cluster's node (run by up.sh).
#
#   scripts/k8s/agent-image.sh [IMAGE]     (default berth/k8s-agent:latest)
#
# The image is FROM scratch and holds two static programs: /sandbox-agent
# (cmd/sandbox-agent) and /installer (pkg/runtime/kubernetes/installer),
# the entry point of every sandbox Pod's init container, which copies the
# agent into the Pod's emptyDir. It is made with `docker import` (no
# builder, no registry) and copied into the node's containerd with
# `docker save | ctr import`. For a real cluster push it to a registry
# instead: docker tag IMAGE REGISTRY/berth/k8s-agent:TAG && docker push ...
set -euo pipefail
source "$(dirname "$0")/lib.sh"
IMAGE=${1:-berth/k8s-agent:latest}
VERSION=$(git describe --always --dirty 2>/dev/null || echo dev)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/berth-dev/berth/internal/version.Version=$VERSION" \
	-o "$tmp/sandbox-agent" ./cmd/sandbox-agent
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/installer" ./pkg/runtime/kubernetes/installer
tar -C "$tmp" --owner=0 --group=0 -c sandbox-agent installer |
	docker import -c 'ENTRYPOINT ["/installer"]' -c "LABEL dev.berth.version=$VERSION" - "$IMAGE" >/dev/null
log "built $IMAGE ($VERSION)"
if [[ -S $CTRD_SOCK ]]; then
	node_import "$IMAGE"
	log "loaded $IMAGE into the test cluster's node"
fi
