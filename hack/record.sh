#!/usr/bin/env bash
# Records real API server responses into testdata/recorded/ (its README says what each
# file holds) on two fresh local control planes (hack/cluster.sh): one with the watch
# cache on, as production runs (LISTs, pods, Secrets, watches with every event type,
# large MODIFIED events), then one with it off (an old resourceVersion answers 410 once
# etcd is compacted).
#
# kubectl makes every change and `kubectl get --raw` records every answer, except two kinds
# it cannot: a metadata-only LIST or watch (get --raw sends its own Accept header) and the
# body of an error (it prints the error instead); curl records those through the control
# plane's `kubectl proxy`, as config-watcher sends its requests. A watch starts from a
# resourceVersion noted before the changes it is to show, mostly once they are made: the
# server replays them in order until timeoutSeconds ends the stream. The watch cache sends
# BOOKMARKs (2 s before the timeout) only to a watch that was open while the changes were
# made (tried on 1.37), so watch-events.ndjson, which must hold some, is opened first and
# its first event awaited before the other changes. The ConfigMaps of modified-*.ndjson
# come from hack/record, whose data tests pin.
#
# The new files replace the old ones once each shows what it must; then the unit tests
# that replay them run (`git checkout testdata/recorded` restores the old files).
#
# Usage: hack/record.sh          (make record; needs jq and curl)
#        hack/record.sh check [DIR]    checks a recording (default testdata/recorded)
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$hack_dir")"
# shellcheck source=hack/lib.sh
source "$hack_dir/lib.sh"
command -v jq >/dev/null || cw_die "jq not found"
command -v curl >/dev/null || cw_die "curl not found"

out=$repo/testdata/recorded
work=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-record.XXXXXX")
rec=$work/out
state= watcher=
cleanup() {
	if [[ -n $state ]]; then CW_STATE_DIR=$state "$hack_dir/cluster.sh" down || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

# apiclient.MetadataListAccept and apiclient.MetadataAccept, what the pod index sends
# (hack/record's TestAcceptMatchesTheController keeps them equal).
accept_metadata_list='application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json'
accept_metadata='application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json'

ns=/api/v1/namespaces/default
selector_key=k8spatterns.io/podDeleteSelector
not_helm='type%21%3Dhelm.sh%2Frelease.v1' # fieldSelector=type!=helm.sh/release.v1

# up CACHE starts a fresh control plane with --watch-cache=CACHE and takes its
# environment (KUBECONFIG, CW_PROXY_URL, CW_ETCD_URL, CW_KUBECTL); down stops it.
up() {
	state=$work/cluster-$1
	cw_log "recording on a fresh control plane with --watch-cache=$1"
	CW_STATE_DIR=$state CW_WATCH_CACHE=$1 "$hack_dir/cluster.sh" up
	eval "$(CW_STATE_DIR=$state "$hack_dir/cluster.sh" env)"
}
down() {
	CW_STATE_DIR=$state "$hack_dir/cluster.sh" down
	state=
}

k() { "$CW_KUBECTL" --namespace=default "$@" >&2; }
# raw URI prints the body of a GET that must succeed; get FILE URI records it.
raw() { "$CW_KUBECTL" get --raw "$1"; }
get() { raw "$2" >"$rec/$1"; }
# get_as ACCEPT FILE URI records a GET through the proxy with that Accept header.
get_as() { curl -fsS -H "Accept: $1" "$CW_PROXY_URL$3" >"$rec/$2"; }
# get_gone FILE URI records the body of a GET that must answer 410 Gone.
get_gone() {
	local code
	code=$(curl -sS -o "$rec/$1" -w '%{http_code}' -H 'Accept: application/json' "$CW_PROXY_URL$2")
	[[ $code == 410 ]] || cw_die "$1: GET $2 answered $code, want 410"
}
# rv FILE and continue_of FILE print a recorded LIST's resourceVersion and continue
# token (escaped for a query).
rv() { jq -r .metadata.resourceVersion "$rec/$1"; }
continue_of() { jq -r '.metadata.continue | @uri' "$rec/$1"; }
# watch_from FILE URI [ACCEPT] records a watch of URI, which names the resourceVersion to
# start from, with bookmarks, until the server ends it after TIMEOUT (default 20) seconds.
watch_from() {
	local uri="$2&watch=true&allowWatchBookmarks=true&timeoutSeconds=${TIMEOUT:-20}"
	if [[ -n ${3:-} ]]; then get_as "$3" "$1" "$uri"; else get "$1" "$uri"; fi
}
# watch_open FILE URI [ACCEPT] starts watch_from in the background; watch_close waits for
# the server to end it.
watch_open() { watch_from "$@" & watcher=$!; }
watch_close() { wait "$watcher"; }
# has_event FILE TYPE: the recording FILE holds an event of TYPE.
has_event() { grep -q "\"type\":\"$2\"" "$rec/$1"; }
# wait_for WHAT CMD... retries CMD until it succeeds, for 60 s at most.
wait_for() {
	local what=$1 i
	shift
	for ((i = 0; i < 300; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	cw_die "no $what after 60 s"
}
# pods SELECTOR N EXCEPT: exactly N pods match SELECTOR, none named EXCEPT.
pods() {
	local names
	names=$("$CW_KUBECTL" get pods -l "$1" -o name)
	[[ $(grep -c . <<<"$names") == "$2" && $'\n'$names$'\n' != *"/$3"$'\n'* ]]
}
create() { k create -f -; }

# configmap NAME KEY VALUE [SELECTOR] prints a ConfigMap, annotated when SELECTOR is set.
configmap() {
	jq -n --arg name "$1" --arg k "$2" --arg v "$3" --arg sel "${4:-}" --arg key "$selector_key" \
		'{apiVersion: "v1", kind: "ConfigMap", metadata: {name: $name}, data: {($k): $v}}
		| if $sel == "" then . else .metadata.annotations[$key] = $sel end'
}
# secret NAME TYPE DATA [SELECTOR] prints a Secret whose data is the JSON object DATA.
secret() {
	jq -n --arg name "$1" --arg type "$2" --argjson data "$3" --arg sel "${4:-}" --arg key "$selector_key" \
		'{apiVersion: "v1", kind: "Secret", metadata: {name: $name}, type: $type, data: $data}
		| if $sel == "" then . else .metadata.annotations[$key] = $sel end'
}
# deployment NAME REPLICAS [CONFIGMAP] prints a Deployment of the book's image, its
# MESSAGE taken from CONFIGMAP's key message when set.
deployment() {
	jq -n --arg name "$1" --argjson n "$2" --arg cm "${3:-}" '
		{apiVersion: "apps/v1", kind: "Deployment", metadata: {name: $name, labels: {app: $name}},
		 spec: {replicas: $n, selector: {matchLabels: {app: $name}},
		   template: {metadata: {labels: {app: $name}},
		     spec: {containers: [{name: $name, image: "k8spatterns/mini-http-server"}
		       + if $cm == "" then {} else {env: [{name: "MESSAGE",
		           valueFrom: {configMapKeyRef: {name: $cm, key: "message"}}}]} end]}}}}'
}
# b64 TEXT; pem KIND N: PEM-shaped text that is no key or certificate (every secret
# scanner would flag a real one; the server checks only that a TLS Secret has both keys).
b64() { printf '%s' "$1" | base64 -w0; }
pem() { printf -- '-----BEGIN %s-----\n%s\n-----END %s-----\n' "$1" "$(b64 "made up for config-watcher's recordings, not a $1, version $2" | fold -w64)" "$1"; }
# registry PASSWORD: a .dockerconfigjson for a made-up registry and user.
registry() { jq -nc --arg p "$1" --arg auth "$(b64 "recorder:$1")" '{auths: {"registry.example": {username: "recorder", password: $p, auth: $auth}}}'; }
helm_release() {
	jq -n --arg v "$1" --arg release "$(b64 "made-up release $1 of webapp, where Helm keeps a gzipped manifest")" '
		{apiVersion: "v1", kind: "Secret", type: "helm.sh/release.v1",
		 metadata: {name: "sh.helm.release.v1.webapp.v\($v)", labels: {owner: "helm", name: "webapp", version: $v, status: "deployed"}},
		 data: {release: $release}}'
}

record_configmaps() {
	wait_for "default ServiceAccount" "$CW_KUBECTL" get serviceaccount default # pods need it
	configmap webapp-config message Hello app=webapp | create
	configmap other-config color blue | create
	deployment webapp 2 webapp-config | create
	wait_for "2 webapp pods" pods app=webapp 2 -
	get pods-list.json "$ns/pods?labelSelector=app%3Dwebapp"
	get list.json "$ns/configmaps"
	get list-page-1.json "$ns/configmaps?limit=1"
	get list-page-2.json "$ns/configmaps?limit=1&continue=$(continue_of list-page-1.json)"
	get watch-no-rv.ndjson "$ns/configmaps?watch=true&timeoutSeconds=2"

	watch_open watch-events.ndjson "$ns/configmaps?resourceVersion=$(rv list.json)"
	configmap watched-config message Hello app=webapp | create
	wait_for "ADDED in watch-events.ndjson" has_event watch-events.ndjson ADDED # the watch is open
	k patch configmap watched-config --type=merge -p '{"data":{"message":"Hello, World"}}'
	k label configmap watched-config tier=frontend
	k delete configmap watched-config
	watch_close

	local f size from
	for f in 1kib:1024 100kib:102400 1mib:1047552; do
		size=${f#*:}
		"$work/payload" "payload-$size" "$size" "$size" >"$work/old.json"
		"$work/payload" "payload-$size" $((size + 1000)) "$size" >"$work/new.json"
		from=$("$CW_KUBECTL" create -f "$work/old.json" -o jsonpath='{.metadata.resourceVersion}')
		k patch configmap "payload-$size" --type=merge --patch-file="$work/new.json"
		TIMEOUT=2 watch_from "modified-${f%%:*}.ndjson" "$ns/configmaps?resourceVersion=$from"
		k delete configmap "payload-$size"
	done
}

# record_pods records what the pod index reads: its metadata-only LIST and watch while a
# bare pod is created, labelled and deleted, then a webapp pod deleted and replaced; and a
# Running pod, its status written as a kubelet would (there is none here).
record_pods() {
	get_as "$accept_metadata_list" pods-metadata-list.json "$ns/pods"
	jq -n '{apiVersion: "v1", kind: "Pod", metadata: {name: "indexed-pod", labels: {app: "indexed"}},
		spec: {containers: [{name: "main", image: "k8spatterns/mini-http-server"}]}}' | create
	k label pod indexed-pod tier=x
	k delete pod indexed-pod
	local victim
	victim=$("$CW_KUBECTL" get pods -l app=webapp -o jsonpath='{.items[0].metadata.name}')
	k delete pod "$victim"
	wait_for "replacement of $victim" pods app=webapp 2 "$victim"
	watch_from pods-metadata-watch.ndjson "$ns/pods?resourceVersion=$(rv pods-metadata-list.json)" "$accept_metadata"

	deployment running 1 | create
	wait_for "running pod" pods app=running 1 -
	jq -n --arg now "$(date -u +%Y-%m-%dT%H:%M:%SZ)" '
		def cond($t): {type: $t, status: "True", lastProbeTime: null, lastTransitionTime: $now};
		{status: {phase: "Running", hostIP: "10.0.0.10", hostIPs: [{ip: "10.0.0.10"}],
		  podIP: "10.244.0.7", podIPs: [{ip: "10.244.0.7"}], startTime: $now, qosClass: "BestEffort",
		  conditions: [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
		  containerStatuses: [{name: "running", ready: true, started: true, restartCount: 1,
		    state: {running: {startedAt: $now}},
		    lastState: {terminated: {exitCode: 1, reason: "Error", startedAt: $now, finishedAt: $now,
		      containerID: "containerd://0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c"}},
		    image: "docker.io/k8spatterns/mini-http-server:latest",
		    imageID: "docker.io/k8spatterns/mini-http-server@sha256:5d3f1c0a9e8b7d6c5b4a392817f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c",
		    containerID: "containerd://1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b"}]}}' >"$work/status.json"
	k patch pod "$("$CW_KUBECTL" get pods -l app=running -o jsonpath='{.items[0].metadata.name}')" \
		--subresource=status --type=merge --patch-file="$work/status.json"
	get pods-running-list.json "$ns/pods?labelSelector=app%3Drunning"
}

record_secrets() {
	secret webapp-secret Opaque "{\"password\":\"$(b64 not-a-real-password)\"}" app=webapp | create
	secret other-secret Opaque "{\"token\":\"$(b64 not-a-real-token)\"}" | create
	helm_release 1 | create
	get secrets-list.json "$ns/secrets"
	get secrets-list-page-1.json "$ns/secrets?limit=2"
	get secrets-list-page-2.json "$ns/secrets?limit=2&continue=$(continue_of secrets-list-page-1.json)"
	get secrets-list-not-helm.json "$ns/secrets?fieldSelector=$not_helm"

	# blob: bytes that are not UTF-8 (0xff 0xfe), which a string conversion would mangle.
	local blob1 blob2
	blob1=$(printf '\xff\xfe\x00\x01 made-up bytes, one' | base64 -w0)
	blob2=$(printf '\xff\xfe\x00\x02 made-up bytes, two' | base64 -w0)
	secret watched-secret Opaque "{\"blob\":\"$blob1\",\"message\":\"$(b64 Hello)\"}" app=webapp | create
	k patch secret watched-secret --type=merge -p "{\"data\":{\"blob\":\"$blob2\"}}"
	k annotate secret watched-secret example.com/owner=team-a
	helm_release 2 | create # no event: the field selector holds on the watch too
	k patch secret watched-secret --type=merge -p '{"stringData":{"message":"Hello from stringData"}}'
	k delete secret watched-secret
	watch_from secrets-watch-events.ndjson "$ns/secrets?fieldSelector=$not_helm&resourceVersion=$(rv secrets-list-not-helm.json)"

	rotated secret-tls-rotated.ndjson webapp-tls kubernetes.io/tls \
		"$(jq -nc --arg c "$(pem CERTIFICATE 1)" --arg k "$(pem 'EXAMPLE KEY' 2)" '{"tls.crt": ($c|@base64), "tls.key": ($k|@base64)}')" \
		"$(jq -nc --arg c "$(pem CERTIFICATE 3)" --arg k "$(pem 'EXAMPLE KEY' 4)" '{"tls.crt": ($c|@base64), "tls.key": ($k|@base64)}')"
	rotated secret-dockerconfigjson.ndjson registry-credentials kubernetes.io/dockerconfigjson \
		"{\".dockerconfigjson\":\"$(b64 "$(registry first-made-up-password)")\"}" \
		"{\".dockerconfigjson\":\"$(b64 "$(registry second-made-up-password)")\"}"
}

# rotated FILE NAME TYPE DATA NEWDATA records a watch that sees the Secret NAME created
# with DATA, then its data replaced with NEWDATA.
rotated() {
	local from
	from=$(raw "$ns/secrets?limit=1" | jq -r .metadata.resourceVersion)
	secret "$2" "$3" "$4" app=webapp | create
	k patch secret "$2" --type=merge -p "{\"data\":$5}"
	TIMEOUT=2 watch_from "$1" "$ns/secrets?resourceVersion=$from"
	k delete secret "$2"
}

# record_gone records, with the watch cache off, an expired resourceVersion: noted, then
# 3 changes, then etcd's history compacted (through etcd's JSON gateway, as the API
# server's compactor does every 5 minutes).
record_gone() {
	configmap expiring-config message v0 app=webapp | create
	configmap expiring-config-2 message v0 app=webapp | create
	local from token rev v
	from=$(raw "$ns/configmaps" | jq -r .metadata.resourceVersion)
	token=$(raw "$ns/configmaps?limit=1" | jq -r '.metadata.continue | @uri')
	for v in v1 v2 v3; do k patch configmap expiring-config --type=merge -p "{\"data\":{\"message\":\"$v\"}}"; done
	rev=$(curl -fsS -H 'Content-Type: application/json' -d '{}' "$CW_ETCD_URL/v3/maintenance/status" | jq -r .header.revision)
	curl -fsS -H 'Content-Type: application/json' -d "{\"revision\":\"$rev\",\"physical\":true}" "$CW_ETCD_URL/v3/kv/compaction" >/dev/null
	TIMEOUT=10 watch_from watch-410.ndjson "$ns/configmaps?resourceVersion=$from"
	get_gone list-continue-410-status.json "$ns/configmaps?limit=1&continue=$token"
	get_gone list-exact-410-status.json "$ns/configmaps?resourceVersion=$from&resourceVersionMatch=Exact"
}

# check fails unless every file shows what it was recorded for.
check() {
	local f want got
	for f in watch-no-rv:'ADDED ADDED' watch-events:'ADDED MODIFIED MODIFIED DELETED( BOOKMARK)+' \
		modified-1kib:'MODIFIED( BOOKMARK)*' modified-100kib:'MODIFIED( BOOKMARK)*' modified-1mib:'MODIFIED( BOOKMARK)*' \
		pods-metadata-watch:'ADDED MODIFIED MODIFIED DELETED MODIFIED (DELETED ADDED|ADDED DELETED)( BOOKMARK)*' \
		secrets-watch-events:'ADDED MODIFIED MODIFIED MODIFIED DELETED( BOOKMARK)*' \
		secret-tls-rotated:'ADDED MODIFIED( BOOKMARK)*' secret-dockerconfigjson:'ADDED MODIFIED( BOOKMARK)*' \
		watch-410:ERROR; do
		want=${f#*:} f=${f%%:*}.ndjson
		got=$(jq -r .type "$rec/$f" | paste -sd ' ' -)
		[[ $got =~ ^($want)$ ]] || cw_die "$f holds the events '$got', want /$want/"
	done
	for f in list-page-1 secrets-list-page-1; do jq -e '(.metadata.continue // "") != ""' "$rec/$f.json" >/dev/null || cw_die "$f.json has no continue"; done
	for f in list-page-2 secrets-list-page-2; do jq -e '(.metadata.continue // "") == ""' "$rec/$f.json" >/dev/null || cw_die "$f.json is not the last page"; done
	jq -e '.object.code == 410' "$rec/watch-410.ndjson" >/dev/null || cw_die "watch-410.ndjson: no 410 Status"
	jq -e '.kind == "PartialObjectMetadataList"' "$rec/pods-metadata-list.json" >/dev/null || cw_die "pods-metadata-list.json: not metadata only"
	jq -e '.items | length == 1 and .[0].status.phase == "Running"' "$rec/pods-running-list.json" >/dev/null || cw_die "pods-running-list.json: no Running pod"
	if jq -r 'select(.type == "ADDED") | .object.data.blob' "$rec/secrets-watch-events.ndjson" | base64 -d | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1; then
		cw_die "secrets-watch-events.ndjson: blob is valid UTF-8"
	fi
}

if [[ ${1:-} == check ]]; then # hack/record.sh check [DIR]: check a recording
	rec=${2:-$out}
	check
	exit
fi
"$hack_dir/build-controlplane.sh"
(cd "$repo" && go build -o "$work/payload" ./hack/record)
mkdir "$rec"
up true
record_configmaps
record_pods
record_secrets
down
up false
record_gone
down
check

find "$out" -maxdepth 1 -type f \( -name '*.json' -o -name '*.ndjson' \) -delete
cp "$rec"/* "$out/"
sed -i "s/^Recorded from kube-apiserver .*/Recorded from kube-apiserver $("$CW_BIN_DIR/kube-apiserver" --version | awk '{print $2}') and etcd $("$CW_BIN_DIR/etcd" --version | awk '/etcd Version/ {print $3}')./" "$out/README.md"
cw_log "recorded $(find "$rec" -type f | wc -l) files into $out; running the unit tests that replay them"
(cd "$repo" && go test -count=1 ./apiclient/ ./watch/ ./policy/ ./podindex/) ||
	cw_die "the unit tests fail on the new recording (git checkout testdata/recorded restores the old one)"
