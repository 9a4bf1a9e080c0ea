#!/usr/bin/env bash
# Cluster scale: one controller watching every namespace (WATCH_NAMESPACE=*)
# while the cluster's pods grow, on a fresh control plane of its own (hack/cluster.sh in a
# new state dir, stopped at the end). A scripted measurement, not a test: it prints
# progress and a table, and writes $BENCH_RESULTS/scale.csv.
#
# The cluster: BENCH_SCALE_NS (50) namespaces; in the first, a Deployment of
# BENCH_SCALE_SELECTED (100) pods and the one annotated ConfigMap, selecting them; every
# other pod is a bare pod of three labels that no selector matches. Pods stay Pending (no
# node): the controllers see their metadata all the same. For each total in
# BENCH_SCALE_PODS ("0 10000 50000"; the selected pods count, so 0 means only them),
# spread evenly over the namespaces, each controller
# runs alone, through its own counting proxy (benchtool meter) in front of kubectl proxy:
#
#   start   exec -> /readyz 200 (ms); requests and KiB read until it is quiet
#   rss     VmRSS once quiet after the start, and VmHWM (the peak) by then
#   change  one data change of the ConfigMap: requests and KiB read until every selected
#           pod is replaced and the controller is quiet again
# then, at the largest size, all of them together, quiet (no change is made):
#   idle    requests and KiB read over BENCH_SCALE_IDLE seconds (900) and per hour
#           (scale-idle.csv). Watches end at the server's timeout, 5-10 min, and are
#           opened again: the window must be longer than that to see it.
# KiB are on the wire: the API server gzips responses over 128 KiB.
#
# Controllers: config-watcher with the pod index (POD_INDEX=true, the default) and without
# (POD_INDEX=false), the client-go informer baseline (bench/informer), and, with
# BENCH_SCALE_BASE=<git rev> (e.g. main), config-watcher as built from that revision, so a
# change is measured against what it replaces in the same run.
#
# About 20 minutes on 2 cores with the defaults. Needs curl, jq, python3.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NAMESPACES="${BENCH_SCALE_NS:-50}"
SELECTED="${BENCH_SCALE_SELECTED:-100}"
read -r -a STEPS <<<"${BENCH_SCALE_PODS:-0 10000 50000}"
IDLE="${BENCH_SCALE_IDLE:-900}"
BASE="${BENCH_SCALE_BASE:-}"
ANNOTATION=k8spatterns.io/podDeleteSelector

work=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-scale.XXXXXX")
export CW_STATE_DIR
CW_STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-scale-cluster.XXXXXX")
declare -A CTRL=() METER=()

# stop_ctrl NAME: SIGTERM to the controller's session, SIGKILL after 10 s; then its
# meter. Only what this script started, by pid.
stop_ctrl() {
	local name=$1
	if [[ -n ${CTRL[$name]:-} ]]; then
		stop_session "${CTRL[$name]}"
		unset "CTRL[$name]"
	fi
	if [[ -n ${METER[$name]:-} ]]; then
		kill "${METER[$name]}" 2>/dev/null || true
		wait "${METER[$name]}" 2>/dev/null || true
		unset "METER[$name]"
	fi
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$? c
	for c in "${!CTRL[@]}" "${!METER[@]}"; do stop_ctrl "$c"; done
	"$repo/hack/cluster.sh" down >/dev/null 2>&1 || true
	if ((rc != 0)); then
		cw_log "scale bench failed (exit $rc); controller logs kept in $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

bt() { "$work/benchtool" "$@"; }
ns_name() { printf 'scale-%02d' "$1"; }

step "building config-watcher, the informer and bench/tool"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/config-watcher" .)
(cd "$bench_dir/informer" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/informer" .)
(cd "$bench_dir/tool" && go build -o "$work/benchtool" .)
CONTROLLERS=(index noindex informer)
if [[ -n $BASE ]]; then
	build_at "$BASE" "$work/config-watcher-base"
	CONTROLLERS=(base "${CONTROLLERS[@]}")
	echo "  base: config-watcher at $BASE ($(git -C "$repo" rev-parse --short "$BASE"))"
fi

step "starting a fresh control plane (state dir $CW_STATE_DIR)"
"$repo/hack/cluster.sh" up
eval "$("$repo/hack/cluster.sh" env)"
api=$CW_PROXY_URL

step "$NAMESPACES namespaces; in $(ns_name 0): a Deployment of $SELECTED pods and the annotated ConfigMap"
for ((i = 0; i < NAMESPACES; i++)); do bt ns -api "$api" -ns "$(ns_name "$i")" -opt-in; done
ns0=$(ns_name 0)
curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' "$api/apis/apps/v1/namespaces/$ns0/deployments" -d @- <<EOF
{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"webapp"},
 "spec":{"replicas":$SELECTED,"selector":{"matchLabels":{"app":"webapp"}},
  "template":{"metadata":{"labels":{"app":"webapp","tier":"web"}},
   "spec":{"containers":[{"name":"webapp","image":"k8spatterns/mini-http-server"}]}}}}
EOF
curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' "$api/api/v1/namespaces/$ns0/configmaps" -d @- <<EOF
{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"webapp-config","annotations":{"$ANNOTATION":"app=webapp"}},"data":{"message":"hello"}}
EOF

# webapp_uids: the uids of the live selected pods, sorted.
webapp_uids() {
	curl -fsS "$api/api/v1/namespaces/$ns0/pods?labelSelector=app%3Dwebapp" |
		jq -r '.items[] | select(.metadata.deletionTimestamp == null) | .metadata.uid' | sort
}
wait_selected() {
	local i
	for ((i = 0; i < 1200; i++)); do
		(($(webapp_uids | wc -l) == SELECTED)) && return 0
		sleep 0.1
	done
	cw_die "the Deployment did not get back to $SELECTED pods"
}
meter() { curl -fsS "http://$(<"$work/$1.meter")/_meter"; }

# launch NAME LOG: starts controller NAME behind a meter of its own; LAUNCH_MS is the
# time from exec to /readyz 200.
launch() {
	local name=$1 port cmd envs=() i
	port=$(cw_free_port)
	rm -f "$work/$name.meter"
	"$work/benchtool" meter -upstream "$api" -addr-file "$work/$name.meter" & # not through bt: $! must be the meter itself, to stop it
	METER[$name]=$!
	for ((i = 0; i < 100; i++)); do [[ -s $work/$name.meter ]] && break; sleep 0.05; done
	case $name in
	index) cmd=("$work/config-watcher") envs=(POD_INDEX=true) ;;
	noindex) cmd=("$work/config-watcher") envs=(POD_INDEX=false) ;;
	base) cmd=("$work/config-watcher-base") envs=(POD_INDEX=true) ;;
	informer) cmd=("$work/informer") ;;
	esac
	LAUNCH_MS=$(env "${envs[@]}" WATCH_NAMESPACE='*' API_URL="http://$(<"$work/$name.meter")" HTTP_ADDR="127.0.0.1:$port" \
		"$work/benchtool" spawn -controller "$name" -log "$work/$2" -pidfile "$work/$name.pid" \
		-ready "http://127.0.0.1:$port/readyz" -- "${cmd[@]}" | sed -n 's/.* in \([0-9]*\) ms$/\1/p')
	CTRL[$name]=$(<"$work/$name.pid")
}

# measure NAME PODS: one controller alone: start, memory, one change.
measure() {
	local name=$1 pods=$2 m0 m1 m2 old recorded start_ms rss hwm i
	wait_selected
	launch "$name" "$name-$pods.log"
	start_ms=$LAUNCH_MS
	bt quiesce -pid "${CTRL[$name]}" >/dev/null
	m0=$(meter "$name")
	read -r rss hwm < <(bt mem -pid "${CTRL[$name]}" | sed -n 's/.*VmRSS \([0-9.]*\) MiB, VmHWM \([0-9.]*\) MiB/\1 \2/p')

	old=$(webapp_uids)
	recorded=$(curl -fsS "$api/api/v1/namespaces/$ns0/configmaps/webapp-config" | jq -c '{data: {message: .data.message}}')
	m1=$(meter "$name")
	curl -fsS -o /dev/null -X PATCH -H 'Content-Type: application/merge-patch+json' \
		"$api/api/v1/namespaces/$ns0/configmaps/webapp-config" -d "{\"data\":{\"message\":\"$name-$pods\"}}"
	for ((i = 0; i < 1200; i++)); do
		[[ -z $(comm -12 <(echo "$old") <(webapp_uids)) ]] && break
		sleep 0.1
	done
	[[ -z $(comm -12 <(echo "$old") <(webapp_uids)) ]] || cw_die "$name did not restart the selected pods"
	wait_selected
	bt quiesce -pid "${CTRL[$name]}" >/dev/null
	m2=$(meter "$name")
	stop_ctrl "$name"
	if [[ $name == informer ]]; then
		# The informer records nothing: put back the data the last config-watcher
		# recorded, or the next one would start with a round of 100 restarts.
		curl -fsS -o /dev/null -X PATCH -H 'Content-Type: application/merge-patch+json' \
			"$api/api/v1/namespaces/$ns0/configmaps/webapp-config" -d "$recorded"
	fi

	jq -rn --arg name "$name" --arg pods "$pods" --arg ms "$start_ms" --arg rss "$rss" --arg hwm "$hwm" \
		--argjson m0 "$m0" --argjson m1 "$m1" --argjson m2 "$m2" \
		'[$pods, $name, $ms, $rss, $hwm, $m0.requests, ($m0.bytes/1024|floor),
		  ($m2.requests-$m1.requests), (($m2.bytes-$m1.bytes)/1024|floor)] | join(",")' |
		tee -a "$RESULTS/scale.csv"
}

mkdir -p "$RESULTS"
echo "pods,controller,start_ms,rss_mib,hwm_mib,start_requests,start_kib,change_requests,change_kib" >"$RESULTS/scale.csv"
have=0 # bare pods per namespace so far
for total in "${STEPS[@]}"; do
	per=$((total / NAMESPACES))
	if ((per > have)); then
		step "creating bare pods up to $per per namespace (~$total in the cluster)"
		t0=$SECONDS
		for ((i = 0; i < NAMESPACES; i++)); do
			n=$per
			((i == 0)) && n=$((per - SELECTED)) # the Deployment's pods count in namespace 0
			from=$have
			((i == 0)) && from=$((have > SELECTED ? have - SELECTED : 0))
			((n > from)) || continue
			bt pods -api "$api" -ns "$(ns_name "$i")" -prefix filler -from "$from" -n $((n - from)) \
				-labels app=filler,tier=backend -workers 16
			printf '\r  %d/%d namespaces' $((i + 1)) "$NAMESPACES"
		done
		have=$per
		echo " in $((SECONDS - t0)) s"
	fi
	wait_selected
	count=$(curl -fsS "$api/api/v1/pods?limit=1" | jq -r '(.items | length) + (.metadata.remainingItemCount // 0)')
	step "cluster pods: $count; measuring ${CONTROLLERS[*]}"
	for c in "${CONTROLLERS[@]}"; do measure "$c" "$count"; done
done

step "idle: the ${CONTROLLERS[*]} together, quiet, over $IDLE s ($count pods)"
declare -A before=()
for c in "${CONTROLLERS[@]}"; do
	launch "$c" "$c-idle.log"
	bt quiesce -pid "${CTRL[$c]}" >/dev/null
	before[$c]=$(meter "$c")
done
sleep "$IDLE"
echo "controller,idle_seconds,requests,kib,requests_per_h,kib_per_h" >"$RESULTS/scale-idle.csv"
for c in "${CONTROLLERS[@]}"; do
	jq -rn --arg name "$c" --argjson idle "$IDLE" --argjson a "${before[$c]}" --argjson b "$(meter "$c")" \
		'[$name, $idle, ($b.requests-$a.requests), (($b.bytes-$a.bytes)/1024|floor),
		  (($b.requests-$a.requests)*3600/$idle|floor), (($b.bytes-$a.bytes)/1024*3600/$idle|floor)] | join(",")' |
		tee -a "$RESULTS/scale-idle.csv"
	stop_ctrl "$c"
done

step "results ($RESULTS/scale.csv, $RESULTS/scale-idle.csv)"
column -s, -t <"$RESULTS/scale.csv"
echo
column -s, -t <"$RESULTS/scale-idle.csv"
cw_log "scale bench finished in $(cw_elapsed $((SECONDS - bench_start)))"
