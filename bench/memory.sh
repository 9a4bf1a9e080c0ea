#!/usr/bin/env bash
# Memory against ConfigMap volume: peak RSS (VmHWM) at start and after a
# forced relist, and steady RSS, with 0, 10, 40 and 200 ConfigMaps of 900 KB (0, 9,
# 36, 180 MB; none annotated, plus one annotated webapp-config) in the watched
# namespace, then WATCH_NAMESPACE=* over that namespace and a second one of 40 more.
# config-watcher (this tree), config-watcher built from BENCH_MEM_BEFORE (default: main;
# empty skips it) and the client-go informer baseline (bench/informer) run one at a
# time in the same run, each through the same fault proxy (hack/faultproxy, no fault
# but the forced relist: the next ConfigMap watch answered 410) in front of the same
# kubectl proxy.
#
# A scripted measurement, not a test. Prints progress, then a table and a text chart,
# also written to $BENCH_RESULTS/memory.{csv,md} (default bench/results).
#
#   bench/memory.sh                 on a fresh control plane of its own (hack/cluster.sh)
#   called by bench/run.sh          on run.sh's control plane, with its binaries (BENCH_WORK)
#
# Last, the pod index: steady RSS of config-watcher watching every namespace with
# BENCH_PODS bare pods (5000; Pending, no scheduler), POD_INDEX=true against false,
# reported per pod.
#
# Settings: BENCH_BIG_COUNTS ("0 10 40 200"), BENCH_BIG_SIZE (900000 bytes),
# BENCH_MEM_BEFORE (main), BENCH_PODS (5000), BENCH_RESULTS. About 5 minutes on 2 cores.
set -euo pipefail

BENCH_STEP_PREFIX="memory: "
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
COUNTS=(${BENCH_BIG_COUNTS:-0 10 40 200})
SIZE="${BENCH_BIG_SIZE:-900000}"
BEFORE="${BENCH_MEM_BEFORE-main}"
PODS="${BENCH_PODS:-5000}"

sub_work memory
pids=()   # controllers: session leaders (benchtool spawn)
fp_pid="" # the fault proxy
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$? p
	for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
	[[ -z $fp_pid ]] || kill -TERM "$fp_pid" 2>/dev/null || true
	sub_finish "$rc" memory
}
trap cleanup EXIT

step "building config-watcher, ${BEFORE:+config-watcher@$BEFORE, }the informer, bench/tool and hack/faultproxy"
[[ -x $work/config-watcher ]] || (cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/config-watcher" .)
[[ -x $work/informer ]] || (cd "$bench_dir/informer" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/informer" .)
[[ -x $work/benchtool ]] || (cd "$bench_dir/tool" && go build -o "$work/benchtool" .)
(cd "$repo" && go build -o "$work/faultproxy" ./hack/faultproxy)
CONTROLLERS=(config-watcher)
if [[ -n $BEFORE ]]; then
	# The same build from the object database: no checkout, no other worktree touched.
	rm -rf "$work/before-src" && mkdir -p "$work/before-src"
	git -C "$repo" archive "$BEFORE" | tar -x -C "$work/before-src"
	(cd "$work/before-src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/config-watcher-before" .)
	CONTROLLERS+=(config-watcher-before)
fi
CONTROLLERS+=(informer)

sub_cluster memory
bt() { "$work/benchtool" "$@"; }

rm -f "$work/faultproxy.addr"
"$work/faultproxy" -listen 127.0.0.1:0 -upstream "$CW_PROXY_URL" -addr-file "$work/faultproxy.addr" >"$work/faultproxy.log" 2>&1 &
fp_pid=$!
for ((i = 0; i < 100; i++)); do [[ -s $work/faultproxy.addr ]] && break; sleep 0.1; done
fault="http://$(<"$work/faultproxy.addr")"

# status PID KEY: a /proc/PID/status field in KiB.
status() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
metric() { curl -fsS "$1/metrics" | awk -v n="$2" '$1 == n { print $2 }'; }

mkdir -p "$RESULTS"
csv="$RESULTS/memory.csv"
echo "controller,namespace,configmaps,data_mb,start_hwm_mib,steady_rss_mib,relist_hwm_mib" >"$csv"

# measure NAME WATCH_NS COUNT: start, quiet, peak and steady RSS; for config-watcher a
# forced relist (410 on the next ConfigMap watch) and the peak after it.
measure() {
	local name=$1 ns=$2 count=$3 port url pid start_hwm rss relist_hwm="" relists
	port=$(cw_free_port)
	url="http://127.0.0.1:$port"
	local cmd=("$work/$name")
	env WATCH_NAMESPACE="$ns" API_URL="$fault" HTTP_ADDR="127.0.0.1:$port" LOG_LEVEL=warn \
		"$work/benchtool" spawn -controller "$name" -log "$work/$name-$count-$ns.log" -pidfile "$work/$name.pid" \
		-ready "$url/readyz" -timeout 300s -- "${cmd[@]}"
	pid=$(<"$work/$name.pid")
	pids+=("$pid")
	bt quiesce -pid "$pid" >/dev/null
	start_hwm=$(status "$pid" VmHWM)
	rss=$(status "$pid" VmRSS)
	if [[ $name == config-watcher* ]]; then
		relists=$(metric "$url" config_watcher_relists_total)
		curl -fsS -X PUT "$fault/_fault/rules" -d '[{"name":"gone","watch":"true","path":"/configmaps","status":410,"times":1}]' >/dev/null
		curl -fsS -X POST "$fault/_fault/drop" >/dev/null
		for ((i = 0; i < 600; i++)); do
			[[ $(metric "$url" config_watcher_relists_total) -gt $relists ]] && break
			sleep 0.1
		done
		[[ $(metric "$url" config_watcher_relists_total) -gt $relists ]] || cw_die "$name: no relist after the 410"
		for ((i = 0; i < 600; i++)); do
			[[ $(curl -s -o /dev/null -w '%{http_code}' "$url/readyz") == 200 ]] && break
			sleep 0.1
		done
		bt quiesce -pid "$pid" >/dev/null
		relist_hwm=$(mib "$(status "$pid" VmHWM)")
		curl -fsS -X DELETE "$fault/_fault/rules" >/dev/null
	fi
	kill -TERM -- "-$pid"
	for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL -- "-$pid" 2>/dev/null || true
	local mb
	mb=$(awk -v n="$count" -v s="$SIZE" 'BEGIN { printf "%.0f", n * s / 1e6 }')
	printf '  %-22s %-3s %4d x %d B (%4s MB): peak at start %6s MiB, steady %6s MiB%s\n' "$name" "$ns" "$count" "$SIZE" "$mb" \
		"$(mib "$start_hwm")" "$(mib "$rss")" "${relist_hwm:+, peak after a relist $relist_hwm MiB}"
	echo "$name,$ns,$count,$mb,$(mib "$start_hwm"),$(mib "$rss"),$relist_hwm" >>"$csv"
}

ns=bench-bigmem
bt ns -api "$CW_PROXY_URL" -ns "$ns"
# The annotated ConfigMap the controller acts on; the big ones carry an unrelated annotation.
curl -fsS -X POST -H 'Content-Type: application/json' "$CW_PROXY_URL/api/v1/namespaces/$ns/configmaps" \
	-d '{"metadata":{"name":"webapp-config","annotations":{"k8spatterns.io/podDeleteSelector":"app=webapp"}},"data":{"message":"Hello"}}' >/dev/null
have=0
for count in "${COUNTS[@]}"; do
	if ((count > have)); then
		step "creating $((count - have)) ConfigMaps of $SIZE B in $ns ($count in all)"
		bt create -api "$CW_PROXY_URL" -ns "$ns" -from "$have" -n $((count - have)) -size "$SIZE" -workers 2 -annotation bench.k8spatterns.io/unrelated
		have=$count
	fi
	step "$count ConfigMaps of $SIZE B"
	for c in "${CONTROLLERS[@]}"; do measure "$c" "$ns" "$count"; done
done

ns2=bench-bigmem-2
step "WATCH_NAMESPACE=*: $have in $ns and 40 more in $ns2"
bt ns -api "$CW_PROXY_URL" -ns "$ns2"
bt create -api "$CW_PROXY_URL" -ns "$ns2" -n 40 -size "$SIZE" -workers 2 -annotation bench.k8spatterns.io/unrelated
for c in "${CONTROLLERS[@]}"; do
	[[ $c == informer ]] && continue # bench/informer watches one namespace
	measure "$c" '*' $((have + 40))
done

step "pod index: $PODS bare pods, WATCH_NAMESPACE=*, POD_INDEX=true against false"
bt ns -api "$CW_PROXY_URL" -ns bench-pods
bt pods -api "$CW_PROXY_URL" -ns bench-pods -n "$PODS" -prefix p -workers 4
# index_rss POD_INDEX: steady RSS (KiB) of config-watcher watching every namespace.
index_rss() {
	local port pid rss
	port=$(cw_free_port)
	env WATCH_NAMESPACE='*' POD_INDEX="$1" API_URL="$fault" HTTP_ADDR="127.0.0.1:$port" LOG_LEVEL=warn \
		"$work/benchtool" spawn -controller config-watcher -log "$work/podindex-$1.log" -pidfile "$work/podindex.pid" \
		-ready "http://127.0.0.1:$port/readyz" -timeout 300s -- "$work/config-watcher" >/dev/null
	pid=$(<"$work/podindex.pid")
	pids+=("$pid")
	bt quiesce -pid "$pid" >/dev/null
	rss=$(status "$pid" VmRSS)
	kill -TERM -- "-$pid"
	for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	echo "$rss"
}
without=$(index_rss false)
with=$(index_rss true)
per_pod=$(awk -v a="$with" -v b="$without" -v n="$PODS" 'BEGIN { printf "%.0f", (a - b) * 1024 / n }')
echo "  steady RSS with $PODS pods indexed: $(mib "$with") MiB, without the index: $(mib "$without") MiB: about $per_pod B per pod"
echo "pod-index,*,$PODS pods,,,$(mib "$with"),,$(mib "$without") without,$per_pod B/pod" >"$RESULTS/memory-podindex.csv"

step "results ($csv)"
{
	echo "| controller | watched | ConfigMaps of $SIZE B | data MB | peak RSS at start (MiB) | steady RSS (MiB) | peak after a relist (MiB) |"
	echo "|---|---|---|---|---|---|---|"
	tail -n +2 "$csv" | awk -F, '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, ($7 == "" ? "-" : $7) }'
	echo
	echo "Peak RSS at start (VmHWM), one # per 4 MiB, cut at 200 MiB (>):"
	echo '```'
	tail -n +2 "$csv" | awk -F, '{ bar = ""; for (i = 0; i < $5 / 4 && i < 50; i++) bar = bar "#"; if ($5 > 200) bar = bar ">"; printf "%-22s %-12s %4s MB %7.1f %s\n", $1, $2, $4, $5, bar }'
	echo '```'
	echo
	echo "Pod index, WATCH_NAMESPACE=*, $PODS pods: steady RSS $(mib "$with") MiB with it, $(mib "$without") MiB without: about $per_pod B per pod."
} | tee "$RESULTS/memory.md"
