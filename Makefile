# berth build. `make help` lists the targets.
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/berth-dev/berth/internal/version.Version=$(VERSION)

# Pinned protoc plugin versions (protoc itself is Debian's protobuf-compiler).
PROTOC_GEN_GO_VERSION := v1.36.11
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
PROTOC_GEN_GATEWAY_VERSION := v2.27.8
PROTOC_GEN_OPENAPIV2_VERSION := v2.30.0
PROTOC_GEN_CONNECT_GO_VERSION := v1.21.1
# Pinned staticcheck (make lint installs it with go install when missing).
STATICCHECK_VERSION := v0.8.2
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin

.PHONY: help deps build run run-agent images images-dev e2e proto proto-tools proto-check lint test test-unit test-engine test-k8s chaos bench leakcheck clean k8s-up k8s-down ui-xterm

help: ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

deps: ## install the host packages run and test need, only those missing (scripts/deps.sh; idempotent)
	scripts/deps.sh

build: ui-xterm ## build bin/sandbox-agent (static) and bin/orchestrator side by side
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sandbox-agent ./cmd/sandbox-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/orchestrator ./cmd/orchestrator

run: deps build images ## build agent, orchestrator and images; serve on 127.0.0.1:7070 (operator token: $$BERTH_OPERATOR_TOKEN or "dev-operator-token")
	mkdir -p .berth/data
	BERTH_OPERATOR_TOKEN=$${BERTH_OPERATOR_TOKEN:-dev-operator-token} $(BIN)/orchestrator serve --data-dir $(CURDIR)/.berth/data

run-agent: build ## run the agent alone on 127.0.0.1:7000 (token: $$BERTH_AGENT_TOKEN or "dev-token")
	mkdir -p .berth/workspace
	BERTH_AGENT_TOKEN=$${BERTH_AGENT_TOKEN:-dev-token} $(BIN)/sandbox-agent --listen 127.0.0.1:7000 --workdir $(CURDIR)/.berth/workspace

images: deps ## build the sandbox images berth/base, berth/minimal and berth/e2b (offline, cached; what the tests need)
	images/build.sh base minimal e2b

images-dev: deps ## build berth/dev (berth/base + build-essential, nodejs, npm; offline, cached; not needed by the tests)
	images/build.sh dev

proto-tools: ## install protoc (Debian) and the pinned Go plugins
	@command -v protoc >/dev/null || (apt-get update && apt-get install -y protobuf-compiler libprotobuf-dev)
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	$(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(PROTOC_GEN_GATEWAY_VERSION)
	$(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(PROTOC_GEN_OPENAPIV2_VERSION)
	$(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)

proto: proto-tools ## regenerate the committed Go code and OpenAPI v2 descriptions (*.swagger.json) from proto/ (berth's services; E2B's envd services with Connect handlers)
	for svc in agent/v1/agent orchestrator/v1/orchestrator; do \
	  PATH="$(GOBIN_DIR):$$PATH" protoc -I proto -I /usr/include \
	    --go_out=proto --go_opt=paths=source_relative \
	    --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	    --grpc-gateway_out=proto --grpc-gateway_opt=paths=source_relative \
	    --grpc-gateway_opt=grpc_api_configuration=proto/berth/$${svc}_http.yaml \
	    --openapiv2_out=proto --openapiv2_opt=grpc_api_configuration=proto/berth/$${svc}_http.yaml \
	    proto/berth/$$svc.proto || exit 1; \
	done
	# E2B's envd protocol (pkg/agent/envd): Go messages and Connect handlers.
	PATH="$(GOBIN_DIR):$$PATH" protoc -I proto -I /usr/include \
	  --go_out=proto --go_opt=paths=source_relative \
	  --connect-go_out=proto --connect-go_opt=paths=source_relative \
	  proto/e2b/envd/process/process.proto proto/e2b/envd/filesystem/filesystem.proto

proto-check: proto ## fail if the committed generated code is stale
	@git diff --exit-code -- proto/ || (echo "generated code in proto/ is stale: run make proto and commit" && exit 1)

lint: ## gofmt, go vet and staticcheck (the pinned version, installed with go install when missing)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@$(GOBIN_DIR)/staticcheck -version 2>/dev/null | grep -qF '($(STATICCHECK_VERSION:v%=%))' || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(GOBIN_DIR)/staticcheck ./...

test: deps images ui-xterm ## run all tests: the engine-free packages under -race, then the engine packages and e2e without (needs Docker; builds the images; reuses a running test cluster, else starts one first and takes it down after: scripts/k8s/test.sh; BERTH_K8S=0 leaves the cluster out)
	scripts/k8s/test.sh sh -c 'rc=0; $(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -vE "$(ENGINE_PKGS)") || rc=1; \
	  $(GO) test -count=1 -timeout 45m $$($(GO) list ./... | grep -E "$(ENGINE_PKGS)") || rc=1; exit $$rc'

# The packages whose tests need an engine (Docker, containerd or the test
# cluster); make test-unit leaves them out.
ENGINE_PKGS := /e2e$$|/pkg/runtime/docker$$|/pkg/runtime/containerd$$|/pkg/runtime/kubernetes$$|/pkg/lease/kubestore$$

test-unit: deps ui-xterm ## the tests that need no engine (no Docker, containerd or cluster), under the race detector
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -vE '$(ENGINE_PKGS)')

test-engine: deps images ## the engine packages' own tests (Docker, containerd; the Kubernetes ones skip without the test cluster: make test-k8s)
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -E '$(ENGINE_PKGS)' | grep -v '/e2e$$')

test-k8s: deps images ## the Kubernetes-backed tests (pkg/runtime/kubernetes, pkg/lease/kubestore, e2e TestKubernetes*) with the test cluster (scripts/k8s/test.sh: reuses a running one, else starts one and takes it down after)
	scripts/k8s/test.sh sh -c 'rc=0; $(GO) test -count=1 -timeout 20m ./pkg/runtime/kubernetes/ ./pkg/lease/kubestore/ || rc=1; $(GO) test -count=1 -timeout 20m -run "^TestKubernetes" ./e2e/ || rc=1; exit $$rc'

e2e: deps images ui-xterm ## run only the end-to-end tests against the real Docker Engine
	$(GO) test -count=1 -timeout 20m -v ./e2e/...

chaos: deps images ## the fault suite in full (e2e TestChaos with BERTH_CHAOS=full): one table of figures; a subset runs in make test
	cd e2e && BERTH_CHAOS=full $(GO) test -count=1 -timeout 20m -run '^TestChaos$$'

bench: deps build images ## benchmarks; each prints ratios measured in one run
	@echo "== agent: exec /bin/true over gRPC vs bare fork/exec (issue-25 target 1: the agent <= 1.5x a bare fork/exec)"
	$(GO) test -run '^$$' -bench 'ExecTrueVsForkExec' -benchtime 2000x ./pkg/agent/
	@echo "== agent: 256 MiB upload + download over gRPC on loopback"
	$(GO) test -run '^$$' -bench 'UploadDownload256MiB' -benchtime 2x ./pkg/agent/
	@echo "== agent: 256 MiB up and down over REST (as is, and with digest=none), gRPC (as is, and with no_digest) and envd's /files, interleaved (6 rounds): MiB/s, the agent's CPU s/GiB, upload/download ratios (targets: speed >= 0.65, CPU per byte <= 1.2)"
	@out=$$($(GO) test -run '^$$' -bench 'FilesUpDown256MiB' -benchtime 6x ./pkg/agent/ 2>&1); rc=$$?; echo "$$out" | grep -o 'UPLOAD-BENCH.*' | tail -1; echo "$$out" | grep -E '^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== agent: its CPU for a warm claim's Configure vs a health check, each after 200 ms idle (fresh agent processes on the host; the agent's share of a warm claim that calls Configure: on Kubernetes, or from another host than the engine's)"
	@out=$$($(GO) test -run '^$$' -bench 'ConfigureCPU' -benchtime 10x ./cmd/sandbox-agent/ 2>&1); rc=$$?; echo "$$out" | grep -o 'CONFIGURE-BENCH.*' | tail -1; echo "$$out" | grep -E '^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== proxy (in-process agents): exec true through the proxy vs direct (overhead target <= 0.5 ms p50)"
	$(GO) test -run '^$$' -bench 'ExecTrue' -benchtime 2000x ./pkg/proxy/
	@echo "== docker: cold acquire vs docker run -d + docker exec (target <= 1.3x); release; expiry to gone"
	$(GO) test -run '^$$' -bench 'ColdAcquire' -benchtime 20x ./e2e/
	@echo "== docker: warm acquire from a pool vs cold acquire vs docker run -d + docker exec, one run (REST, request to READY; targets: warm p50 < 10 ms, p99 < 50 ms)"
	$(GO) test -run '^$$' -bench 'WarmAcquire' -benchtime 40x ./e2e/
	@echo "== docker, containerd: exec true through the proxy vs direct vs docker exec, as the default user and as root: on this machine's Docker Engine, on a second Docker Engine with overlay2 started for it, and on the containerd backend (also vs ctr task exec) (issue-25 target 1: >= 30x faster than docker exec, stretch 40x)"
	$(GO) test -run '^$$' -bench 'ProxyExecTrue' -benchtime 200x ./e2e/
	@echo "== docker, containerd: throughput: 20 keep-alive clients over 20 sandboxes, exec true through the proxy, with the CPU per exec of each part: on this machine's Docker Engine, on a second one with overlay2, and on the containerd backend, then the same clients paced at 1000 execs/s (target 2: >= 1000 execs/s, p99 < 50 ms)"
	@out=$$($(GO) test -run '^$$' -bench 'ProxyExecLoad' -benchtime 100x -timeout 20m ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'LOAD-BENCH|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== docker: 10 warm claims at once from a full pool of 10 (target 3: p50 < 10 ms, p99 < 30 ms)"
	@out=$$($(GO) test -run '^$$' -bench 'WarmAcquireParallel' -benchtime 8x -timeout 20m ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'WARM-BURST|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== docker: lease get with live usage (cgroup files) vs lease list vs the engine's one-shot stats call"
	$(GO) test -run '^$$' -bench 'UsageGet' -benchtime 50x ./e2e/
	@echo "== docker: 256 MiB through the proxy vs docker cp, both ways"
	$(GO) test -run '^$$' -bench 'ProxyFiles256MiB' -benchtime 1x ./e2e/
	@echo "== docker: a 10,000-file tree (1 KiB files, 100 dirs) with orchestrator cp vs docker cp, both ways"
	$(GO) test -run '^$$' -bench 'CpDir10k' -benchtime 3x ./e2e/
	@echo "== docker, containerd: hibernate -> first exec through the proxy with 500 hibernated leases on the host, on each backend, with the plain CLI's start + exec of a stopped container beside it (target 5: p50 < 300 ms)"
	@out=$$(BERTH_BENCH=1 $(GO) test -count=1 -timeout 60m -run '^TestHibernateCrowdBench(Containerd)?$$' -v ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'HIBERNATE-BENCH|hibernated in|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== docker: pause/resume: freeze->resume, hibernate->resume, the proxy's first request to a paused lease (p50 of 10; targets < 20 ms, < 500 ms)"
	@out=$$($(GO) test -count=1 -run '^TestPauseLatency$$' -v ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'PAUSE-BENCH|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== egress: a network policy change until the first new connection from the sandbox is answered (Docker and containerd; the enforcer alone on network namespaces)"
	@out=$$($(GO) test -count=1 -run '^(TestEgressDocker|TestEgressContainerd)$$' -v ./e2e/ 2>&1 && $(GO) test -count=1 -run '^TestEnforcerNetns$$' -v ./internal/egress/ 2>&1); rc=$$?; echo "$$out" | grep -E 'EGRESS-LATENCY|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== snapshots: time and size of a snapshot of a berth/base sandbox (1 MiB + 100 files written), Docker and containerd; a fork's acquire"
	@out=$$(BERTH_BENCH=1 $(GO) test -count=1 -timeout 25m -run '^TestSnapshotBench$$' -v ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'SNAPSHOT-BENCH|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== docker: E2B surface vs berth's own API: create -> first command (p50 of 10), a command through envd's Start stream vs the proxy's REST exec (p50/p99 of 100)"
	@out=$$(BERTH_BENCH=1 $(GO) test -count=1 -timeout 15m -run '^TestE2BBench$$' -v ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'E2B-BENCH|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== docker: memory of 50 idle berth/base leases running vs frozen vs hibernated (sums of the containers' cgroup v1 memory.usage_in_bytes and memory.stat total_rss/total_cache)"
	@out=$$(BERTH_BENCH=1 $(GO) test -count=1 -timeout 20m -run '^TestIdleMemoryBench$$' -v ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'MEMORY-BENCH|^(--- FAIL|FAIL|ok)'; exit $$rc
	@echo "== containerd vs docker backend: cold create and exec round trip"
	$(GO) test -run '^$$' -bench . -benchtime 10x ./pkg/runtime/containerd/
	@echo "== kubernetes vs docker backend (test cluster, berth/minimal, REST): cold acquire and release, re-acquire of a persisted conversation, exec true through the proxy, 20 parallel acquires, warm claims from a pool (reuses a running test cluster, else starts one and takes it down after)"
	@out=$$(BERTH_BENCH=1 scripts/k8s/test.sh $(GO) test -count=1 -timeout 20m -run '^TestKubernetes(Warm)?Bench$$' -v ./e2e/ 2>&1); rc=$$?; echo "$$out" | grep -E 'K8S-BENCH|^(--- FAIL|FAIL|ok)|^==> k8s: (reusing|no test cluster|test cluster up|taking down)|^k8s: error'; exit $$rc

ui-xterm: ## bundle the dashboard's browser terminal (xterm.js from Debian's node-xterm, libjs-xterm) into pkg/orchestrator/ui/xterm (gitignored; skipped when they are missing)
	scripts/ui-xterm.sh

leakcheck: ## list berth test leftovers (containers, tasks, snapshots, snapshot images, volumes, networks, netns, veths; Pods, claims and volumes in the test cluster, or traces of it when it is down); fail if any
	@rc=0; scripts/leakcheck.sh || rc=$$?; scripts/k8s/leakcheck.sh || rc=1; exit $$rc

k8s-up: deps ## build (tools/k8s, cached) and start a single-node Kubernetes test cluster on loopback; kubeconfig in .berth/k8s/kubeconfig (docs/kubernetes.md)
	scripts/k8s/up.sh

k8s-down: ## stop the test cluster of make k8s-up and remove every trace of it (processes, mounts, iptables rules, sysctls, cgroups)
	scripts/k8s/down.sh

clean:
	rm -rf $(BIN)
