#!/usr/bin/env bash
# The book's scenario, narrated, on a local control plane: a ConfigMap's data changes and
# config-watcher deletes the pods of the Deployment that reads it, so that they come back
# with the new configuration; then the same for a Secret the pods read, rotated once.
# Tears everything down on exit (also on Ctrl-C).
#
# Usage: hack/demo.sh    (or: make demo)
#
# Environment: DEMO_PAUSE (seconds between steps, default 1), plus hack/cluster.sh's.
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$hack_dir")"
# shellcheck source=hack/lib.sh
source "$hack_dir/lib.sh"

pause=${DEMO_PAUSE:-1}
if [[ -t 1 ]]; then bold=$'\e[1m' dim=$'\e[2m' reset=$'\e[0m'; else bold='' dim='' reset=''; fi
step=0
say() { step=$((step + 1)); printf '\n%s[%d] %s%s\n' "$bold" "$step" "$*" "$reset"; sleep "$pause"; }
why() { printf '    %s%s%s\n' "$dim" "$*" "$reset"; }
run() {
	local shown=("$@")
	[[ $1 == k ]] && shown[0]=kubectl
	printf '    $ %s\n' "${shown[*]}"
	"$@" 2>&1 | sed 's/^/      /'
}

work=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-demo.XXXXXX")
export CW_STATE_DIR="$work/cluster"
pids=()
teardown() {
	local rc=$? p
	printf '\n%s[end] Tearing down: config-watcher, the control plane, %s%s\n' "$bold" "$work" "$reset"
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	"$hack_dir/cluster.sh" down >/dev/null 2>&1 || true
	rm -rf "$work"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

say "Building (or reusing) the control plane: etcd, kube-apiserver, kube-controller-manager"
why "Built from the Go module proxy once (~15 min on 2 cores), then cached in $CW_BIN_DIR."
"$hack_dir/build-controlplane.sh"

say "Starting a local control plane, with kubectl proxy as the ambassador"
why "No scheduler and no kubelet: pods are created but stay Pending. That is all we need to"
why "see pods deleted and recreated."
"$hack_dir/cluster.sh" up
eval "$("$hack_dir/cluster.sh" env)"
kubectl=$CW_KUBECTL
k() { "$kubectl" "$@"; }

say "Building config-watcher and starting it, talking to the API through the ambassador"
why "The controller only knows plain HTTP to $CW_PROXY_URL; kubectl proxy adds TLS and credentials."
(cd "$repo" && go build -o "$work/config-watcher" .)
# Secrets on, as the component manifests/secrets does: the key of their data digests is a
# file here rather than a mounted Secret.
head -c 32 /dev/urandom >"$work/digest-key"
http_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
WATCH_NAMESPACE=default API_URL=$CW_PROXY_URL HTTP_ADDR=127.0.0.1:$http_port LOG_LEVEL=info POD_NAME=config-watcher-demo \
	WATCH_SECRETS=true DIGEST_KEY_FILE="$work/digest-key" "$work/config-watcher" >"$work/config-watcher.log" 2>&1 &
pids+=("$!")
# Process substitution keeps $! the pid of tail (not of sed), so teardown can stop it.
tail -n +1 -F "$work/config-watcher.log" 2>/dev/null > >(sed -u "s/^/    ${dim}[config-watcher]${reset} /") &
pids+=("$!")
for ((i = 0; i < 150; i++)); do
	curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1 && break
	kill -0 "${pids[0]}" 2>/dev/null || cw_die "config-watcher exited; see its log above"
	sleep 0.2
done
curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null || cw_die "config-watcher not ready after 30 s"
why "Ready: it listed the ConfigMaps and Secrets in 'default' and is watching them."

say "Deploying the webapp: the webapp-config ConfigMap, the webapp-credentials Secret, the webapp Deployment"
run k apply -n default -k "$repo/manifests/demo/"
why "The annotation k8spatterns.io/podDeleteSelector: app=webapp tells config-watcher which pods"
why "to restart when this ConfigMap's data changes. Environment variables are read only at"
why "container start, so the pods must be replaced to see new data."

# wait_replaced waits until none of the pods in old is left and two others run, in now.
wait_replaced() {
	local gone=0 i p
	for ((i = 0; i < 300; i++)); do
		mapfile -t now < <(live_pods)
		gone=1
		for p in "${old[@]}"; do [[ " ${now[*]} " == *" $p "* ]] && gone=0; done
		((gone == 1 && ${#now[@]} == 2)) && break
		sleep 0.2
	done
	sleep 1
	((gone == 1)) || cw_die "the old pods are still there after 60 s"
}
live_pods() { k get pods -n default -l app=webapp -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}}{{"\n"}}{{end}}{{end}}'; }
for ((i = 0; i < 300; i++)); do
	(($(live_pods | grep -c .) == 2)) && break
	sleep 0.2
done
run k get pods -n default -l app=webapp
mapfile -t old < <(live_pods)

annotation='{.metadata.annotations.config-watcher\.k8spatterns\.io/restarted-for}'
for ((i = 0; i < 150; i++)); do
	[[ -n $(k get configmap webapp-config -n default -o jsonpath="$annotation") ]] && break
	sleep 0.2
done
adopted=$(k get configmap webapp-config -n default -o jsonpath="$annotation")
why "config-watcher saw the ConfigMap for the first time and adopted it: it recorded the hash"
why "of its data (config-watcher.k8spatterns.io/restarted-for=${adopted:0:12}…) and deleted nothing."

say "Changing the ConfigMap's data, while watching the pods"
"$kubectl" get pods -n default -l app=webapp -w --output-watch-events --no-headers 2>/dev/null \
	> >(sed -u "s/^/    ${dim}[pods -w]${reset} /") &
watch_pid=$!
pids+=("$watch_pid")
sleep 1
why "config-watcher will see a MODIFIED event whose data hash differs from the recorded one,"
why "delete each pod matching app=webapp (once), and the Deployment's ReplicaSet creates new ones."
run k patch configmap webapp-config -n default --type merge -p '{"data":{"message":"Hello, World"}}'

wait_replaced
kill "$watch_pid" 2>/dev/null || true

say "Result: two new pods, started after the change"
run k get pods -n default -l app=webapp
printf '    old: %s\n    new: %s\n' "${old[*]}" "${now[*]}"
why "Restarted for data hash: $(k get configmap webapp-config -n default -o jsonpath="$annotation" | cut -c1-12)…"
why "From config-watcher's /metrics:"
curl -fsS "http://127.0.0.1:$http_port/metrics" | grep -E '^config_watcher_(pod_deletions|reconciles)_total' | sed 's/^/      /'
why "And the Kubernetes Events config-watcher left on the ConfigMap (kubectl describe shows them too):"
for ((i = 0; i < 50; i++)); do
	events=$(k get events -n default --field-selector involvedObject.name=webapp-config -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message --no-headers 2>/dev/null || true)
	[[ -n $events ]] && break
	sleep 0.1
done
printf '%s\n' "${events:-(none yet)}" | sed 's/^/      /'

say "Changing only a label: nothing should restart"
metric() { curl -fsS "http://127.0.0.1:$http_port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
before=$(metric 'config_watcher_events_total{type="MODIFIED"}')
run k label configmap webapp-config -n default demo=label-only
for ((i = 0; i < 100; i++)); do
	[[ $(metric 'config_watcher_events_total{type="MODIFIED"}') != "$before" ]] && break
	sleep 0.2
done
sleep 1
mapfile -t after < <(live_pods)
if [[ "${after[*]}" == "${now[*]}" ]]; then
	why "config-watcher saw the MODIFIED event, found the data hash unchanged, and left the pods alone:"
	why "same pods as before (${after[*]})."
else
	why "Unexpected: the pods changed to ${after[*]}"
fi

say "Rotating the webapp's Secret: its pods restart too"
why "The same annotation on the Secret webapp-credentials; the pods read its token as API_TOKEN."
why "Nothing is written on the Secret: config-watcher keeps its state in a ConfigMap of its own,"
why "config-watcher-secret.webapp-credentials, owned by the Secret, as a keyed digest (HMAC)."
state='configmap/config-watcher-secret.webapp-credentials'
for ((i = 0; i < 150; i++)); do
	[[ -n $(k get "$state" -n default -o jsonpath="$annotation" 2>/dev/null) ]] && break
	sleep 0.2
done
old=("${now[@]}")
run k patch secret webapp-credentials -n default --type merge -p '{"stringData":{"token":"demo-token-2"}}'
wait_replaced
run k get pods -n default -l app=webapp
printf '    old: %s\n    new: %s\n' "${old[*]}" "${now[*]}"
why "The state ConfigMap's annotations (the digest is keyed: it cannot be tested against guesses):"
# shellcheck disable=SC2016 # a Go template, not a shell expansion
k get "$state" -n default -o go-template='{{range $k, $v := .metadata.annotations}}{{$k}}={{$v}}{{"\n"}}{{end}}' | sed 's/^/      /'
why "The Event on the Secret names its resourceVersion, never a digest of its data:"
for ((i = 0; i < 50; i++)); do
	events=$(k get events -n default --field-selector involvedObject.kind=Secret,involvedObject.name=webapp-credentials -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message --no-headers 2>/dev/null || true)
	[[ -n $events ]] && break
	sleep 0.1
done
printf '%s\n' "${events:-(none yet)}" | sed 's/^/      /'
