#!/usr/bin/env bash
# The start at many ConfigMaps (`make bench-start`): exec -> /readyz 200 of this tree's
# config-watcher, of config-watcher built from BENCH_START_BASE (default main: what a
# change replaces) and of the client-go informer, each started alone in turn, RUNS
# times over, on one namespace of BENCH_START_CONFIGMAPS (20000) ConfigMaps of 1 KiB, half
# annotated, on a fresh control plane of its own (or run.sh's). The three take turns in
# each run, so the machine's drift falls on all three alike; the table gives medians and
# ratios of the same run. A scripted measurement, not a test: about 5 minutes on 2 cores.
set -euo pipefail

BENCH_STEP_PREFIX="start: "
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
N="${BENCH_START_CONFIGMAPS:-20000}"
RUNS="${BENCH_START_RUNS:-5}"
BASE="${BENCH_START_BASE:-main}"
NS=bench-start

sub_work start
ctrl_pid=""
stop_ctrl() {
	local i
	[[ -n $ctrl_pid ]] || return 0
	kill -TERM -- "-$ctrl_pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do kill -0 "$ctrl_pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL -- "-$ctrl_pid" 2>/dev/null || true
	ctrl_pid=""
}
cleanup() {
	local rc=$?
	stop_ctrl
	sub_finish "$rc" start
}
trap cleanup EXIT

step "building config-watcher (this tree and $BASE), the informer and bench/tool"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/config-watcher" .)
build_at "$BASE" "$work/config-watcher-base"
(cd "$bench_dir/informer" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/informer" .)
(cd "$bench_dir/tool" && go build -o "$work/benchtool" .)
bt() { "$work/benchtool" "$@"; }

sub_cluster start
out="$work/start-results"
mkdir -p "$RESULTS" "$out"
rm -f "$out/metrics.csv"
step "creating $N ConfigMaps of 1 KiB in $NS"
bt ns -api "$CW_PROXY_URL" -ns "$NS"
bt create -api "$CW_PROXY_URL" -ns "$NS" -n "$N"

for ((run = 1; run <= RUNS; run++)); do
	step "run $run of $RUNS"
	for c in config-watcher config-watcher-base informer; do
		port=$(cw_free_port)
		env WATCH_NAMESPACE="$NS" API_URL="$CW_PROXY_URL" HTTP_ADDR="127.0.0.1:$port" \
			"$work/benchtool" spawn -controller "$c" -log "$work/$c.log" -pidfile "$work/$c.pid" \
			-ready "http://127.0.0.1:$port/readyz" -results "$out" -metric start -- "$work/$c" >/dev/null
		ctrl_pid=$(<"$work/$c.pid")
		bt quiesce -pid "$ctrl_pid"
		stop_ctrl
		printf '  %s: %s ms\n' "$c" "$(awk -F, -v c="$c" '$1 == c { v = $3 } END { print v }' "$out/metrics.csv")"
	done
done

step "medians of $RUNS runs, $N ConfigMaps (base: $BASE, $(git -C "$repo" rev-parse --short "$BASE"))"
python3 - "$out/metrics.csv" "$N" "$BASE" <<'PY' | tee "$RESULTS/start.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ms = {}
for r in rows:
    ms.setdefault(r["controller"], []).append(float(r["value"]))
med = {c: statistics.median(v) for c, v in ms.items()}
print(f"| start at {sys.argv[2]} ConfigMaps, exec -> /readyz (ms) | median | runs | / base | / informer |")
print("|---|---|---|---|---|")
for c in ("config-watcher", "config-watcher-base", "informer"):
    v = ms[c]
    print(f"| {c} | {med[c]:.0f} | {', '.join(f'{x:.0f}' for x in v)} | {med[c] / med['config-watcher-base']:.2f}x | {med[c] / med['informer']:.2f}x |")
PY
cp "$out/metrics.csv" "$RESULTS/start.csv"
cw_log "start bench finished in $(cw_elapsed $((SECONDS - bench_start)))"
