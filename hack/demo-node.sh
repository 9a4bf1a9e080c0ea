#!/usr/bin/env bash
# The book's demo on a real node, narrated: installed as the README says (a release's
# install.yaml: the controller with its ambassador; manifests/demo: the webapp), pods
# placed by kube-scheduler and run by a kubelet, the webapp serves its message over HTTP;
# a patch of the ConfigMap makes config-watcher delete the pods, and their replacements
# serve the new message.
#
# Usage: make demo-node   (runs `hack/node.sh run hack/demo-node.sh`; needs the node's
# environment: run directly, it stops and says so)
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$hack_dir")"
# shellcheck source=hack/lib.sh
source "$hack_dir/lib.sh"
[[ -n ${CW_NODE_NAME:-} && -n ${CW_KUBECTL:-} && -n ${CW_RELEASE_DIST:-} ]] || cw_die "no node here: run make demo-node (hack/node.sh run $0)"

ns=default
if [[ -t 1 ]]; then bold=$'\e[1m' reset=$'\e[0m'; else bold='' reset=''; fi
step=0
say() { step=$((step + 1)); printf '\n%s[%d] %s%s\n' "$bold" "$step" "$*" "$reset"; }
k() { "$CW_KUBECTL" "$@"; }
run() {
	local shown=("$@")
	[[ $1 == k ]] && shown[0]=kubectl
	printf '    $ %s\n' "${shown[*]}"
	"$@" 2>&1 | sed 's/^/      /'
}
# serve: what each Ready webapp pod answers, fetched over HTTP inside the node's namespace.
serve() {
	local name ip gone
	while read -r name ip gone; do
		[[ -z $gone && -n $ip ]] || continue # terminating, or not started yet
		printf '      %s (%s): %s\n' "$name" "$ip" "$(curl -fsS --max-time 5 "http://$ip:8080/")"
	done < <(k get pods -n "$ns" -l app=webapp \
		-o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} {.metadata.deletionTimestamp}{"\n"}{end}')
}

say "Installing a release ($(awk '/app.kubernetes.io\/version:/ {print $2; exit}' "$CW_RELEASE_DIST/install.yaml")) and the demo webapp, for node $CW_NODE_NAME"
run k apply -f "$CW_RELEASE_DIST/install.yaml"
run k apply -n "$ns" -k "$repo/manifests/demo"
run k wait -n "$ns" --for=condition=Available deployment/config-watcher deployment/webapp --timeout=180s
run k wait -n "$ns" --for=condition=Ready pod -l app=webapp --timeout=180s
run k get pods -n "$ns" -o wide

say "The webapp serves the ConfigMap's message"
serve

message="Hello from a new ConfigMap ($(date -u +%H:%M:%S))"
say "Patching the ConfigMap's message: config-watcher deletes the webapp's pods"
old=$(k get pods -n "$ns" -l app=webapp -o jsonpath='{.items[*].metadata.uid}')
run k patch configmap webapp-config -n "$ns" --type=merge -p "{\"data\":{\"message\":\"$message\"}}"
deadline=$((SECONDS + 180))
while :; do
	now=$(k get pods -n "$ns" -l app=webapp -o jsonpath='{range .items[*]}{.metadata.uid} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}')
	fresh=0
	for u in $(awk '$2 == "True" {print $1}' <<<"$now"); do [[ " $old " == *" $u "* ]] || fresh=$((fresh + 1)); done
	[[ $fresh -eq 2 && $(wc -l <<<"$now") -eq 2 ]] && break
	((SECONDS < deadline)) || cw_die "the webapp's pods were not replaced within 180 s"
	sleep 1
done
run k get pods -n "$ns" -l app=webapp -o wide

say "The new pods serve the new message"
serve

say "What the controller said (kubectl logs, through the kubelet): one line per pod deleted"
run k logs -n "$ns" -l app.kubernetes.io/name=config-watcher -c config-watcher --prefix --tail=-1
