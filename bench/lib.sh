# shellcheck shell=bash
# The preamble the bench scripts share: hack/lib.sh, the tools they need, where
# results go, and progress lines. Source it; do not run it.
#
#   BENCH_RESULTS   where raw results and charts go (default bench/results)

bench_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$bench_dir")"
# shellcheck source=hack/lib.sh
source "$repo/hack/lib.sh"

# For the scripts that source this file:
# shellcheck disable=SC2034
RESULTS="${BENCH_RESULTS:-$bench_dir/results}"
# shellcheck disable=SC2034
bench_start=$SECONDS

for tool in curl jq python3; do
	command -v "$tool" >/dev/null || cw_die "$tool not found (apt-get install $tool)"
done

# step WHAT prints a progress line with the time of day (and BENCH_STEP_PREFIX, if set).
step() { printf '\n==> [%s] %s%s\n' "$(date -u +%H:%M:%S)" "${BENCH_STEP_PREFIX:-}" "$*"; }
