#!/usr/bin/env bash
# The start at many ConfigMaps (`make bench-start`): exec -> /readyz 200 of this tree's
# config-watcher, of config-watcher built from BENCH_START_BASE (default main: what a
# change replaces) and of the client-go informer, each started alone in turn, RUNS
# times over, on one namespace of BENCH_START_CONFIGMAPS (20000) ConfigMaps of 1 KiB, half
# annotated, on a fresh control plane of its own (or run.sh's), after one unmeasured start
# that adopts them. The three take turns in each run, so the machine's drift falls on all
# three alike; the table gives medians and ratios of the same run, of the time to ready and
# of the CPU seconds used until quiet (the steadier figure on a loaded machine). A scripted
# measurement, not a test: about 8 minutes on 2 cores.
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
	[[ -n $ctrl_pid ]] || return 0
	stop_session "$ctrl_pid"
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

# launch NAME METRIC: starts controller NAME (records exec -> /readyz as METRIC), waits until
# it is quiet, records the CPU seconds it used by then, and stops it.
launch() {
	local c=$1 port cpu
	port=$(cw_free_port)
	env WATCH_NAMESPACE="$NS" API_URL="$CW_PROXY_URL" HTTP_ADDR="127.0.0.1:$port" \
		"$work/benchtool" spawn -controller "$c" -log "$work/$c.log" -pidfile "$work/$c.pid" \
		-ready "http://127.0.0.1:$port/readyz" -results "$out" -metric "$2" -- "$work/$c" >/dev/null
	ctrl_pid=$(<"$work/$c.pid")
	bt quiesce -pid "$ctrl_pid" >/dev/null
	cpu=$(bt cpu -pid "$ctrl_pid")
	stop_ctrl
	echo "$c,$2_cpu,$cpu,s" >>"$out/metrics.csv"
	printf '  %s: %s ms, %s CPU s\n' "$c" "$(awk -F, -v c="$c" -v m="$2" '$1 == c && $2 == m { v = $3 } END { print v }' "$out/metrics.csv")" "$cpu"
}

# The first start adopts the annotated half (a record written on each): not measured.
step "warm-up: config-watcher adopts the annotated ConfigMaps"
launch config-watcher warmup
for ((run = 1; run <= RUNS; run++)); do
	step "run $run of $RUNS"
	for c in config-watcher config-watcher-base informer; do
		launch "$c" start
	done
done

step "medians of $RUNS runs, $N ConfigMaps (base: $BASE = $(git -C "$repo" rev-parse --short "$BASE"))"
python3 - "$out/metrics.csv" "$N" <<'PY' | tee "$RESULTS/start.md"
import csv, statistics, sys
runs = {}
for r in csv.DictReader(open(sys.argv[1])):
    runs.setdefault((r["controller"], r["metric"]), []).append(float(r["value"]))
names = ("config-watcher", "config-watcher-base", "informer")
print(f"| start at {sys.argv[2]} ConfigMaps | exec -> /readyz, ms: median (runs) | / base | / informer | CPU s until quiet: median (runs) | / base | / informer |")
print("|---|---|---|---|---|---|---|")
med = {k: statistics.median(v) for k, v in runs.items()}
for c in names:
    cells = [c]
    for m, fmt in (("start", "{:.0f}"), ("start_cpu", "{:.2f}")):
        v = runs[(c, m)]
        cells += [f"{fmt.format(med[(c, m)])} ({', '.join(fmt.format(x) for x in v)})",
                  f"{med[(c, m)] / med[('config-watcher-base', m)]:.2f}x", f"{med[(c, m)] / med[('informer', m)]:.2f}x"]
    print("| " + " | ".join(cells) + " |")
PY
cp "$out/metrics.csv" "$RESULTS/start.csv"
cw_log "start bench finished in $(cw_elapsed $((SECONDS - bench_start)))"
