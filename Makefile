# idc-operator Makefile. `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

# The release version: both binaries report it (`idc-runtime version`,
# `manager --version`), it tags the image, and the Helm chart follows it.
VERSION ?= 0.3.0-dev
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# The image's timestamps: the commit time, so one commit gives one digest.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMG ?= idc-operator:$(VERSION)
LOCALBIN ?= $(CURDIR)/bin
K8S_BIN = $(LOCALBIN)/k8s/$(K8S_VERSION)-linux-amd64
# kubectl at the cluster's version (built by hack/build-node.sh).
KUBECTL ?= $(K8S_BIN)/kubectl
# -w drops DWARF; the symbol table stays (no -s): govulncheck's binary mode
# reads it to see which functions a binary holds (stripped, it reports every
# package of a vulnerable module as reachable). It costs ~2 MiB a binary.
GO_LDFLAGS = -w -X github.com/idempotency-dev/idc-operator/runtime/version.Version=$(VERSION) -X github.com/idempotency-dev/idc-operator/runtime/version.Commit=$(COMMIT)
export GOFLAGS ?= -buildvcs=false
# go.mod needs Go 1.27: the go command fetches go1.27.3 through the module
# proxy (machines here default to GOTOOLCHAIN=local and their own Go 1.26).
# Every shell entry point (.ci/run, hack/*.sh) sets the same.
export GOTOOLCHAIN := go1.27.3
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
CRD_REF_DOCS ?= $(LOCALBIN)/crd-ref-docs
CRD_REF_DOCS_VERSION ?= v0.3.0
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
HELM ?= $(LOCALBIN)/helm
HELM_VERSION ?= v3.22.0
CHART ?= charts/idc-operator
CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0
K8S_VERSION ?= 1.37.2
# Test timeout for `make test`; the whole suite must stay well under 30 minutes.
TEST_TIMEOUT ?= 25m
GO_TEST_FLAGS ?=
ARGS ?=

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen crd-ref-docs ## Generate the CRD and RBAC manifests from the Go markers, and docs/reference/api.md.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/..." paths="./controllers/..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	$(CRD_REF_DOCS) --log-level=WARN --max-depth=16 --source-path=./api --config=hack/crd-ref-docs/config.yaml --renderer=markdown --output-path=docs/reference/api.md
	sed -i 's/^  newTag: .*/  newTag: $(VERSION)/' config/manager/kustomization.yaml
	@# The Helm chart's CRD, RBAC rules, alerts and dashboard are copies of the
	@# files under config/ (test/helmchart fails when they drift); it follows VERSION.
	rm -f $(CHART)/crds/*.yaml $(CHART)/files/rbac/*.yaml $(CHART)/files/prometheus/*
	cp config/crd/bases/*.yaml $(CHART)/crds/
	cp config/rbac/*role.yaml $(CHART)/files/rbac/
	cp config/prometheus/rules.yaml config/prometheus/dashboard.json $(CHART)/files/prometheus/
	sed -i -e 's/^version: .*/version: $(VERSION)/' -e 's/^appVersion: .*/appVersion: "$(VERSION)"/' $(CHART)/Chart.yaml

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## go fmt.
	go fmt ./...

.PHONY: vet
vet: ## go vet.
	go vet ./...

.PHONY: lint
lint: golangci-lint ## golangci-lint (gocognit, gocyclo, errorlint, ...).
	$(GOLANGCI_LINT) run ./...

.PHONY: envtest
envtest: ## Build kube-apiserver and etcd from the Go module proxy; print their directory.
	@hack/build-envtest.sh

.PHONY: services
services: ## Check the local PostgreSQL, NATS, RabbitMQ and Redis; start any that is down.
	@hack/services.sh ensure

.PHONY: promtool
promtool: ## Install promtool (Debian package prometheus) for the alert tests, when missing.
	@command -v promtool >/dev/null || { echo "installing promtool (Debian package prometheus) for test/monitoring" >&2; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; }

.PHONY: test
test: helm promtool crd-ref-docs nats ## Run every test: unit, envtest, real services, short chaos (on nats-server 2.15.3 and on the machine's 2.9.10), then the e2e suite on a real node.
	@hack/services.sh check
	KUBEBUILDER_ASSETS="$$(hack/build-envtest.sh)" IDC_HELM=$(HELM) go test -timeout $(TEST_TIMEOUT) -count=1 $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/e2e)
	@# The chaos short form again on the oldest supported server (the JetStream
	@# conformance suite runs on both within the line above).
	IDC_TEST_NATS=system go test -timeout $(TEST_TIMEOUT) -count=1 $(GO_TEST_FLAGS) -run '^TestChaos$$' ./test/chaos/
	@# The real node: started for the e2e suite unless it already runs, and
	@# stopped again (and proven clean) if this target started it.
	@if hack/node.sh running; then \
	  $(MAKE) --no-print-directory test-e2e; \
	else \
	  $(MAKE) --no-print-directory node-up && \
	  { $(MAKE) --no-print-directory test-e2e; rc=$$?; $(MAKE) --no-print-directory node-down; exit $$rc; }; \
	fi

.PHONY: test-e2e
test-e2e: build-installer helm plugin ## End-to-end on the real node (make node-up first): install.yaml, kubelet-run pods, every broker, the kubectl plugin.
	@hack/services.sh check
	@hack/node.sh running || { echo "the real node is not running: make node-up" >&2; exit 1; }
	@hack/keda-install.sh
	IDC_E2E_KUBECONFIG="$$(hack/node.sh kubeconfig)" IDC_E2E_INSTALL=$(CURDIR)/dist/install.yaml IDC_E2E_KUBECTL=$(KUBECTL) IDC_E2E_HELM=$(HELM) IDC_E2E_PLUGIN=$(LOCALBIN)/kubectl-idc IDC_E2E_FIXTURES=$(LOCALBIN)/e2e-fixtures \
	  IDC_E2E_IMAGE=$(IMG) IDC_E2E_IMAGE_ID="$$(cat $(LOCALBIN)/idc-operator-image.tar.id)" IDC_E2E_VERSION=$(VERSION) IDC_E2E_AUDIT_LOG="$$(dirname "$$(dirname "$$(hack/node.sh kubeconfig)")")/logs/audit.log" go test -count=1 -timeout 36m -v ./test/e2e/... 2>&1 | tee $(LOCALBIN)/e2e.log \
	  || { hack/e2e-failed.sh $(LOCALBIN)/e2e.log; exit 1; }

##@ Real node

.PHONY: node-up
node-up: image ## Start a real single-node cluster (kubelet, containerd, CNI bridge + guard); import the image; print the kubeconfig.
	@hack/node.sh up

.PHONY: keda
keda: ## KEDA v2.21.0 as real pods on the running node (built from the Go module proxy into bin/keda/, no download): CRDs, operator, metrics API server, APIService.
	@hack/keda-install.sh

.PHONY: node-down
node-down: ## Stop the node and remove every trace of it (processes, mounts, cgroups, chains, bridge).
	@hack/node.sh down

.PHONY: node-check-clean
node-check-clean: ## Print what is left of a node; fail if anything is.
	@hack/node.sh check-clean

.PHONY: test-chaos
test-chaos: ## Long chaos runs on PostgreSQL and on MariaDB (one CHAOS line each): 100k messages, >= 30 SIGKILLs (some between COMMIT and ack), DB cuts; then the 50k-message two-stage pipeline on both.
	@hack/services.sh check
	IDC_CHAOS=long go test -count=1 -timeout 45m -run TestChaos -v ./test/chaos/...
	IDC_CHAOS=long go test -count=1 -timeout 20m -run 'TestBinary/PipelineChaos' -v ./test/integration/

.PHONY: bench
bench: nats ## Data-plane benchmark table on nats-server 2.15.3: DB ceiling, idc-runtime replicas per broker, inbox modes, RATIO lines; the headline and the 10%/50%-of-sustained latency rows also on the machine's 2.9.10 (RATIO nats_2.15_vs_2.9_*); then the MariaDB rows.
	@hack/services.sh check
	go test -run '^$$' -bench . -benchtime 1x -timeout 30m ./test/bench/...

.PHONY: bench-prune
bench-prune: ## Prune benchmark: 5M expired ids, Table batched delete vs Partitioned drop, under claim load.
	@hack/services.sh check
	go test -run '^$$' -bench . -benchtime 1x -timeout 40m ./test/benchprune/...

.PHONY: bench-controller
bench-controller: ## Controller benchmark: 300 resources (IDC_BENCH_RESOURCES) to Ready on one PostgreSQL, manager RSS; then a 5-minute steady state (IDC_BENCH_STEADY): status, child writes, broker reads.
	@hack/services.sh check
	KUBEBUILDER_ASSETS="$$(hack/build-envtest.sh)" go test -run '^$$' -bench . -benchtime 1x -timeout 40m ./test/benchcontroller/...

##@ Build

.PHONY: build
build: plugin ## Build bin/manager, bin/idc-runtime and bin/kubectl-idc (static, with the version).
	CGO_ENABLED=0 go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $(LOCALBIN)/manager ./cmd/manager
	CGO_ENABLED=0 go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $(LOCALBIN)/idc-runtime ./cmd/idc-runtime

.PHONY: plugin
plugin: ## Build bin/kubectl-idc, the kubectl plugin (`kubectl idc` once it is on the PATH).
	CGO_ENABLED=0 go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $(LOCALBIN)/kubectl-idc ./cmd/kubectl-idc

# The plugin's release archives, one per platform, as krew installs them
# (plugins/krew/idc.yaml): reproducible (commit time, no owners), with a
# .sha256 beside each.
PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
.PHONY: dist-plugin
dist-plugin: ## Write dist/kubectl-idc_v$(VERSION)_<os>_<arch>.tar.gz (+ .sha256) for PLUGIN_PLATFORMS.
	@mkdir -p dist
	@for p in $(PLUGIN_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; dir=$(LOCALBIN)/plugin/$$os-$$arch; name=kubectl-idc_v$(VERSION)_$${os}_$${arch}.tar.gz; \
	  rm -rf $$dir && mkdir -p $$dir && \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $$dir/kubectl-idc ./cmd/kubectl-idc && \
	  tar --sort=name --mtime=@$(SOURCE_DATE_EPOCH) --owner=0 --group=0 --numeric-owner -C $$dir -cf - . | gzip -n > dist/$$name && \
	  (cd dist && sha256sum $$name > $$name.sha256) && echo "dist/$$name"; \
	done

.PHONY: release
release: ## Write a release of the committed VERSION into dist/: install.yaml, the chart, the plugin archives and krew manifest, the image and its digest, SBOMs, SHA256SUMS.
	hack/release.sh $(VERSION)

.PHONY: test-release
test-release: ## make release twice (from this tree, into bin/release-a and -b): identical SHA256SUMS, and each SBOM lists its binary's modules.
	cd hack/sbom && go test -count=1 ./...
	IDC_RELEASE_REHEARSAL=1 DIST=$(LOCALBIN)/release-a hack/release.sh $(VERSION) >/dev/null
	IDC_RELEASE_REHEARSAL=1 DIST=$(LOCALBIN)/release-b hack/release.sh $(VERSION) >/dev/null
	diff $(LOCALBIN)/release-a/SHA256SUMS $(LOCALBIN)/release-b/SHA256SUMS && echo "RELEASE reproducible: $$(wc -l < $(LOCALBIN)/release-a/SHA256SUMS) files, SHA256SUMS $$(sha256sum < $(LOCALBIN)/release-a/SHA256SUMS | cut -c1-16)"

.PHONY: vulncheck
vulncheck: build ## govulncheck on the source and bin/manager, bin/idc-runtime against a local DB built from golang.org/x/vulndb; fails on a called vulnerability not in hack/vulncheck-allow.txt.
	hack/vulncheck.sh

.PHONY: kube-score
kube-score: build-installer helm ## kube-score on dist/install.yaml, the chart's render and a consumer's rendered children (LIVE=1: also the live ones); fails on a CRITICAL finding the README does not explain.
	@test -x $(LOCALBIN)/kube-score || (cd hack/kubescore && go build -trimpath -o $(LOCALBIN)/kube-score github.com/zegl/kube-score/cmd/kube-score)
	KUBE_SCORE=$(LOCALBIN)/kube-score HELM=$(HELM) KUBECTL=$(KUBECTL) hack/kube-score.sh

.PHONY: image
image: ## Build the image without Docker: bin/idc-operator-image.tar (OCI archive; .docker.tar for docker load).
	@mkdir -p $(LOCALBIN)/linux
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $(LOCALBIN)/linux/manager ./cmd/manager
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $(LOCALBIN)/linux/idc-runtime ./cmd/idc-runtime
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $(LOCALBIN)/linux/kubectl-idc ./cmd/kubectl-idc
	go run ./hack/image -tag $(IMG) -out $(LOCALBIN)/idc-operator-image.tar -docker $(LOCALBIN)/idc-operator-image.docker.tar -base \
	  -file /manager=$(LOCALBIN)/linux/manager -file /idc-runtime=$(LOCALBIN)/linux/idc-runtime -file /kubectl-idc=$(LOCALBIN)/linux/kubectl-idc \
	  -entrypoint /manager -user 65532:65532 -created $(SOURCE_DATE_EPOCH) \
	  -label org.opencontainers.image.version=$(VERSION) -label org.opencontainers.image.revision=$(COMMIT) \
	  -label org.opencontainers.image.source=https://github.com/idempotency-dev/idc-operator

.PHONY: pause-image
pause-image: ## The node's sandbox image (registry.k8s.io/pause:3.10, a static Go pause).
	@mkdir -p $(LOCALBIN)/linux
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/linux/pause ./hack/node/pause
	go run ./hack/image -tag registry.k8s.io/pause:3.10 -out $(LOCALBIN)/pause-image.tar \
	  -file /pause=$(LOCALBIN)/linux/pause -entrypoint /pause -user 65535:65535 -created 0

.PHONY: run
run: manifests generate ## Run the manager against the cluster in ~/.kube/config.
	go run ./cmd/manager $(ARGS)

.PHONY: demo
demo: node-up build-installer ## The demo on the real node (NATS JetStream -> PostgreSQL upsert). ARGS=--once exits after the summary.
	@# Built, not `go run`: Ctrl-C then ends the demo with its own exit code.
	go build -o $(LOCALBIN)/idc-demo ./hack/demo
	IDC_DEMO_KUBECONFIG="$$(hack/node.sh kubeconfig)" $(LOCALBIN)/idc-demo -install $(CURDIR)/dist/install.yaml -kubectl $(KUBECTL) -image $(IMG) $(ARGS)

.PHONY: docker-build
docker-build: ## Build the same image with Docker (needs a Docker engine; this machine kind has none).
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMG) .

.PHONY: build-installer
build-installer: manifests generate kubectl ## Write dist/install.yaml (CRD, RBAC, manager) for image $(IMG).
	mkdir -p dist
	$(KUBECTL) kustomize config/default | sed 's|idc-operator:$(VERSION)$$|$(IMG)|' > dist/install.yaml

.PHONY: kubectl
kubectl: ## Build kubectl (and the node's other components) at the cluster's version into bin/k8s/.
	@hack/build-node.sh >/dev/null

##@ Deployment

.PHONY: install
install: manifests kubectl ## Install the CRD into the cluster in ~/.kube/config.
	$(KUBECTL) apply --server-side -f config/crd/bases

.PHONY: uninstall
uninstall: manifests kubectl ## Remove the CRD.
	$(KUBECTL) delete --ignore-not-found -f config/crd/bases

.PHONY: deploy
deploy: manifests kubectl ## Deploy the operator.
	$(KUBECTL) apply --server-side -k config/default

.PHONY: undeploy
undeploy: kubectl ## Remove the operator.
	$(KUBECTL) delete --ignore-not-found -k config/default

##@ Tools

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

.PHONY: crd-ref-docs
crd-ref-docs: $(CRD_REF_DOCS)
$(CRD_REF_DOCS):
	GOBIN=$(LOCALBIN) go install github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION)

.PHONY: helm
helm: $(HELM) ## Build helm from the Go module proxy into bin/ (the chart tests run it).
# Stamped the way helm's own Makefile stamps its release binaries: its version,
# and the Kubernetes version it assumes without --kube-version (client-go
# v0.X.Y of helm's go.mod is Kubernetes 1.X; unstamped it would be v1.20.0,
# below the chart's kubeVersion).
$(HELM):
	@mkdir -p $(LOCALBIN); gomod="$$(cd $(LOCALBIN) && go mod download -json helm.sh/helm/v3@$(HELM_VERSION) | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$$/\1/p')"; \
	cgo="$$(awk '$$1 == "k8s.io/client-go" { sub(/^v/, "", $$2); print $$2 }' "$$gomod")"; \
	[ -n "$$cgo" ] || { echo "no k8s.io/client-go in helm's go.mod ($$gomod)" >&2; exit 1; }; \
	major="$$(( $${cgo%%.*} + 1 ))"; minor="$$(echo "$$cgo" | cut -d. -f2)"; \
	echo "building helm $(HELM_VERSION) for Kubernetes $$major.$$minor (client-go v$$cgo)"; \
	GOBIN=$(LOCALBIN) go install -trimpath -ldflags "-s -w \
	  -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) -X helm.sh/helm/v3/internal/version.metadata= \
	  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$$major -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$$minor \
	  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$$major -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$$minor" \
	  helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

.PHONY: nats
nats: ## Build nats-server v2.15.3 from the Go module proxy into bin/nats/ (the test suites start it themselves; cached).
	@hack/build-nats.sh >/dev/null

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT)
$(GOLANGCI_LINT):
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
