# config-watcher: build, test, demo. `make help` lists the targets.
#
# `make test` is what CI runs (.ci/run): go vet, the unit tests with the race detector,
# then the e2e suite on a real local control plane (built once, ~15 min cold, cached
# outside the repo; see hack/build-controlplane.sh).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
export PATH := /usr/local/go/bin:$(PATH)

GO        ?= go
E2E_FLAGS ?= -count=1 -v -timeout 20m

.PHONY: help build vet unit compose-check test e2e demo cluster-up cluster-down cluster-env controlplane record clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/config-watcher
	$(GO) build -o bin/config-watcher .

vet: ## go vet, e2e files included
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/...

unit: ## unit tests with the race detector
	$(GO) test -race ./...

test: vet unit compose-check e2e ## everything CI runs: vet, unit, compose check, e2e

compose-check: ## validate docker-compose.yaml offline (no engine needed)
	bash hack/check-compose.sh

e2e: ## e2e suite on a fresh local control plane (up, test, always down)
	bash hack/e2e.sh $(E2E_FLAGS)

demo: ## the book's scenario, narrated, on a local control plane
	bash hack/demo.sh

controlplane: ## build (or find cached) etcd, kube-apiserver, kube-controller-manager
	bash hack/build-controlplane.sh

cluster-up: ## start a local control plane (then eval the output of make cluster-env)
	bash hack/cluster.sh up

cluster-down: ## stop it
	bash hack/cluster.sh down

cluster-env: ## print its environment, for eval
	@bash hack/cluster.sh env

record: ## re-record testdata/recorded/ from a real API server
	bash hack/record.sh

# fuzz-short: (to come) a short bounded run of each fuzz target.

clean: ## remove build output (not the cached control plane)
	rm -rf bin
