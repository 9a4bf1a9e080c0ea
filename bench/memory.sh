#!/usr/bin/env bash
# Memory against object volume, in three parts (BENCH_MEM_PARTS, default all three):
#
#   volume    peak RSS (VmHWM) at start and after a forced relist, and steady RSS, with
#             0, 10, 40 and 200 ConfigMaps of 900 KB (0, 9, 36, 180 MB; none annotated,
#             plus one annotated webapp-config) in the watched namespace, then
#             WATCH_NAMESPACE=* over that namespace and a second one of 40 more.
#             config-watcher (this tree), config-watcher built from BENCH_MEM_BEFORE
#             (default: main; empty skips it) and the client-go informer baseline
#             (bench/informer) run one at a time in the same run, each through the same
#             fault proxy (hack/faultproxy, no fault but the forced relist: the next
#             ConfigMap watch answered 410) in front of the same kubectl proxy.
#   podindex  steady RSS of config-watcher watching every namespace with BENCH_PODS pods
#             (5000) that look Running (an owner, the conditions and container status a
#             kubelet reports: benchtool pods -running) in a namespace that also holds one
#             annotated ConfigMap (so the index covers it), POD_INDEX=true against false,
#             per pod; then the CPU seconds while every pod's status changes once. This
#             tree and config-watcher built from BENCH_MEM_BEFORE alike. Then, this tree
#             alone, BENCH_PODS more in a second namespace, each referencing three
#             objects of its own (benchtool pods -refs): what the references cost per pod.
#   secrets   BENCH_SECRETS Secrets (5000; 60 % passwords, 15 % tokens of 800 B, 5 %
#             registry logins, 20 % TLS of 4.1 KB; every 500th annotated) and
#             BENCH_SECRET_CMS ConfigMaps of 1 KiB (5000, half annotated) in one
#             namespace: config-watcher with WATCH_SECRETS=true (and a 32-byte
#             DIGEST_KEY_FILE) against the informer watching both kinds
#             (INFORMER_SECRETS=true), and each watching the ConfigMaps alone; for
#             config-watcher with Secrets, the peak after a relist of the Secret watch.
#             A first start (not measured) adopts the annotated objects, so that every
#             measured start finds its records written, as a restarted controller does.
#
# A scripted measurement, not a test. Prints progress, then tables, also written to
# $BENCH_RESULTS (alone: bench/results/alone): memory.{csv,md} and memory-podindex.csv
# (volume, podindex), memory-secrets.{csv,md} (secrets); a part not run leaves its
# files alone.
#
#   bench/memory.sh                 on a fresh control plane of its own (hack/cluster.sh)
#   BENCH_MEM_PARTS=secrets bench/memory.sh    the Secrets part alone, about 2 minutes
#   called by bench/run.sh          on run.sh's control plane, with its binaries (BENCH_WORK)
#
# Settings: BENCH_MEM_PARTS ("volume podindex secrets"), BENCH_BIG_COUNTS ("0 10 40 200"),
# BENCH_BIG_SIZE (900000 bytes), BENCH_MEM_BEFORE (main), BENCH_PODS (5000),
# BENCH_SECRETS (5000), BENCH_SECRET_CMS (5000), BENCH_RESULTS. About 4 minutes on 2 cores.
set -euo pipefail

BENCH_STEP_PREFIX="memory: "
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PARTS=" ${BENCH_MEM_PARTS:-volume podindex secrets} "
COUNTS=(${BENCH_BIG_COUNTS:-0 10 40 200})
SIZE="${BENCH_BIG_SIZE:-900000}"
BEFORE="${BENCH_MEM_BEFORE-main}"
PODS="${BENCH_PODS:-5000}"
SECRETS="${BENCH_SECRETS:-5000}"
SECRET_CMS="${BENCH_SECRET_CMS:-5000}"
for p in $PARTS; do
	[[ $p == volume || $p == podindex || $p == secrets ]] || cw_die "BENCH_MEM_PARTS: no part $p (volume, podindex, secrets)"
done
# part NAME: whether BENCH_MEM_PARTS asks for it.
part() { [[ $PARTS == *" $1 "* ]]; }
part volume || part podindex || BEFORE="" # the volume and pod index rows compare with the other build

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
	build_at "$BEFORE" "$work/config-watcher-before"
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

# launch NAME WATCH_NS LOG [VAR=VALUE...]: starts controller NAME watching WATCH_NS through
# the fault proxy, with the settings given, and waits until it is ready and quiet. Sets
# pid and url.
launch() {
	local name=$1 ns=$2 log=$3 port
	shift 3
	port=$(cw_free_port)
	url="http://127.0.0.1:$port"
	env WATCH_NAMESPACE="$ns" API_URL="$fault" HTTP_ADDR="127.0.0.1:$port" LOG_LEVEL=warn "$@" \
		"$work/benchtool" spawn -controller "$name" -log "$work/$log.log" -pidfile "$work/$name.pid" \
		-ready "$url/readyz" -timeout 300s -- "$work/$name"
	pid=$(<"$work/$name.pid")
	pids+=("$pid")
	bt quiesce -pid "$pid" >/dev/null
}

# relist RESOURCE METRIC: makes config-watcher at url (pid) relist RESOURCE (the next watch
# of it answered 410), waits until METRIC counts it and the controller is ready and quiet,
# and prints its peak RSS (MiB) since start.
relist() {
	local resource=$1 name=$2 before i
	before=$(metric "$url" "$name")
	curl -fsS -X PUT "$fault/_fault/rules" -d "[{\"name\":\"gone\",\"watch\":\"true\",\"path\":\"/$resource\",\"status\":410,\"times\":1}]" >/dev/null
	curl -fsS -X POST "$fault/_fault/drop" >/dev/null
	for ((i = 0; i < 600; i++)); do
		[[ $(metric "$url" "$name") -gt $before ]] && break
		sleep 0.1
	done
	[[ $(metric "$url" "$name") -gt $before ]] || cw_die "no relist of $resource after the 410 ($name stayed $before)"
	for ((i = 0; i < 600; i++)); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' "$url/readyz") == 200 ]] && break
		sleep 0.1
	done
	bt quiesce -pid "$pid" >/dev/null
	curl -fsS -X DELETE "$fault/_fault/rules" >/dev/null
	mib "$(status "$pid" VmHWM)"
}

mkdir -p "$RESULTS"

# measure NAME WATCH_NS COUNT: start, quiet, peak and steady RSS; for config-watcher a
# forced relist (410 on the next ConfigMap watch) and the peak after it.
measure() {
	local name=$1 ns=$2 count=$3 start_hwm rss relist_hwm=""
	launch "$name" "$ns" "$name-$count-$ns"
	start_hwm=$(status "$pid" VmHWM)
	rss=$(status "$pid" VmRSS)
	[[ $name != config-watcher* ]] || relist_hwm=$(relist configmaps config_watcher_relists_total)
	stop_session "$pid"
	local mb
	mb=$(awk -v n="$count" -v s="$SIZE" 'BEGIN { printf "%.0f", n * s / 1e6 }')
	printf '  %-22s %-3s %4d x %d B (%4s MB): peak at start %6s MiB, steady %6s MiB%s\n' "$name" "$ns" "$count" "$SIZE" "$mb" \
		"$(mib "$start_hwm")" "$(mib "$rss")" "${relist_hwm:+, peak after a relist $relist_hwm MiB}"
	echo "$name,$ns,$count,$mb,$(mib "$start_hwm"),$(mib "$rss"),$relist_hwm" >>"$csv"
}

if part volume; then
	csv="$RESULTS/memory.csv"
	echo "controller,namespace,configmaps,data_mb,start_hwm_mib,steady_rss_mib,relist_hwm_mib" >"$csv"
	ns=bench-bigmem
	bt ns -api "$CW_PROXY_URL" -ns "$ns" -opt-in
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
	bt ns -api "$CW_PROXY_URL" -ns "$ns2" -opt-in
	bt create -api "$CW_PROXY_URL" -ns "$ns2" -n 40 -size "$SIZE" -workers 2 -annotation bench.k8spatterns.io/unrelated
	for c in "${CONTROLLERS[@]}"; do
		[[ $c == informer ]] && continue # bench/informer watches one namespace
		measure "$c" '*' $((have + 40))
	done
fi

if part podindex; then
	step "pod index: $PODS Running pods, WATCH_NAMESPACE=*, POD_INDEX=true against false${BEFORE:+, and the index of config-watcher@$BEFORE}"
	bt ns -api "$CW_PROXY_URL" -ns bench-pods -opt-in
	bt pods -api "$CW_PROXY_URL" -ns bench-pods -n "$PODS" -prefix p -workers 4 -running
	# The index covers only namespaces holding an annotated ConfigMap: cm-00000 is one
	# (its selector matches none of the pods, so nothing is restarted).
	bt create -api "$CW_PROXY_URL" -ns bench-pods -n 1 -size 64 >/dev/null
	# index_rss NAME POD_INDEX: steady RSS (KiB) of controller NAME watching every
	# namespace. The index decides what it covers during the initial ConfigMap list,
	# before /readyz; launch waits for that and for the index's pod lists (quiet). With
	# the index, it then reports every pod's status again, changed, as kubelets do, and
	# appends the controller's CPU seconds meanwhile to $work/index-cpu-NAME.
	index_rss() {
		local before_cpu
		launch "$1" '*' "podindex-$1-$2" POD_INDEX="$2" >/dev/null
		status "$pid" VmRSS
		if [[ $2 == true ]]; then
			before_cpu=$(bt cpu -pid "$pid")
			bt pods -api "$CW_PROXY_URL" -ns bench-pods -n "$PODS" -prefix p -workers 4 -restatus >&2
			bt quiesce -pid "$pid" >/dev/null
			awk -v a="$(bt cpu -pid "$pid")" -v b="$before_cpu" 'BEGIN { printf "%.2f", a - b }' >"$work/index-cpu-$1"
		fi
		stop_session "$pid"
	}
	rm -f "$RESULTS/memory-podindex.csv"
	for c in config-watcher ${BEFORE:+config-watcher-before}; do
		without=$(index_rss "$c" false)
		with=$(index_rss "$c" true)
		cpu=$(<"$work/index-cpu-$c")
		per_pod=$(awk -v a="$with" -v b="$without" -v n="$PODS" 'BEGIN { printf "%.0f", (a - b) * 1024 / n }')
		echo "  $c: steady RSS with $PODS pods indexed: $(mib "$with") MiB, without the index: $(mib "$without") MiB: about $per_pod B per pod; $cpu CPU s while every pod's status changed once"
		echo "$c,*,$PODS pods,,,$(mib "$with"),,$(mib "$without") without,$per_pod B/pod,$cpu CPU s for $PODS status changes" >>"$RESULTS/memory-podindex.csv"
		[[ $c == config-watcher ]] && plain=$with
	done

	# The same again, in a second namespace, each pod referencing three objects of its
	# own (nothing interned is shared: what references cost at most); its steady RSS
	# against that with the first namespace alone is what these pods cost each.
	step "pod index: $PODS more Running pods with 3 references each (objects of their own)"
	bt ns -api "$CW_PROXY_URL" -ns bench-refs -opt-in
	bt pods -api "$CW_PROXY_URL" -ns bench-refs -n "$PODS" -prefix r -workers 4 -running -refs
	bt create -api "$CW_PROXY_URL" -ns bench-refs -n 1 -size 64 >/dev/null
	launch config-watcher '*' podindex-refs POD_INDEX=true >/dev/null
	refs_rss=$(status "$pid" VmRSS)
	stop_session "$pid"
	per_ref_pod=$(awk -v a="$refs_rss" -v b="$plain" -v n="$PODS" 'BEGIN { printf "%.0f", (a - b) * 1024 / n }')
	echo "  config-watcher: steady RSS with $PODS more pods of 3 references each indexed: $(mib "$refs_rss") MiB, $(mib "$plain") MiB without them: about $per_ref_pod B per pod"
	echo "config-watcher,*,$PODS pods with 3 references each,,,$(mib "$refs_rss"),,$(mib "$plain") before them,$per_ref_pod B/pod," >>"$RESULTS/memory-podindex.csv"
fi

if part volume; then
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
		if part podindex; then
			echo
			awk -F, -v n="$PODS" '$3 ~ /references/ { printf "Pod index of %s, WATCH_NAMESPACE=*, %s more Running pods with 3 references each (objects of their own): steady RSS %s MiB, %s: about %s per pod.\n", $1, n, $6, $8, $9; next }
				{ printf "Pod index of %s, WATCH_NAMESPACE=*, %s Running pods: steady RSS %s MiB with it, %s: about %s per pod; %s.\n", $1, n, $6, $8, $9, $10 }' "$RESULTS/memory-podindex.csv"
		fi
	} | tee "$RESULTS/memory.md"
fi

if part secrets; then
	# Its own namespace, last: the WATCH_NAMESPACE=* rows above see none of it.
	ns=bench-secmem
	step "Secrets and ConfigMaps together: $SECRETS Secrets and $SECRET_CMS ConfigMaps of 1 KiB in $ns"
	bt ns -api "$CW_PROXY_URL" -ns "$ns"
	bt create -api "$CW_PROXY_URL" -ns "$ns" -n "$SECRET_CMS"
	every=500 # every so many Secrets carries the selector annotation
	bt secrets -api "$CW_PROXY_URL" -ns "$ns" -n "$SECRETS" -every "$every"
	head -c 32 /dev/urandom | base64 >"$work/digest-key"
	with_secrets=(WATCH_SECRETS=true DIGEST_KEY_FILE="$work/digest-key")

	step "first start: config-watcher adopts the annotated ConfigMaps and Secrets (not measured)"
	launch config-watcher "$ns" secrets-adopt "${with_secrets[@]}"
	stop_session "$pid"
	# Proof that it read the Secrets: a state ConfigMap per annotated one.
	states=$(curl -fsS "$CW_PROXY_URL/api/v1/namespaces/$ns/configmaps?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dconfig-watcher" | jq '.items | length')
	((states == (SECRETS + every - 1) / every)) || cw_die "$states state ConfigMaps after the first start, want one per annotated Secret: $(((SECRETS + every - 1) / every))"
	echo "  $states state ConfigMaps, one per annotated Secret"

	csv="$RESULTS/memory-secrets.csv"
	echo "controller,kinds,secrets,configmaps,start_hwm_mib,steady_rss_mib,relist_hwm_mib" >"$csv"
	# secrets_row NAME KINDS [VAR=VALUE...]: one start of NAME, measured.
	secrets_row() {
		local name=$1 kinds=$2 start_hwm rss relist_hwm="" n=0
		shift 2
		launch "$name" "$ns" "secrets-$name-$kinds" "$@"
		start_hwm=$(mib "$(status "$pid" VmHWM)")
		rss=$(mib "$(status "$pid" VmRSS)")
		[[ $name != config-watcher || $kinds == configmaps ]] || relist_hwm=$(relist secrets config_watcher_secret_relists_total)
		stop_session "$pid"
		[[ $kinds == configmaps ]] || n=$SECRETS
		printf '  %-15s %-18s peak at start %6s MiB, steady %6s MiB%s\n' "$name" "$kinds" "$start_hwm" "$rss" \
			"${relist_hwm:+, peak after a relist of the Secrets $relist_hwm MiB}"
		echo "$name,$kinds,$n,$SECRET_CMS,$start_hwm,$rss,$relist_hwm" >>"$csv"
	}
	step "$SECRET_CMS ConfigMaps alone, then with the $SECRETS Secrets: config-watcher and the informer in turn"
	secrets_row config-watcher configmaps
	secrets_row informer configmaps
	secrets_row config-watcher configmaps+secrets "${with_secrets[@]}"
	secrets_row informer configmaps+secrets INFORMER_SECRETS=true

	step "results ($csv)"
	# The ratio and what the Secrets add, from the csv: cw/informer per kinds, and both - alone.
	awk -F, -v s="$SECRETS" -v c="$SECRET_CMS" '
		NR > 1 { hwm[$1, $2] = $5; rss[$1, $2] = $6; rel[$1, $2] = $7 }
		END {
			print "| watched | config-watcher peak / steady (MiB) | informer peak / steady (MiB) | cw / informer, peak | cw / informer, steady |"
			print "|---|---|---|---|---|"
			k = "configmaps"; label[k] = c " ConfigMaps"
			k = "configmaps+secrets"; label[k] = s " Secrets + " c " ConfigMaps"
			split("configmaps configmaps+secrets", ks, " ")
			for (i = 1; i <= 2; i++) {
				k = ks[i]
				printf "| %s | %.1f / %.1f | %.1f / %.1f | %.2f× | %.2f× |\n", label[k], hwm["config-watcher", k], rss["config-watcher", k],
					hwm["informer", k], rss["informer", k], hwm["config-watcher", k] / hwm["informer", k], rss["config-watcher", k] / rss["informer", k]
			}
			printf "| what the Secrets add | %+.1f / %+.1f | %+.1f / %+.1f | | |\n",
				hwm["config-watcher", ks[2]] - hwm["config-watcher", ks[1]], rss["config-watcher", ks[2]] - rss["config-watcher", ks[1]],
				hwm["informer", ks[2]] - hwm["informer", ks[1]], rss["informer", ks[2]] - rss["informer", ks[1]]
			print ""
			print "config-watcher with the Secrets, peak after a forced relist of the Secret watch: " rel["config-watcher", ks[2]] " MiB."
		}' "$csv" | tee "$RESULTS/memory-secrets.md"
fi
