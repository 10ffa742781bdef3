# idc-operator Makefile. `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

IMG ?= idc-operator:dev
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
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
manifests: controller-gen ## Generate the CRD and RBAC manifests from the Go markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/..." paths="./controllers/..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

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

.PHONY: test
test: ## Run the tests: unit, envtest (real kube-apiserver), real services, short chaos.
	@hack/services.sh check
	KUBEBUILDER_ASSETS="$$(hack/build-envtest.sh)" go test -timeout $(TEST_TIMEOUT) -count=1 $(GO_TEST_FLAGS) ./...

.PHONY: test-e2e
test-e2e: ## End-to-end: control plane + real manager + local pod runner + real services.
	@hack/services.sh check
	KUBEBUILDER_ASSETS="$$(hack/build-envtest.sh)" go test -count=1 -timeout 20m -v ./test/e2e/...

.PHONY: test-chaos
test-chaos: ## Long chaos run: 100k messages, >= 30 SIGKILLs (some between COMMIT and ack), DB cuts.
	@hack/services.sh check
	IDC_CHAOS=long go test -count=1 -timeout 45m -run TestChaos -v ./test/chaos/...

.PHONY: bench
bench: ## Data-plane benchmark: batched inbox vs per-message inbox vs no dedup (JetStream -> upsert).
	@hack/services.sh check
	go test -run '^$$' -bench . -benchtime 1x -timeout 10m ./test/bench/...

.PHONY: bench-prune
bench-prune: ## Prune benchmark: 5M expired ids, Table batched delete vs Partitioned drop, under claim load.
	@hack/services.sh check
	go test -run '^$$' -bench . -benchtime 1x -timeout 40m ./test/benchprune/...

.PHONY: bench-controller
bench-controller: ## Controller benchmark: 300 resources to Ready against one PostgreSQL; manager RSS.
	@hack/services.sh check
	KUBEBUILDER_ASSETS="$$(hack/build-envtest.sh)" go test -run '^$$' -bench . -benchtime 1x -timeout 20m ./test/benchcontroller/...

##@ Build

.PHONY: build
build: ## Build bin/manager and bin/idc-runtime.
	CGO_ENABLED=0 go build -trimpath -o $(LOCALBIN)/manager .
	CGO_ENABLED=0 go build -trimpath -o $(LOCALBIN)/idc-runtime ./runtime/cmd/idc-runtime

.PHONY: run
run: manifests generate ## Run the manager against the cluster in ~/.kube/config.
	go run . $(ARGS)

.PHONY: demo
demo: ## Run the demo locally (NATS JetStream -> PostgreSQL upsert). ARGS=--once exits after the summary.
	@# Built, not `go run`: Ctrl-C then ends the demo with its own exit code.
	go build -o $(LOCALBIN)/idc-demo ./hack/demo
	$(LOCALBIN)/idc-demo $(ARGS)

.PHONY: docker-build
docker-build: ## Build the image (needs a Docker engine; this machine kind has none).
	docker build -t $(IMG) .

.PHONY: build-installer
build-installer: manifests generate ## Write dist/install.yaml (CRD, RBAC, manager).
	mkdir -p dist
	kubectl kustomize config/default > dist/install.yaml

##@ Deployment

.PHONY: install
install: manifests ## Install the CRD into the cluster in ~/.kube/config.
	kubectl apply --server-side -f config/crd/bases

.PHONY: uninstall
uninstall: manifests ## Remove the CRD.
	kubectl delete --ignore-not-found -f config/crd/bases

.PHONY: deploy
deploy: manifests ## Deploy the operator.
	kubectl apply --server-side -k config/default

.PHONY: undeploy
undeploy: ## Remove the operator.
	kubectl delete --ignore-not-found -k config/default

##@ Tools

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT)
$(GOLANGCI_LINT):
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
