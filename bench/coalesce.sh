#!/usr/bin/env bash
# Changes that arrive together, and a storm: restarts per pod, config-watcher (this tree)
# beside the informer (bench/informer: it restarts on every change), in the same run, on
# the same control plane; each run in a namespace of its own, the controller started
# afresh (after the ConfigMaps exist: config-watcher adopts them), pods made Ready
# BENCH_COALESCE_READY_AFTER (1s) after they appear (benchtool standin, as in waves.sh).
# A pod deletion is a successful pod DELETE of the controller's in the audit log, as the
# burst step counts them; a pod is on the last data if it was created after the last change.
#
#   overlapping  a Deployment of BENCH_COALESCE_REPLICAS (12) pods selected by three annotated
#                ConfigMaps, all three changed within 0.2 s; config-watcher with SETTLE=1s and
#                with its default SETTLE=0s; pod deletions per pod (ideal 1.0), and the time
#                from the last change until every pod is new and Ready. BENCH_COALESCE_RUNS (3)
#                runs each, the controllers taking turns
#   storm        one ConfigMap over BENCH_COALESCE_STORM_PODS (4) Ready pods changed every second,
#                BENCH_COALESCE_STORM_CHANGES (30) times; config-watcher with STORM_CHANGES=5 and
#                STORM_WINDOW=BENCH_COALESCE_STORM_WINDOW (1m, its default), watched until a round
#                after the storm has ended (STORM_WINDOW after the last change); pod deletions per
#                pod during the changes and until every pod is on the last data, and whether it
#                ended so. BENCH_COALESCE_STORM_RUNS (1) runs each
#
# A scripted measurement, not a test. Prints progress, then a table, also written with the
# raw rows to $BENCH_RESULTS/coalesce/ (alone: bench/results/alone/coalesce/).
#
#   bench/coalesce.sh (make bench-coalesce)  on a fresh control plane of its own, about 6 minutes
#   called by bench/run.sh                   on run.sh's control plane, with its binaries (BENCH_WORK)
set -euo pipefail

BENCH_STEP_PREFIX="coalesce: "
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPLICAS="${BENCH_COALESCE_REPLICAS:-12}"
RUNS="${BENCH_COALESCE_RUNS:-3}"
STORM_PODS="${BENCH_COALESCE_STORM_PODS:-4}"
STORM_N="${BENCH_COALESCE_STORM_CHANGES:-30}"
STORM_WINDOW="${BENCH_COALESCE_STORM_WINDOW:-1m}"
STORM_RUNS="${BENCH_COALESCE_STORM_RUNS:-1}"
READY_AFTER="${BENCH_COALESCE_READY_AFTER:-1s}"

sub_work coalesce
ctrl_pid=""    # the controller: a session leader (benchtool spawn)
standin_pid="" # benchtool standin of the run's namespace
# stop_ctrl: SIGTERM to the controller's session, SIGKILL after 10 s; then the stand-in. Only what we started.
stop_ctrl() {
	if [[ -n $ctrl_pid ]]; then
		stop_session "$ctrl_pid"
		ctrl_pid=""
	fi
	if [[ -n $standin_pid ]]; then
		kill -TERM "$standin_pid" 2>/dev/null || true
		wait "$standin_pid" 2>/dev/null || true
		standin_pid=""
	fi
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$?
	stop_ctrl
	sub_finish "$rc" coalesce
}
trap cleanup EXIT

step "building config-watcher, the informer and bench/tool"
[[ -x $work/config-watcher ]] || (cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/config-watcher" .)
[[ -x $work/informer ]] || (cd "$bench_dir/informer" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/informer" .)
[[ -x $work/benchtool ]] || (cd "$bench_dir/tool" && go build -o "$work/benchtool" .)

sub_cluster coalesce
api=$CW_PROXY_URL
bt() { "$work/benchtool" "$@"; }

out="$RESULTS/coalesce"
rm -rf "$out"
mkdir -p "$out"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet -- ':!bench' ':!BENCHMARKS.md' ':!Makefile' 2>/dev/null || echo ' (product code modified)')"
	echo "overlapping: $REPLICAS pods Ready after $READY_AFTER, 3 ConfigMaps changed within 0.2 s, $RUNS runs each"
	echo "storm: $STORM_PODS pods, one ConfigMap changed every 1 s, $STORM_N times; config-watcher with STORM_CHANGES=5 STORM_WINDOW=$STORM_WINDOW; $STORM_RUNS runs each"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

# one SCENARIO RUN SLUG NAME PODS CMS HOLD ENV...: a namespace of its own with a Deployment of PODS
# pods and CMS annotated ConfigMaps, its stand-in, the controller (config-watcher with the
# settings ENV, or the informer if SLUG is informer), then the scenario's changes and count.
one() {
	local scenario=$1 run=$2 slug=$3 name=$4 pods=$5 cms=$6 hold=$7 port ns cmd
	shift 7
	ns="bench-coal-$scenario-$slug-$run"
	bt ns -api "$api" -ns "$ns"
	bt coalesce -setup -api "$api" -ns "$ns" -replicas "$pods" -cms "$cms"
	"$work/benchtool" standin -api "$api" -ns "$ns" -selector app=webapp -delay "$READY_AFTER" >>"$work/standin.log" 2>&1 &
	standin_pid=$!
	cmd=("$work/config-watcher")
	[[ $slug != informer ]] || cmd=("$work/informer")
	port=$(cw_free_port)
	env "$@" WATCH_NAMESPACE="$ns" API_URL="$api" HTTP_ADDR="127.0.0.1:$port" \
		"$work/benchtool" spawn -controller "$name" -log "$work/$ns.log" -pidfile "$work/coalesce-ctrl.pid" \
		-ready "http://127.0.0.1:$port/readyz" -- "${cmd[@]}" >/dev/null
	ctrl_pid=$(<"$work/coalesce-ctrl.pid")
	bt quiesce -pid "$ctrl_pid" >/dev/null # config-watcher: the ConfigMaps adopted
	local changes=(-cms 3 -changes 1 -spread 200ms)
	[[ $scenario != storm ]] || changes=(-cms 1 -changes "$STORM_N" -interval 1s)
	bt coalesce -api "$api" -ns "$ns" -audit "$CW_AUDIT_LOG" -scenario "$scenario" -controller "$name" -run "$run" \
		-replicas "$pods" "${changes[@]}" -hold "$hold" -results "$out"
	stop_ctrl
	curl -fsS -o /dev/null -X DELETE "$api/api/v1/namespaces/$ns" || true # not waited for
}

step "overlapping: $REPLICAS pods, 3 ConfigMaps changed within 0.2 s; config-watcher SETTLE=1s and 0s, the informer; $RUNS runs, taking turns"
for ((run = 1; run <= RUNS; run++)); do
	one overlapping "$run" cw-settle1 "config-watcher SETTLE=1s" "$REPLICAS" 3 0s SETTLE=1s
	one overlapping "$run" cw-settle0 "config-watcher SETTLE=0s" "$REPLICAS" 3 0s SETTLE=0s
	one overlapping "$run" informer informer "$REPLICAS" 3 0s
done

step "storm: one ConfigMap over $STORM_PODS pods changed every second, $STORM_N times; config-watcher STORM_WINDOW=$STORM_WINDOW (watched until a round after the storm), the informer"
for ((run = 1; run <= STORM_RUNS; run++)); do
	one storm "$run" cw config-watcher "$STORM_PODS" 1 "$STORM_WINDOW" STORM_CHANGES=5 STORM_WINDOW="$STORM_WINDOW"
	one storm "$run" informer informer "$STORM_PODS" 1 0s
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"

step "results ($out)"
{
	echo "Overlapping: a Deployment of $REPLICAS pods, Ready $READY_AFTER after they appear, selected by three annotated ConfigMaps changed within 0.2 s ($RUNS runs)."
	echo "Storm: one ConfigMap over $STORM_PODS Ready pods changed every second, $STORM_N times; config-watcher with STORM_CHANGES=5, STORM_WINDOW=$STORM_WINDOW ($STORM_RUNS runs)."
	echo "A pod deletion: a successful pod DELETE of the controller (audit log); on the last data: created after the last change."
	echo
	bt coalesce-summary -dir "$out"
} | tee "$out/summary.md"
cw_log "coalesce bench finished in $(cw_elapsed $((SECONDS - bench_start)))"
