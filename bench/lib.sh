# shellcheck shell=bash
# The preamble the bench scripts share: hack/lib.sh, the tools they need, where
# results go, and progress lines. Source it; do not run it.
#
#   BENCH_RESULTS   where raw results and charts go: set by bench/campaign.sh; a script run
#                   alone writes to bench/results/alone (not kept in git)

bench_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$bench_dir")"
# shellcheck source=hack/lib.sh
source "$repo/hack/lib.sh"

# For the scripts that source this file:
# shellcheck disable=SC2034
RESULTS="${BENCH_RESULTS:-$bench_dir/results/alone}"
# shellcheck disable=SC2034
bench_start=$SECONDS

for tool in curl jq python3; do
	command -v "$tool" >/dev/null || cw_die "$tool not found (apt-get install $tool)"
done

# step WHAT prints a progress line with the time of day (and BENCH_STEP_PREFIX, if set).
step() { printf '\n==> [%s] %s%s\n' "$(date -u +%H:%M:%S)" "${BENCH_STEP_PREFIX:-}" "$*"; }

# stop_session PID: SIGTERM to the session PID leads (benchtool spawn makes each controller
# a session leader: a script's curl and jq go with it), SIGKILL after 10 s. Only what a
# script started, by pid.
stop_session() {
	local i
	kill -TERM -- "-$1" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
	kill -KILL -- "-$1" 2>/dev/null || true
}

# build_at REV OUT builds config-watcher as it was at git revision REV into OUT, as the
# bench builds this tree. From the object database (git archive): no checkout, no other
# worktree touched.
build_at() {
	local src
	src=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-src.XXXXXX")
	git -C "$repo" archive "$1" | tar -x -C "$src"
	(cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$2" .)
	rm -rf "$src"
}

# The scripts run.sh also calls (memory.sh, waves.sh, coalesce.sh) run on run.sh's control plane with its
# binaries (BENCH_WORK), or alone on their own. For the latter:
#
# sub_work NAME sets work to BENCH_WORK, or to a new dir of this script's own (own_work=1).
sub_work() {
	own_work="" own_cluster=""
	work="${BENCH_WORK:-}"
	if [[ -z $work ]]; then
		work=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-bench-$1.XXXXXX")
		own_work=1
	fi
}

# sub_cluster NAME starts a fresh control plane (own_cluster=1) unless run.sh's is in the
# environment (CW_PROXY_URL), and sets its environment.
sub_cluster() {
	[[ -z ${CW_PROXY_URL:-} ]] || return 0
	export CW_STATE_DIR
	CW_STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-bench-$1-cluster.XXXXXX")
	own_cluster=1
	step "starting a fresh control plane (state dir $CW_STATE_DIR)"
	"$repo/hack/cluster.sh" up
	eval "$("$repo/hack/cluster.sh" env)"
}

# sub_finish RC NAME, for the EXIT trap once the script's processes are stopped: stops its
# own control plane; removes its own work dir, unless RC says it failed (then says where).
sub_finish() {
	[[ -z $own_cluster ]] || "$repo/hack/cluster.sh" down >/dev/null 2>&1 || true
	if (($1 != 0)); then
		cw_log "$2 bench failed (exit $1); logs kept in $work"
	elif [[ -n $own_work ]]; then
		rm -rf "$work"
	fi
}
