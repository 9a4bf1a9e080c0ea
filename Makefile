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
FUZZ_TIME ?= 10s

.PHONY: help build vet unit fuzz-short compose-check test e2e soak demo cluster-up cluster-down cluster-env controlplane record bench clean image image-e2e node e2e-node demo-node

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/config-watcher
	$(GO) build -o bin/config-watcher .

vet: ## go vet, e2e files included
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/...

unit: ## unit tests with the race detector
	$(GO) test -race ./...

test: vet unit fuzz-short compose-check e2e ## everything CI runs: vet, unit, fuzz-short, compose check, e2e

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

bench: ## issue 6: config-watcher vs the book's script and a client-go informer, on a fresh control plane (~10 min); see BENCHMARKS.md
	bash bench/run.sh

fuzz-short: ## run every fuzz target for FUZZ_TIME (10s) each; a crash is saved under testdata/fuzz/ and fails
	@targets=$$(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(' . | sort); \
	[[ -n $$targets ]] || { echo "no fuzz targets found" >&2; exit 1; }; \
	failed=(); \
	for file in $$targets; do \
		pkg=./$$(dirname "$${file#./}"); \
		for fn in $$(sed -nE 's/^func (Fuzz[A-Za-z0-9_]+)\(.*/\1/p' "$$file"); do \
			echo "==> fuzz $$pkg $$fn for $(FUZZ_TIME)"; \
			$(GO) test -run='^$$' -fuzz="^$$fn\$$" -fuzztime=$(FUZZ_TIME) "$$pkg" || failed+=("$$pkg $$fn"); \
		done; \
	done; \
	if (( $${#failed[@]} )); then printf 'fuzz-short: FAILED: %s\n' "$${failed[@]}" >&2; exit 1; fi

soak: ## 30 min of random edits with proxy restarts on a fresh control plane; exactly-once and RSS report (not in CI; SOAK_DURATION=seconds)
	bash hack/soak.sh

image: ## bin/images/config-watcher.tar without Docker (docker load, kind load image-archive); seconds
	bash hack/image/build.sh

image-e2e: node ## image + the e2e node's images (ambassador, pause, demo web server); seconds once built
	bash hack/image/build.sh --e2e

node: ## build (or find cached) containerd, kubelet, CNI plugins, static kubectl; cold ~17-40 min
	bash hack/node-build.sh

e2e-node: image-e2e ## e2e tests on a real kubelet, in namespaces of their own (root); ~3 min warm
	bash hack/node.sh run go test -tags 'e2e e2enode' $(E2E_FLAGS) -run 'TestNode' ./e2e/

demo-node: image-e2e ## the book's demo on a real kubelet: the pods serve the new message; ~40 s warm
	bash hack/node.sh run bash hack/demo-node.sh

clean: ## remove build output (not the cached control plane)
	rm -rf bin
