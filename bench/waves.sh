#!/usr/bin/env bash
# Restarts in waves: what MAX_UNAVAILABLE costs in time, and what it saves in Ready pods.
# config-watcher (this tree) with each MAX_UNAVAILABLE of BENCH_WAVES_SETTINGS ("25% 100%"),
# in the same run, on the same control plane:
#
#   rollout  a Deployment of BENCH_WAVES_REPLICAS (100) pods whose pods become Ready
#            BENCH_WAVES_READY_AFTER (1s) after they appear (benchtool standin, playing the
#            kubelet through pods/NAME/status: no kubelet here); one data change; time from
#            the change's completion (audit log) until every selected pod is a new one and
#            Ready; the lowest Ready count a pod watch showed meanwhile; the first pod DELETE
#            after the change (audit log). BENCH_WAVES_RUNS (5) rollouts per setting, the
#            settings taking turns, the controller started afresh for each.
#            Then, as a reference row, the Deployment's own rolling update of the same pods
#            (its pod template changed, as kubectl rollout restart does; maxSurge 0,
#            maxUnavailable 25 %), taking turns with the settings.
#   latency  the reaction latency scenario of bench/run.sh (a Deployment's one Ready pod, BENCH_WAVES_CHANGES
#            (20) changes one at a time) per setting, in passes of BENCH_WAVES_PASS (5), the
#            settings taking turns: the first restart's latency.
#
# A scripted measurement, not a test. Prints progress, then a table, also written with the
# raw rows to $BENCH_RESULTS/waves/ (alone: bench/results/alone/waves/).
#
#   bench/waves.sh (make bench-waves)  on a fresh control plane of its own, about 5 minutes
#   called by bench/run.sh             on run.sh's control plane, with its binaries (BENCH_WORK)
#   BENCH_WAVES_BASE=main bench/waves.sh   config-watcher as built from that revision instead
#                                          of this tree: the same scenario, before a change
set -euo pipefail

BENCH_STEP_PREFIX="waves: "
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
read -r -a SETTINGS <<<"${BENCH_WAVES_SETTINGS:-25% 100%}"
REPLICAS="${BENCH_WAVES_REPLICAS:-100}"
READY_AFTER="${BENCH_WAVES_READY_AFTER:-1s}"
RUNS="${BENCH_WAVES_RUNS:-5}"
CHANGES="${BENCH_WAVES_CHANGES:-20}"
PASS="${BENCH_WAVES_PASS:-5}"

sub_work waves
ctrl_pid=""    # the controller: a session leader (benchtool spawn)
standin_pid="" # benchtool standin
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$?
	stop_ctrl
	[[ -z $standin_pid ]] || kill -TERM "$standin_pid" 2>/dev/null || true
	sub_finish "$rc" waves
}
# stop_ctrl: SIGTERM to the controller's session, SIGKILL after 10 s. Only what we started.
stop_ctrl() {
	[[ -n $ctrl_pid ]] || return 0
	stop_session "$ctrl_pid"
	ctrl_pid=""
}
trap cleanup EXIT

BASE="${BENCH_WAVES_BASE:-}"
cw="$work/config-watcher"
step "building config-watcher${BASE:+ at $BASE} and bench/tool"
if [[ -n $BASE ]]; then
	cw="$work/config-watcher-waves-base"
	build_at "$BASE" "$cw"
else
	[[ -x $cw ]] || (cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cw" .)
fi
[[ -x $work/benchtool ]] || (cd "$bench_dir/tool" && go build -o "$work/benchtool" .)

sub_cluster waves
api=$CW_PROXY_URL
bt() { "$work/benchtool" "$@"; }

out="$RESULTS/waves"
rm -rf "$out"
mkdir -p "$out"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	if [[ -n $BASE ]]; then
		echo "config-watcher: built from $BASE ($(git -C "$repo" rev-parse --short "$BASE")); bench/tool from $(git -C "$repo" rev-parse --short HEAD)"
	else
		echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet -- ':!bench' ':!BENCHMARKS.md' ':!Makefile' 2>/dev/null || echo ' (product code modified)')"
	fi
	echo "settings: MAX_UNAVAILABLE ${SETTINGS[*]}; $REPLICAS replicas Ready after $READY_AFTER; $RUNS rollouts and $CHANGES single-pod changes per setting; other settings default"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

# launch SETTING NS LOG: config-watcher with MAX_UNAVAILABLE=SETTING watching NS, ready and quiet.
launch() {
	local port
	port=$(cw_free_port)
	env MAX_UNAVAILABLE="$1" WATCH_NAMESPACE="$2" API_URL="$api" HTTP_ADDR="127.0.0.1:$port" \
		"$work/benchtool" spawn -controller "config-watcher MAX_UNAVAILABLE=$1" -log "$work/$3" -pidfile "$work/waves-ctrl.pid" \
		-ready "http://127.0.0.1:$port/readyz" -- "$cw" >/dev/null
	ctrl_pid=$(<"$work/waves-ctrl.pid")
	bt quiesce -pid "$ctrl_pid" >/dev/null # the ConfigMap adopted (its data recorded)
}

ns=bench-waves
step "a Deployment of $REPLICAS pods in $ns, Ready $READY_AFTER after they appear (benchtool standin), and the annotated ConfigMap"
bt ns -api "$api" -ns "$ns"
curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' "$api/apis/apps/v1/namespaces/$ns/deployments" -d @- <<EOF
{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"webapp"},
 "spec":{"replicas":$REPLICAS,"selector":{"matchLabels":{"app":"webapp"}},
  "strategy":{"type":"RollingUpdate","rollingUpdate":{"maxSurge":0,"maxUnavailable":"25%"}},
  "template":{"metadata":{"labels":{"app":"webapp"}},
   "spec":{"containers":[{"name":"webapp","image":"k8spatterns/mini-http-server"}]}}}}
EOF
curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' "$api/api/v1/namespaces/$ns/configmaps" \
	-d '{"metadata":{"name":"webapp-config","annotations":{"k8spatterns.io/podDeleteSelector":"app=webapp"}},"data":{"message":"hello"}}'
"$work/benchtool" standin -api "$api" -ns "$ns" -selector app=webapp -delay "$READY_AFTER" >"$work/standin.log" 2>&1 &
standin_pid=$!

# The reference row: the Deployment's own rolling update of the same pods (kubectl rollout
# restart: its pod template changed), maxSurge 0 and maxUnavailable 25 %, no config-watcher.
reference="Deployment rolling update (maxSurge 0 maxUnavailable 25%)"
step "rolling $REPLICAS pods: $RUNS rollouts per setting (${SETTINGS[*]}) and of the Deployment itself, taking turns"
for ((run = 1; run <= RUNS; run++)); do
	for s in "${SETTINGS[@]}"; do
		launch "$s" "$ns" "rollout-${s%\%}-$run.log"
		bt rollout -api "$api" -ns "$ns" -audit "$CW_AUDIT_LOG" -replicas "$REPLICAS" -setting "$s" -run "$run" -results "$out"
		bt quiesce -pid "$ctrl_pid" >/dev/null # the round's record written
		stop_ctrl
	done
	bt rollout -api "$api" -ns "$ns" -audit "$CW_AUDIT_LOG" -replicas "$REPLICAS" -setting "$reference" -run "$run" -results "$out" -trigger deployment
done

# In passes of PASS changes, the settings taking turns, so that the machine's other load
# falls on both alike; each pass in a namespace of its own (the scenario pairs every PATCH
# of its namespace with a DELETE).
step "first-restart latency: $CHANGES changes of a Deployment's one pod per setting, $PASS at a time, taking turns (the reaction latency scenario)"
for ((pass = 1, made = 0; made < CHANGES; pass++, made += PASS)); do
	for s in "${SETTINGS[@]}"; do
		lns="bench-waves-lat-${s%\%}-$pass"
		bt ns -api "$api" -ns "$lns"
		bt latency -setup -api "$api" -ns "$lns"
		launch "$s" "$lns" "latency-${s%\%}-$pass.log"
		bt latency -api "$api" -ns "$lns" -audit "$CW_AUDIT_LOG" -n $((CHANGES - made < PASS ? CHANGES - made : PASS)) \
			-controller "$s" -results "$out"
		stop_ctrl
	done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"

step "results ($out)"
bt waves-summary -dir "$out" -base "${SETTINGS[-1]}" -ready-after "$READY_AFTER" | tee "$out/summary.md"
cw_log "waves bench finished in $(cw_elapsed $((SECONDS - bench_start)))"
