#!/usr/bin/env bash
# Runs the e2e suite on a control plane of its own: `hack/cluster.sh up` in a fresh state
# dir (so it never meets a cluster you started yourself), the tests, then `down` whatever
# happened. Exits with the tests' exit code. On failure the state dir (component logs,
# audit log) is kept and its path printed.
#
# Usage: hack/e2e.sh [go test flags…]   (default: -count=1 -v -timeout 45m, a guard against a hang; also: make e2e)
#
# To run the tests against a cluster that is already up:
#   eval "$(hack/cluster.sh env)"; go test -tags e2e -count=1 -v ./e2e/...
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$hack_dir")"
# shellcheck source=hack/lib.sh
source "$hack_dir/lib.sh"

flags=("$@")
((${#flags[@]})) || flags=(-count=1 -v -timeout 45m)

export CW_STATE_DIR
CW_STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-e2e.XXXXXX")
rc=0
trap 'cw_cluster_down $rc e2e' EXIT

"$hack_dir/cluster.sh" up || { rc=$?; exit $rc; }
eval "$("$hack_dir/cluster.sh" env)"
# The versions the run tested, as the server and the kubectl of the ambassador and the tests say
# (make e2e-compat runs an older server than its kubectl).
"$CW_KUBECTL" --kubeconfig="$KUBECONFIG" version 2>&1 | grep -v '^Kustomize' | sed 's/^/==> /' >&2 || true
start=$SECONDS
cw_log "running e2e tests: go test -tags e2e ${flags[*]} ./e2e/..."
(cd "$repo" && go test -tags e2e "${flags[@]}" ./e2e/...) || rc=$?
cw_log "e2e tests finished in $(cw_elapsed $((SECONDS - start))) with exit code $rc"
exit $rc
