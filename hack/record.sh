#!/usr/bin/env bash
# Records real API server responses into testdata/recorded/ with hack/record (see its
# package doc), each phase on a fresh control plane of its own: `cached` with the watch
# cache on (the default, and what production runs: LIST, pods, every watch event type,
# large MODIFIED events), `uncached` with it off (an old resourceVersion answers 410 once
# etcd is compacted), `secrets` with it on (Secret LISTs and watches).
# Files are recorded into a scratch dir and replace the old ones only when all went well.
#
# Recording some phases replaces their files and their sections of the README and keeps
# the other phases' files byte for byte (those hold resourceVersions, uids and
# timestamps that change on every recording, and replay tests pin some of them).
#
# Usage: hack/record.sh [OUT_DIR]    (default testdata/recorded; also: make record)
#   RECORD_PHASES=secrets hack/record.sh    records only the phases named
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$hack_dir")"
# shellcheck source=hack/lib.sh
source "$hack_dir/lib.sh"

out="${1:-$repo/testdata/recorded}"
all_phases=(cached uncached secrets)
read -r -a phases <<<"${RECORD_PHASES:-${all_phases[*]}}"
for phase in "${phases[@]}"; do
	[[ " ${all_phases[*]} " == *" $phase "* ]] || { cw_log "unknown phase '$phase' in RECORD_PHASES (known: ${all_phases[*]})"; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-record.XXXXXX")
states=()
cleanup() {
	local s
	for s in "${states[@]}"; do CW_STATE_DIR=$s "$hack_dir/cluster.sh" down || true; done
	rm -rf "$work"
}
trap cleanup EXIT

"$hack_dir/build-controlplane.sh"
(cd "$repo" && go build -o "$work/record" ./hack/record)
mkdir -p "$work/out"

for phase in "${phases[@]}"; do
	state="$work/cluster-$phase"
	states+=("$state")
	cache=true
	[[ $phase == uncached ]] && cache=false
	cw_log "recording phase '$phase' on a fresh control plane with --watch-cache=$cache"
	CW_STATE_DIR=$state CW_WATCH_CACHE=$cache "$hack_dir/cluster.sh" up
	(
		eval "$(CW_STATE_DIR=$state "$hack_dir/cluster.sh" env)"
		"$work/record" -phase "$phase" -out "$work/out" -index "$work/index-$phase.md"
	)
	CW_STATE_DIR=$state "$hack_dir/cluster.sh" down
done

kube_version=$("$CW_BIN_DIR/kube-apiserver" --version | awk '{print $2}')
etcd_version=$("$CW_BIN_DIR/etcd" --version | awk '/etcd Version/ {print $3}')

# section PHASE prints PHASE's section of the previous README (nothing if it has none),
# without trailing blank lines; files PHASE prints the files its table names.
section() {
	[[ -f $out/README.md ]] || return 0
	awk -v head="## Phase \`$1\`" '
		index($0, head) == 1 { on = 1 }
		/^## / && index($0, head) != 1 { on = 0 }
		on && /^$/ { blank++; next }
		on { while (blank) { print ""; blank-- } print }' "$out/README.md"
}
files() { section "$1" | awk -F'`' '/^\| `/ { print $2 }'; }
recorded() { [[ " ${phases[*]} " == *" $1 "* ]]; }
declare -A cache_of=([cached]=on [uncached]=off [secrets]=on)

{
	cat <<EOF
# Recorded API server responses

Real responses of kube-apiserver **$kube_version** (etcd **$etcd_version**, both built from the
Go module proxy by \`hack/build-controlplane.sh\`), captured byte for byte by
\`hack/record\` for config-watcher's replay tests. Do not edit them by hand: re-record with

    make record        # = hack/record.sh; ~2 minutes once the control plane is built

Each phase's heading below says when it was last recorded and on which server:
\`RECORD_PHASES=secrets make record\` records that phase again and leaves the other
phases' files as they are.

How they were produced:
- \`hack/record.sh\` starts a fresh local control plane (\`hack/cluster.sh up\`: etcd,
  kube-apiserver with RBAC and token auth, kube-controller-manager, and a \`kubectl proxy\`
  ambassador), runs \`hack/record -phase cached\`, stops it, then does the same with the
  apiserver's \`--watch-cache=false\` for \`hack/record -phase uncached\`, and once more
  (watch cache on) for \`hack/record -phase secrets\`.
- Requests go through the \`kubectl proxy\`, as config-watcher's do, with
  \`Accept: application/json\`, except the \`pods-metadata-*\` files: those ask for
  metadata only, as the pod index's list + watch does (the Accept header is in their rows
  below). Each file is the response **body** exactly as received: a
  whole body for the \`.json\` files, the complete lines of the stream for the \`.ndjson\`
  files (one JSON event per line, each ending in \`\\n\`).
- Everything lives in namespace \`default\`. \`webapp-config\` is annotated
  \`k8spatterns.io/podDeleteSelector: app=webapp\`; the \`webapp\` Deployment (2 replicas)
  takes its \`MESSAGE\` from it. There is no scheduler and no kubelet, so pods stay Pending.
- Large data is pseudo-random text from a fixed word list (deterministic per seed; see
  \`text\` in hack/record/main.go): nothing secret.

What the server did that a client must expect (kube-apiserver $kube_version, seen here):
- A watch from a compacted resourceVersion (watch cache off) is **not** refused with HTTP
  410: it answers 200, sends one \`ERROR\` event whose object is a \`Status\` with
  \`code: 410, reason: Expired\`, and ends the stream (\`watch-410.ndjson\`). The HTTP 410
  comes from LIST: a continue token from before the compaction, or \`resourceVersionMatch=Exact\`
  at a compacted resourceVersion (\`list-*-410-status.json\`). The expired-continue Status
  carries a fresh \`metadata.continue\` (an inconsistent continuation); a client should list
  again from scratch instead.
- With the watch cache on, an expired resourceVersion is refused the same way (HTTP 200,
  then one \`ERROR\` 410 \`Expired\` event) but with the cache's own message,
  \`too old resource version: 1 (233)\`, and only once the cache's window has moved past
  it: shortly after the apiserver started, a watch from \`resourceVersion=1\` was accepted
  and replayed what the cache held. (Seen by hand on v1.37.2, not recorded here: when the
  window moves is not under the recorder's control.) Match on \`code\`/\`reason\`, never
  on the message.
- \`BOOKMARK\` events (cache on) may repeat the same resourceVersion (two in a row in
  \`watch-events.ndjson\`), and are only sent once the cache's resourceVersion has moved past
  the watch's own: on an idle resource a watch can see no bookmark at all before it times
  out. With the cache off there are no periodic bookmarks.
- A watch without resourceVersion starts with a synthetic \`ADDED\` per existing object
  (\`watch-no-rv.ndjson\`).
- Asked for metadata only (\`pods-metadata-*\`), the server sends \`PartialObjectMetadataList\`
  and \`PartialObjectMetadata\` objects (\`apiVersion: meta.k8s.io/v1\`: list items, watch
  objects and the BOOKMARK's alike), but the \`Content-Type\` that reaches the client through
  the proxy is plain \`application/json\`: tell the form by \`kind\`, not by the header.
- Deleting a pod that was never scheduled removes it at once, but a watch sees two events, each
  with its own resourceVersion: a \`MODIFIED\` with \`deletionTimestamp\` set (and
  \`deletionGracePeriodSeconds: 0\`), then the \`DELETED\`. A ReplicaSet's replacement can be
  \`ADDED\` between the two: the controller counts a terminating pod as gone. The order this
  recording saw is in the row of \`pods-metadata-watch.ndjson\`.
- A Secret's \`data\` values are base64 in JSON, whatever their bytes (\`blob\` in
  \`secrets-watch-events.ndjson\` is not UTF-8). A value written through \`stringData\`
  arrives as \`data\`; no event or LIST item carries \`stringData\`.
- \`fieldSelector=type!=helm.sh/release.v1\` is applied by the server, to the LIST and to
  the watch alike: a Helm release Secret created during the watch sends no event at all.
- The server checks a \`kubernetes.io/tls\` Secret only for both keys, and a
  \`kubernetes.io/dockerconfigjson\` one only for JSON: the recordings hold PEM-shaped text
  and a made-up registry, nothing that is a credential.
EOF
	for phase in "${all_phases[@]}"; do
		echo
		if recorded "$phase"; then
			# shellcheck disable=SC2016 # the backquotes are Markdown
			printf '## Phase `%s`: watch cache %s, kube-apiserver %s, etcd %s, recorded %s\n\n' \
				"$phase" "${cache_of[$phase]}" "$kube_version" "$etcd_version" "$(date -u +%Y-%m-%d)"
			printf '| file | watch cache | request | HTTP status, Content-Type | size | what it holds |\n|---|---|---|---|---|---|\n'
			cat "$work/index-$phase.md"
		else
			section "$phase"
		fi
	done
} >"$work/out/README.md"

mkdir -p "$out"
# Replace what the phases recorded had, so no stale file of theirs survives; a whole
# recording replaces every file.
if ((${#phases[@]} == ${#all_phases[@]})); then
	find "$out" -maxdepth 1 -type f \( -name '*.json' -o -name '*.ndjson' \) -delete
else
	for phase in "${phases[@]}"; do
		files "$phase" | while read -r f; do rm -f "${out:?}/$f"; done
	done
fi
cp "$work/out/"* "$out/"
cw_log "recorded $(find "$work/out" -type f | wc -l) files into $out"
