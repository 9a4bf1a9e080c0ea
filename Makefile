# config-watcher: build, test, demo. `make help` lists the targets.
#
# `make test` is what CI runs (.ci/run): go vet (actionlint included), the unit tests with
# the race detector (every fuzz target's seed corpus included; no exploration, so the same
# tree gives the same result), the monitoring component's queries checked against
# Prometheus's parser and engine (hack/promcheck), the release built twice and its files
# checked, the compose check, the Helm chart rendered and compared with the kustomize
# manifests (hack/helm), the e2e suite on a real local control plane (built once,
# 15-25 min cold on 2 cores, cached outside the repo; see CONTRIBUTING.md), then the
# e2e-node suite on a real kubelet (its binaries: 17-40 min cold, cached the same way).
# `make fuzz` explores every fuzz target for FUZZ_TIME each; it is not in `make test`: run it
# before resolving a change to parsing, and fix and keep every input it finds.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
export PATH := /usr/local/go/bin:$(PATH)

GO        ?= go
# -timeout guards against a hang only: the e2e suite takes ~15 min on an idle 2-core machine, more when it is shared.
E2E_FLAGS ?= -count=1 -v -timeout 45m
# make e2e-compat: the oldest Kubernetes the README names (CI's cache key reads it: make compat-kube-version),
# and the e2e suite's core run against it, each test by name: once per change, the interrupted states, waves
# and the halt, the budget's reads, bystanders, Secrets, references, consent, and the manifests on that server.
COMPAT_KUBE_VERSION ?= 1.32.9
E2E_COMPAT_TESTS := TestDataChangeRestartsPods TestMetadataOnlyEditsRestartNothing TestChangeWhileStoppedRestartsOnce \
	TestSettleThreeObjectsRestartEachPodOnce TestChangesDuringSlowDeletesLeaveTheirReplacements \
	TestInterruptedKilledThenReverted TestInterruptedRecordFailsThenReverted TestInterruptedToggleNeverReusesARound \
	TestInterruptedFrozenIndexDeletesNoBystander TestInterruptedFaultsRestartNothingTwice TestFaultSIGKILLMidRound \
	TestWavesKeepReadyPodsAboveTheFloor TestWavesHaltOnNeverReadyThenFixRestartsThemFirst \
	TestWavesHaltedRoundGoesOnWhenPodsBecomeReady TestWavesGoOnOnceTheDeploymentScalesDown \
	TestReplacementsNotReadyAfterTheLastRestart TestBudgetReadsTheOwnersScale TestBudgetSharedByTwoObjectsOverTheSamePods \
	TestBudgetReadsAnUnknownOwnerKindThroughDiscovery \
	TestBystanderRelabelledDuringDeleteRetries TestBystanderRelabelledDuringRefusedEvictions \
	TestBystanderAdmissionPolicyRefusalIsVisibleAndRetried TestBystanderReplaceMidRoundRestartsNoReplacement \
	TestBystanderStandbyQueueStaysEmpty TestBystanderUIDPreconditionAnswer \
	TestSecretDataChangeRestartsPodsOnce TestSecretStateEditedByAConfigMapWriterRestartsNothing \
	TestSecretWithALongNameKeepsItsStateUnderADigestOfTheName TestSecretMetadataOnlyEditsRestartNothing \
	TestSecretChangeWhileStoppedRestartsOnce TestSecretRewrittenWholeByItsOwnerRestartsOncePerChange \
	TestSecretsWithoutRBACSayWhichVerbIsMissing TestSecretTLSRotatedTwiceRestartsPerRotation TestSecretDataNeverLeaves \
	TestSecretRecreatedWhileDownIsAdopted \
	TestReferencingPodsRestartByKey \
	TestSecurityConfigMapWriterCannotRestartPodsWithoutConsent TestSecurityNamespaceWithoutOptInIgnored \
	TestInvalidSelectorsDeleteNothing \
	TestManifestsPassServerDryRun TestRBACManifestsAreEnough
space := $() $()
# make e2e-node: the node tests to run (a go test -run pattern), e.g. E2E_NODE_RUN=TestNodeWaves.
E2E_NODE_RUN ?= TestNode
FUZZ_TIME ?= 30s
# make sim: SEED=n replays one seed with its trace; SEEDS=N (or a-b) runs that many.
SEED  ?=
SEEDS ?= 100
# make uninstall: the namespace config-watcher runs in; YES=1 removes without asking.
NAMESPACE ?= default
YES       ?=
# make release: the version to build, and the image repository the install files name.
VERSION   ?=
IMAGE     ?= ghcr.io/k8spatterns/config-watcher
# make pin-images: crane, which reads the digest an image tag names from its registry.
CRANE     ?= crane
# The workflows' linter, pinned; built from the Go module proxy on first use.
ACTIONLINT ?= $(GO) run github.com/rhysd/actionlint/cmd/actionlint@v1.7.12

.PHONY: help build vet unit sim release release-test pin-images fuzz compose-check chart-test monitoring-test uninstall test e2e soak e2e-compat compat-kube-version demo cluster-up cluster-down cluster-env controlplane record bench bench-waves bench-coalesce bench-start clean image image-test image-e2e release-e2e node e2e-node demo-node

help: ## list the targets, by group
	@awk 'BEGIN { FS = ":.*## " } /^##@ / { printf "\n%s\n", substr($$0, 5) } /^[a-z0-9-]+:.*## / { printf "  %-16s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

##@ try
demo: ## the book's scenario, narrated, on a local control plane: waves, a halt, the fix (about 2 min; cold: builds it first, 15-25 min)
	bash hack/demo.sh

demo-node: image-e2e release-e2e ## the book's demo on a real kubelet, installed from a release: the pods serve the new message (root; ~40 s warm, cold: builds the node, 17-40 min)
	bash hack/node.sh run bash hack/demo-node.sh

##@ develop
build: ## build bin/config-watcher
	$(GO) build -o bin/config-watcher .

vet: ## go vet, e2e files included; actionlint on .github/workflows
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/...
	$(GO) vet -tags 'e2e e2enode' ./e2e/...
	$(ACTIONLINT)

unit: ## unit tests with the race detector, every fuzz target's seed corpus included (about 1 min)
	$(GO) test -race ./...

sim: ## the simulator (sim/, CONTRIBUTING.md): SEED=n replays one seed, printing its trace; else SEEDS=N (or a-b, default 100) seeds with a progress line; LENGTH=10 runs the workload 10 times as long; BOUNDED=a-b runs those seeds at 1x and 10x (bounded)
	@if [ -n "$(BOUNDED)" ]; then SIM_BOUNDED=$(BOUNDED) $(GO) test -count=1 -v -timeout 0 -run 'TestSimulationBounded$$' ./sim | grep '^sim:\|seed.*bounded'; \
	elif [ -n "$(SEED)" ]; then SIM_SEED=$(SEED) SIM_LENGTH=$(LENGTH) $(GO) test -count=1 -v -run 'TestSimulation$$' ./sim; \
	else SIM_SEEDS=$(SEEDS) SIM_LENGTH=$(LENGTH) $(GO) test -count=1 -timeout 0 -run 'TestSimulation$$' ./sim; fi

compose-check: ## docker-compose.yaml through compose-go, Docker Compose's own loader (hack/compose, a module of its own): both profiles and the checks the schema cannot make; offline
	cd hack/compose && $(GO) vet ./... && $(GO) test -count=1 ./...

chart-test: ## charts/config-watcher through Helm 4's Go module (hack/helm, a module of its own): rendered and linted for every variant and bad values, the same objects as kustomize's manifests/
	cd hack/helm && $(GO) vet ./... && $(GO) test -count=1 ./...

test: vet unit image-test monitoring-test release-test compose-check chart-test e2e e2e-node ## everything CI runs: vet, unit, image-test, monitoring-test, release-test, compose-check, chart-test, e2e, e2e-node (root; about 17 min warm)

image: ## bin/images/config-watcher.tar without Docker (docker load, kind load image-archive); seconds
	bash hack/image/build.sh

image-test: ## vet and unit tests of hack/image, a module of its own (the workflows' names and paths included)
	cd hack/image && $(GO) vet ./... && $(GO) vet -tags release ./... && $(GO) test -count=1 ./...

monitoring-test: ## hack/promcheck, a module of its own: every alert and dashboard query of manifests/monitoring parses (Prometheus's parser), names what the controller exports, and fires when it should (cold: 5 min)
	cd hack/promcheck && $(GO) vet ./... && $(GO) test -count=1 ./...

clean: ## remove build output (not the cached control plane)
	rm -rf bin dist

##@ your cluster (the current kubeconfig's)
uninstall: ## remove one config-watcher install and what it wrote, nothing of another's, from the cluster of your kubeconfig: lists it and asks (YES=1: does not), stops it, then its Lease, annotations, state, Events, objects (NAMESPACE=default: the controller's)
	NAMESPACE=$(NAMESPACE) YES=$(YES) bash hack/uninstall.sh

##@ release
release: ## dist/ for VERSION=vX.Y.Z [IMAGE=repo]: both platforms' images, install.yaml by digest, SBOM, SHA256SUMS (docs/deployment.md)
	VERSION=$(VERSION) IMAGE=$(IMAGE) bash hack/release.sh

pin-images: ## every image manifests/, the Dockerfile, docker-compose.yaml and the chart's values name, by tag and the digest the tag names now: hack/images.lock, then each reference (CRANE=crane; needs registry access: the release workflow runs it)
	cd hack/image && $(GO) build -o $(CURDIR)/bin/image .
	bin/image pin -repo $(CURDIR) -crane $(CRANE)

release-test: ## make release twice (identical SHA256SUMS?), then the dist/ tests, a push to a loopback registry included (the image's, and the chart's pulled back by Helm)
	bash hack/release-test.sh

##@ heavy (each starts processes on all cores; run one at a time)
e2e: ## e2e suite on a fresh local control plane, up, test, always down (about 4 min; E2E_FLAGS)
	bash hack/e2e.sh $(E2E_FLAGS)

# The ambassador and the tests' kubectl are the release's (the default control plane's, which the
# manifests pin), not the old server's own: what an install from a release runs there.
e2e-compat: controlplane ## the e2e suite's core (E2E_COMPAT_TESTS) on a fresh control plane at COMPAT_KUBE_VERSION, the oldest tested, with the release's kubectl as the ambassador; not in test (about 10 min; cold: builds that control plane first, 48 min measured on 2 busy cores)
	PATH="$$(bash hack/build-controlplane.sh --print-bin-dir):$$PATH" CW_SYSTEM_KUBECTL=1 CW_KUBE_VERSION=$(COMPAT_KUBE_VERSION) \
		bash hack/e2e.sh $(E2E_FLAGS) -run '^($(subst $(space),|,$(strip $(E2E_COMPAT_TESTS))))$$'

compat-kube-version:
	@echo $(COMPAT_KUBE_VERSION)

e2e-node: image-e2e release-e2e ## e2e tests on a real kubelet, containerd and runc, in namespaces of their own, installing a release's install.yaml and its Helm chart (root; about 6-7 min warm, 2 of them the chart's; E2E_NODE_RUN)
	bash hack/node.sh run go test -tags 'e2e e2enode' $(E2E_FLAGS) -run '$(E2E_NODE_RUN)' ./e2e/

soak: ## 30 min of random edits with proxy restarts; exactly-once and RSS report (not in CI; SOAK_DURATION=seconds)
	bash hack/soak.sh

bench: ## the campaign BENCHMARKS.md quotes: config-watcher vs the book's script and a client-go informer, 3 runs on fresh control planes, then the cluster-scale rows, into bench/results/ (about 105 min; BENCH_RUNS=1 about 50)
	bash bench/campaign.sh

bench-waves: ## restarts in waves alone (part of bench): 100 pods Ready after 1 s rolled with MAX_UNAVAILABLE=25% and 100%, first-restart latency of each; fresh control plane, about 5 min
	bash bench/waves.sh

bench-coalesce: ## restarts per pod alone (part of bench): 3 ConfigMaps of 12 pods changed together (SETTLE=1s and 0s), and a 30 s storm, beside the informer; fresh control plane, about 6 min
	bash bench/coalesce.sh

bench-start: ## the start alone (part of bench): exec -> /readyz at 20,000 ConfigMaps, this tree against BENCH_START_BASE (main) and the informer, 5 runs taking turns, time and CPU seconds; fresh control plane, about 8 min
	bash bench/start.sh

fuzz: ## explore every fuzz target for FUZZ_TIME (30s) each, 3-5 min; not in test: run it before resolving a change to parsing; an input it finds is saved under testdata/fuzz/ and fails
	GO=$(GO) FUZZ_TIME=$(FUZZ_TIME) bash hack/fuzz.sh

record: ## re-record testdata/recorded/ with kubectl on two fresh control planes, then run the unit tests that replay it (needs jq; a few min)
	bash hack/record.sh

##@ local control plane and node
controlplane: ## build (or find cached) etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (cold: 15-25 min)
	bash hack/build-controlplane.sh

cluster-up: ## start a local control plane (then eval the output of make cluster-env)
	bash hack/cluster.sh up

cluster-env: ## print its environment, for eval
	@bash hack/cluster.sh env

cluster-down: ## stop it
	bash hack/cluster.sh down

node: ## build (or find cached) containerd, kubelet, CNI plugins, a static kubectl (cold: 17-40 min)
	bash hack/node-build.sh

image-e2e: node ## image + the e2e node's images (ambassador, pause, demo web server); seconds once built
	bash hack/image/build.sh --e2e

# Its own directory and version, not dist/: a test must neither overwrite nor install
# whatever release sits there. hack/node.sh reads it from there (CW_RELEASE_DIST).
release-e2e: ## the release the e2e node installs: make release VERSION=v0.0.0-e2e into bin/release-e2e (about 15 s warm)
	VERSION=v0.0.0-e2e IMAGE=$(IMAGE) DIST=$(CURDIR)/bin/release-e2e bash hack/release.sh >/dev/null
