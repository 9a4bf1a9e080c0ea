#!/usr/bin/env bash
# The side-by-side measurement (`make bench`): config-watcher against the
# book's curl+jq script (bench/shell/) and a client-go informer controller
# (bench/informer/), on a fresh local control plane of its own (hack/cluster.sh, in a
# new state dir, stopped at the end), all through the same kubectl proxy.
# A scripted measurement, not a test: it prints progress and a table, and writes
# the raw results and a chart to $BENCH_RESULTS (a run of bench/campaign.sh).
#
#   latency  each controller alone, in its own namespace: BENCH_CHANGES data changes
#            (default 40), one at a time, of a ConfigMap selecting a Deployment's one Ready
#            pod, another client making a consistent pod LIST just before each (as on any
#            busy cluster); PATCH completed -> first pod DELETE received, both from the
#            apiserver audit log (µs). The informer is run twice: as it is (pods LISTed
#            from the API on each change) and with a pod informer (INFORMER_POD_CACHE)
#   idle     the three, still running, over BENCH_IDLE_SECONDS (60) without changes:
#            utime+stime of the controller's whole session (/proc/PID/stat); RSS then
#   burst    BENCH_BURST (500) annotated ConfigMaps, each selecting its own bare pod,
#            changed at once (the informer both ways, and BENCH_BASE if set); every pod deleted exactly once? time to the last DELETE
#   memory   5,000 then 20,000 ConfigMaps of 1 KiB (half annotated) in one namespace:
#   + start  exec -> /readyz 200, then RSS (VmRSS, VmHWM) once the process is quiet;
#            the informer also made to read JSON (INFORMER_JSON=true), for the start.
#            Not for the script: it has no readiness, and replaying 20,000 ADDED events
#            through jq takes minutes of CPU (it keeps nothing, so its RSS is the idle one)
#   size     CGO_ENABLED=0 go build -trimpath -ldflags "-s -w"
#   base     with BENCH_BASE=<git rev>: config-watcher built from that revision, measured
#            in the latency step next to this tree's (and the default of memory.sh's
#            BENCH_MEM_BEFORE and scale.sh's BENCH_SCALE_BASE), so that a change is
#            measured against what it replaces in the same run
#   volume   bench/memory.sh: peak and steady RSS against 0 to 180 MB of ConfigMaps
#            (900 KB each), config-watcher (and built from main) against the informer;
#            then 5,000 Secrets and 5,000 ConfigMaps watched together (WATCH_SECRETS=true),
#            against the informer watching both kinds
#   waves    bench/waves.sh: 100 Deployment pods made Ready 1 s after they appear, rolled
#            with MAX_UNAVAILABLE=25% and 100%: rollout time, lowest Ready count, first restart
#   coalesce bench/coalesce.sh: restarts per pod, config-watcher beside the informer, for three
#            ConfigMaps over 12 pods changed within 0.2 s (config-watcher with SETTLE=1s and
#            0s) and for a storm (one ConfigMap over 4 pods changed every second for 30 s;
#            STORM_CHANGES=5, STORM_WINDOW=1m: until every pod is on the last data)
#
# About 24 minutes on 2 cores. Needs what `make test` needs, plus curl and jq.
#
# bench/campaign.sh (`make bench`) runs this several times, then bench/scale.sh (RSS, start
# and API load with WATCH_NAMESPACE=* against the cluster's pods, 0 to 50,000).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHANGES="${BENCH_CHANGES:-40}"
BURST="${BENCH_BURST:-500}"
IDLE_SECONDS="${BENCH_IDLE_SECONDS:-60}"
MEM_SMALL="${BENCH_MEM_SMALL:-5000}"
MEM_LARGE="${BENCH_MEM_LARGE:-20000}"
CONTROLLERS=(config-watcher informer shell)
BASE="${BENCH_BASE:-}"


work=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-bench.XXXXXX")
export CW_STATE_DIR
CW_STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-bench-cluster.XXXXXX")
declare -A PID=()

# stop NAME: stops controller NAME's session (lib.sh stop_session).
stop() {
	[[ -n ${PID[$1]:-} ]] || return 0
	stop_session "${PID[$1]}"
	unset "PID[$1]"
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$? c
	for c in "${!PID[@]}"; do stop "$c"; done
	"$repo/hack/cluster.sh" down >/dev/null 2>&1 || true
	if ((rc != 0)); then
		cw_log "bench failed (exit $rc); controller logs kept in $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT


# start NAME NS [START_METRIC]: runs controller NAME watching NS through the proxy.
# With START_METRIC (and a readiness endpoint), records exec -> /readyz 200.
start() {
	local name=$1 ns=$2 metric=${3:-} port ready=() cmd
	port=$(cw_free_port)
	case $name in
	# The latency step changes one ConfigMap every second or so, a storm by
	# default (more than 5 a minute): it measures the reaction to each.
	config-watcher) cmd=(env STORM_CHANGES=0 "$work/config-watcher") ;;
	config-watcher-base) cmd=("$work/config-watcher-base") ;;
	informer) cmd=("$work/informer") ;;
	informer-json) cmd=(env INFORMER_JSON=true "$work/informer") ;;
	informer-podcache) cmd=(env INFORMER_POD_CACHE=true "$work/informer") ;;
	shell) cmd=(bash "$bench_dir/shell/config-watcher-controller.sh") ;;
	floor) cmd=("$work/benchtool" floor) ;;
	esac
	[[ $name == shell || $name == floor ]] || ready=(-ready "http://127.0.0.1:$port/readyz")
	[[ -z $metric ]] || ready+=(-results "$RESULTS" -metric "$metric")
	env WATCH_NAMESPACE="$ns" API_URL="$CW_PROXY_URL" HTTP_ADDR="127.0.0.1:$port" \
		"$work/benchtool" spawn -controller "$name" -log "$work/$name-$ns.log" -pidfile "$work/$name.pid" \
		"${ready[@]}" -- "${cmd[@]}"
	PID[$name]=$(<"$work/$name.pid")
	# The script and the floor have no readiness signal: give their watch time to open.
	[[ $name != shell && $name != floor ]] || sleep 2
}

bt() { "$work/benchtool" "$@"; }

mkdir -p "$RESULTS"
rm -f "$RESULTS/latency.csv" "$RESULTS/metrics.csv" "$RESULTS/metrics.csv.tmp" "$RESULTS/summary.md" "$RESULTS/latency.png"

step "machine"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "nproc: $(nproc)"
	echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
	echo "kernel: $(uname -sr)"
	echo "go: $(go version)"
	echo "memory: $(sed -n 's/^MemTotal:[[:space:]]*//p' /proc/meminfo)"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet -- ':!bench' ':!BENCHMARKS.md' ':!Makefile' 2>/dev/null || echo ' (product code modified)')"
} | tee "$RESULTS/machine.txt"

step "building the three controllers (stripped static binaries) and bench/tool"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/config-watcher" .)
(cd "$bench_dir/informer" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/informer" .)
(cd "$bench_dir/tool" && go build -o "$work/benchtool" .)
if [[ -n $BASE ]]; then
	build_at "$BASE" "$work/config-watcher-base"
	echo "base: config-watcher at $BASE ($(git -C "$repo" rev-parse --short "$BASE"))" | tee -a "$RESULTS/machine.txt"
fi
for c in config-watcher informer; do
	size=$(stat -c %s "$work/$c")
	printf '  %s: %d bytes\n' "$c" "$size"
	mb=$(awk -v s="$size" 'BEGIN { printf "%.3f", s / 1e6 }')
	echo "$c,size,$mb,MB" >>"$RESULTS/metrics.csv.tmp"
done

step "starting a fresh control plane (state dir $CW_STATE_DIR)"
"$repo/hack/cluster.sh" up
eval "$("$repo/hack/cluster.sh" env)"
echo "apiserver: $(curl -fsS "$CW_PROXY_URL/version" | jq -r .gitVersion), kubectl proxy $CW_PROXY_URL" | tee -a "$RESULTS/machine.txt"

step "reaction latency: $CHANGES data changes per controller, one controller at a time, then the floor"
# The floor (benchtool floor) only DELETEs on each event: what the server, the proxy and
# the machine cost by themselves, measured the same way.
# The base, if any, right after this tree's build: the machine's load drifts over the step.
for c in config-watcher ${BASE:+config-watcher-base} informer informer-podcache shell floor; do
	ns="bench-lat-$c"
	bt ns -api "$CW_PROXY_URL" -ns "$ns"
	bt latency -setup -api "$CW_PROXY_URL" -ns "$ns"
	start "$c" "$ns"
	sleep 2 # config-watcher adopts the ConfigMap (records its digest) first
	echo "  $c: measuring in namespace $ns"
	bt latency -api "$CW_PROXY_URL" -ns "$ns" -audit "$CW_AUDIT_LOG" -n "$CHANGES" -controller "$c" -results "$RESULTS"
	[[ $c != config-watcher-base && $c != informer-podcache ]] || stop "$c" # the idle step measures the three
done

stop floor

step "idle: CPU used by the three over ${IDLE_SECONDS}s with no change (all three still running)"
bt idle -seconds "$IDLE_SECONDS" -results "$RESULTS" \
	-pids "config-watcher=${PID[config-watcher]},informer=${PID[informer]},shell=${PID[shell]}"
for c in "${CONTROLLERS[@]}"; do
	bt mem -pid "${PID[$c]}" -controller "$c" -results "$RESULTS" -metric idle
	stop "$c"
done

step "burst: $BURST annotated ConfigMaps, each selecting its own pod, changed at once"
for c in config-watcher ${BASE:+config-watcher-base} informer shell informer-podcache; do
	ns="bench-burst-$c"
	bt ns -api "$CW_PROXY_URL" -ns "$ns"
	bt burst -setup -api "$CW_PROXY_URL" -ns "$ns" -n "$BURST"
	start "$c" "$ns"
	bt quiesce -pid "${PID[$c]}" # initial sync done (config-watcher: $BURST adoptions recorded)
	bt burst -api "$CW_PROXY_URL" -ns "$ns" -audit "$CW_AUDIT_LOG" -n "$BURST" -controller "$c" -results "$RESULTS"
	bt mem -pid "${PID[$c]}" -controller "$c" -results "$RESULTS" -metric burst
	stop "$c"
done

# The kubectl proxy in front of it all is the ambassador of the manifests (the same
# kubectl version): its RSS once it has carried the latency and burst steps' traffic.
bt mem -pid "$(<"$CW_STATE_DIR/kubectl-proxy.pid")" -controller ambassador -results "$RESULTS" -metric proxy

step "memory and start: $MEM_SMALL ConfigMaps of 1 KiB, half annotated"
ns=bench-mem
bt ns -api "$CW_PROXY_URL" -ns "$ns"
bt create -api "$CW_PROXY_URL" -ns "$ns" -n "$MEM_SMALL"
for c in config-watcher informer informer-json; do
	start "$c" "$ns" start5k
	bt quiesce -pid "${PID[$c]}"
	bt mem -pid "${PID[$c]}" -controller "$c" -results "$RESULTS" -metric rss5k
	stop "$c"
done

step "memory and start: $MEM_LARGE ConfigMaps"
bt create -api "$CW_PROXY_URL" -ns "$ns" -from "$MEM_SMALL" -n $((MEM_LARGE - MEM_SMALL))
for c in config-watcher informer informer-json; do
	start "$c" "$ns" start20k
	bt quiesce -pid "${PID[$c]}"
	bt mem -pid "${PID[$c]}" -controller "$c" -results "$RESULTS" -metric rss20k
	stop "$c"
done

# memory.sh's WATCH_NAMESPACE=* row must see its own ConfigMaps only, not these 20,000.
step "deleting namespace $ns and its $MEM_LARGE ConfigMaps"
curl -fsS -X DELETE "$CW_PROXY_URL/api/v1/namespaces/$ns" >/dev/null
for ((i = 0; ; i++)); do
	[[ $(curl -s -o /dev/null -w '%{http_code}' "$CW_PROXY_URL/api/v1/namespaces/$ns") != 404 ]] || break
	((i < 300)) || { echo "namespace $ns still there after 300 s" >&2; exit 1; }
	sleep 1
done

step "memory against volume: 0 to 180 MB of ConfigMaps; Secrets and ConfigMaps together (bench/memory.sh)"
BENCH_MEM_BEFORE="${BENCH_MEM_BEFORE-${BASE:-main}}" BENCH_WORK="$work" BENCH_RESULTS="$RESULTS" "$bench_dir/memory.sh"

step "restarts in waves: MAX_UNAVAILABLE=25% against 100% (bench/waves.sh)"
BENCH_WORK="$work" BENCH_RESULTS="$RESULTS" "$bench_dir/waves.sh"

step "changes together and a storm: restarts per pod, config-watcher and the informer (bench/coalesce.sh)"
BENCH_WORK="$work" BENCH_RESULTS="$RESULTS" "$bench_dir/coalesce.sh"

# metrics.csv got its header from the first benchtool row; the sizes go last.
cat "$RESULTS/metrics.csv.tmp" >>"$RESULTS/metrics.csv"
rm -f "$RESULTS/metrics.csv.tmp"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RESULTS/machine.txt"

step "results ($RESULTS)"
bt chart -in "$RESULTS/latency.csv" -out "$RESULTS/latency.png"
bt summary -dir "$RESULTS" | tee "$RESULTS/summary.md"

cw_log "bench finished in $(cw_elapsed $((SECONDS - bench_start))); raw data: $RESULTS/{latency.csv,metrics.csv,machine.txt}, chart: $RESULTS/latency.png, restarts per pod: $RESULTS/coalesce/summary.md"
