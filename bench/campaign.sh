#!/usr/bin/env bash
# One bench campaign (`make bench`): the figures BENCHMARKS.md quotes, all from one
# commit, in one generated directory. bench/results/ holds exactly one campaign; the
# one before it is in git history, never copied beside it.
#
#   run1..runN  bench/run.sh, BENCH_RUNS times (default 3), each on a fresh control plane
#               of its own: a run is noisy on a shared 2-core machine, N runs give the
#               spread BENCHMARKS.md states for each headline ratio
#   scale       bench/scale.sh once, on a control plane of its own (BENCH_SCALE=0 skips it)
#   go-bench.txt  go test -bench . -benchmem of the product's packages
#   spread.md   benchtool spread over the runs: each headline ratio per run
#   campaign.txt  the command, the commit and the base it was measured against
#
# BENCH_BASE=<git rev> is passed to every step (see bench/run.sh). About 50 minutes
# with BENCH_RUNS=1; with 3 runs about 105 (28 each, then 20 for the cluster scale).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUNS="${BENCH_RUNS:-3}"
CAMPAIGN="${BENCH_CAMPAIGN:-$bench_dir/results}"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || cw_die "BENCH_RUNS must be a positive count, not '$RUNS'"

# The last campaign's generated files go; history.md (the figures campaign by campaign,
# written by hand) stays.
mkdir -p "$CAMPAIGN"
find "$CAMPAIGN" -mindepth 1 -maxdepth 1 ! -name history.md -exec rm -rf {} +
{
	echo "command: BENCH_RUNS=$RUNS BENCH_SCALE=${BENCH_SCALE:-1} BENCH_BASE=${BENCH_BASE:-} make bench"
	echo "commit: $(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet -- ':!bench' ':!BENCHMARKS.md' ':!Makefile' || echo ' (product code modified)')"
	echo "base: ${BENCH_BASE:-none}"
	echo "started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} | tee "$CAMPAIGN/campaign.txt"

dirs=()
for ((i = 1; i <= RUNS; i++)); do
	step "campaign run $i of $RUNS (bench/run.sh)"
	BENCH_SCALE=0 BENCH_STEP_PREFIX="run $i/$RUNS: " BENCH_RESULTS="$CAMPAIGN/run$i" bash "$bench_dir/run.sh"
	dirs+=("$CAMPAIGN/run$i")
done

if [[ ${BENCH_SCALE:-1} != 0 ]]; then
	step "cluster scale (bench/scale.sh), on a control plane of its own"
	BENCH_SCALE_BASE="${BENCH_SCALE_BASE:-${BENCH_BASE:-}}" BENCH_RESULTS="$CAMPAIGN/scale" bash "$bench_dir/scale.sh"
fi

step "go test -bench of the product's packages"
(cd "$repo" && go test -run '^$' -bench . -benchmem ./...) | tee "$CAMPAIGN/go-bench.txt"

step "spread over the $RUNS runs"
(IFS=,; cd "$bench_dir/tool" && go run . spread -dirs "${dirs[*]}") | tee "$CAMPAIGN/spread.md"
echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$CAMPAIGN/campaign.txt"
cw_log "campaign finished in $(cw_elapsed $((SECONDS - bench_start))); results: $CAMPAIGN"
