#!/usr/bin/env bash
# The book's scenario, narrated, on a local control plane: a ConfigMap's data changes and
# config-watcher restarts the pods of the Deployment that reads it, a few at a time, each
# wave waiting until the replacements are Ready; then a bad change that halts the rollout
# with a Warning Event, and the fix; then the same for a Secret the pods read, rotated once;
# then, with no selector, the pods restarted because they read the key that changed.
# Tears everything down on exit (also on Ctrl-C).
#
# The control plane has no kubelet, so no pod ever becomes Ready by itself: the demo plays
# the kubelet's part in readiness, as the e2e suite does. It reports each webapp pod Ready
# through its status (PATCH pods/NAME/status) DEMO_READY_AFTER seconds after the pod
# appears, unless the pod starts with an empty message, which this webapp refuses: such a
# pod stays not Ready, as a crash-looping pod does.
#
# Usage: hack/demo.sh    (or: make demo)
#
# Environment: DEMO_PAUSE (seconds between steps, default 1), DEMO_READY_AFTER (default 1),
# plus hack/cluster.sh's.
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$hack_dir")"
# shellcheck source=hack/lib.sh
source "$hack_dir/lib.sh"

pause=${DEMO_PAUSE:-1}
ready_after=${DEMO_READY_AFTER:-1}
replicas=4
# The demo's PROGRESS_DEADLINE: a rollout that can restart no pod for this long halts. The
# default, 10m, is a Deployment's; a demo cannot wait that long.
progress_deadline=20s
if [[ -t 1 ]]; then bold=$'\e[1m' dim=$'\e[2m' reset=$'\e[0m'; else bold='' dim='' reset=''; fi
step=0
say() { step=$((step + 1)); printf '\n%s[%d] %s%s\n' "$bold" "$step" "$*" "$reset"; sleep "$pause"; }
why() { printf '    %s%s%s\n' "$dim" "$*" "$reset"; }
# quote prints its words as they must be typed: a word with anything but plain characters
# in single quotes, so that an echoed command can be copied and run as it is.
quote() {
	local plain='^[A-Za-z0-9_./:=@%+,-]+$' out=() w
	for w in "$@"; do
		if [[ $w =~ $plain ]]; then out+=("$w"); else out+=("'${w//\'/\'\\\'\'}'"); fi
	done
	printf '%s' "${out[*]}"
}
run() {
	local shown=("$@")
	[[ $1 == k ]] && shown[0]=kubectl
	printf '    $ %s\n' "$(quote "${shown[@]}")"
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

say "Building (or reusing) the control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl"
why "Built from the Go module proxy once (about 15-25 min on 2 cores), then cached in $CW_BIN_DIR."
"$hack_dir/build-controlplane.sh"

say "Starting a local control plane, with kubectl proxy as the ambassador"
why "No scheduler and no kubelet: pods are created but never run. The demo plays the kubelet's"
why "part in readiness: ${ready_after} s after a webapp pod appears it reports it Ready through its"
why "status, as a kubelet does once the readiness probe passes, unless the pod starts with an"
why "empty message, which this webapp refuses: then it stays not Ready."
"$hack_dir/cluster.sh" up
eval "$("$hack_dir/cluster.sh" env)"
kubectl=$CW_KUBECTL
k() { "$kubectl" "$@"; }

# webapp_pods prints each webapp pod that is not terminating as "NAME UID READY", READY the
# status of its Ready condition ("-" before it has one).
webapp_pods() {
	k get pods -n default -l app=webapp -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}} {{.metadata.uid}} {{range .status.conditions}}{{if eq .type "Ready"}}{{.status}}{{end}}{{end}}{{"\n"}}{{end}}{{end}}' |
		while read -r name uid ready; do printf '%s %s %s\n' "$name" "$uid" "${ready:--}"; done
}
# webapp_names prints the live webapp pods' names, sorted: the same before and after a
# change that restarted none.
webapp_names() { webapp_pods | cut -d' ' -f1 | sort; }

# play_kubelet reports each new webapp pod Ready ready_after seconds after it first sees
# it, if the message was set then (a container's environment is fixed at its start).
# The message is read just after the pods are listed, so a pod is judged by the data of
# its start: the demo changes the data only while no pod is being created (a round is
# done or halted), as the e2e suite's stand-in does.
play_kubelet() {
	local -A first=() starts=()
	local name uid ready message now pods
	while :; do
		sleep 0.3
		now=$(date +%s%3N)
		pods=$(webapp_pods)
		message=$(k get configmap webapp-config -n default -o jsonpath='{.data.message}' 2>/dev/null) || continue # no webapp yet
		while read -r name uid ready; do
			[[ -z $name || $ready == True ]] && continue
			if [[ ! -v first[$uid] ]]; then
				first[$uid]=$now starts[$uid]=${message:+set}
			elif [[ ${starts[$uid]} == set ]] && ((now - first[$uid] >= ready_after * 1000)); then
				k patch pod "$name" -n default --subresource=status --type=strategic -p \
					"{\"metadata\":{\"uid\":\"$uid\"},\"status\":{\"phase\":\"Running\",\"conditions\":[{\"type\":\"ContainersReady\",\"status\":\"True\"},{\"type\":\"Ready\",\"status\":\"True\"}]}}" \
					>/dev/null 2>&1 || true # restarted meanwhile: nothing to report
				starts[$uid]=reported
			fi
		done <<<"$pods"
	done
}
play_kubelet &
pids+=("$!")

say "Building config-watcher and starting it, talking to the API through the ambassador"
why "The controller only knows plain HTTP to $CW_PROXY_URL; kubectl proxy adds TLS and credentials."
why "Default settings but PROGRESS_DEADLINE=$progress_deadline (default 10m), so that a halt shows in seconds."
(cd "$repo" && go build -o "$work/config-watcher" .)
# Secrets on, as the component manifests/secrets does: the key of their data digests is a
# file here rather than a mounted Secret.
head -c 32 /dev/urandom | base64 >"$work/digest-key"
http_port=$(cw_free_port)
WATCH_NAMESPACE=default API_URL=$CW_PROXY_URL HTTP_ADDR=127.0.0.1:$http_port LOG_LEVEL=info POD_NAME=config-watcher-demo \
	PROGRESS_DEADLINE=$progress_deadline WATCH_SECRETS=true DIGEST_KEY_FILE="$work/digest-key" \
	"$work/config-watcher" >"$work/config-watcher.log" 2>&1 &
pids+=("$!")
# Process substitution keeps $! the pid of tail (not of sed), so teardown can stop it.
tail -n +1 -F "$work/config-watcher.log" 2>/dev/null > >(sed -u "s/^/    ${dim}[config-watcher]${reset} /") &
pids+=("$!")
for ((i = 0; i < 150; i++)); do
	curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1 && break
	kill -0 "${pids[1]}" 2>/dev/null || cw_die "config-watcher exited; see its log above"
	sleep 0.2
done
curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null || cw_die "config-watcher not ready after 30 s"
why "Ready: it listed the ConfigMaps and Secrets in 'default' and is watching them."

metric() { curl -fsS "http://127.0.0.1:$http_port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
annotation='{.metadata.annotations.config-watcher\.k8spatterns\.io/restarted-for}'
record() { k get "${1:-configmap/webapp-config}" -n default -o jsonpath="$annotation" 2>/dev/null || true; }
show_pods() {
	printf '    $ %s\n' "kubectl get pods -n default -l app=webapp -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type==\"Ready\")].status'"
	k get pods -n default -l app=webapp -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status' | sed 's/^/      /'
}
show_events() { # reason...
	local events i
	for ((i = 0; i < 50; i++)); do
		events=$(k get events -n default --field-selector "involvedObject.name=$1" -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message --no-headers 2>/dev/null || true)
		[[ -n $events ]] && break
		sleep 0.1
	done
	printf '%s\n' "${events:-(none yet)}" | sed 's/^/      /'
}
# until_ok runs "$@" every 0.2 s until it succeeds, for at most $1 seconds.
until_ok() {
	local limit=$1 i
	shift
	for ((i = 0; i < limit * 5; i++)); do
		"$@" && return 0
		sleep 0.2
	done
	return 1
}
ready_pods() { (($(webapp_pods | awk '$3 == "True"' | grep -c .) == replicas)); }
round_done() { # OBJECT RECORD: the object records data other than RECORD, and no intent is left
	local got
	got=$(k get "$1" -n default -o jsonpath="$annotation/{.metadata.annotations.config-watcher\.k8spatterns\.io/restarting}" 2>/dev/null) || return 1
	[[ $got != "$2/"* && $got == */ && $got != / ]]
}
halted() { [[ -n $(k get events -n default --field-selector involvedObject.name=webapp-config,reason=RolloutHalted -o name 2>/dev/null) ]]; }

# remember_pods notes the webapp pods and their readiness as they are now; narrate tells
# what changes from there. Call it before the change, which config-watcher acts on at once.
declare -A was=()
remember_pods() {
	local name uid ready
	was=()
	while read -r name uid ready; do was[$name]=$ready; done < <(webapp_pods)
}

# roll_out PATCH merges PATCH into webapp-config and narrates the rollout that follows.
roll_out() {
	local from
	from=$(record)
	remember_pods
	run k patch configmap webapp-config -n default --type merge -p "$1"
	narrate rolled_out configmap/webapp-config "$from"
}

# at prints a line of narrate's: the seconds since it began, what happened, how many pods
# are Ready. start and n are narrate's (bash functions see their caller's locals).
at() { printf '    %6.1fs  %-44s Ready: %d of %d\n' "$((($(date +%s%3N) - start) / 100))e-1" "$1" "$n" "$replicas"; }

# narrate prints, until "$@" succeeds (or about 2 minutes pass), each webapp pod that
# becomes Ready, each one config-watcher restarts and each replacement, with how many pods
# are Ready then; at the end, the fewest that were Ready at any moment.
narrate() {
	local -A is=()
	local start name uid ready fewest=$replicas n i
	start=$(date +%s%3N)
	for ((i = 0; ; i++)); do
		is=()
		while read -r name uid ready; do is[$name]=$ready; done < <(webapp_pods)
		n=0
		for name in "${!is[@]}"; do [[ ${is[$name]} == True ]] && n=$((n + 1)); done
		((n < fewest)) && fewest=$n
		for name in "${!is[@]}"; do
			[[ ${is[$name]} == True && ${was[$name]:-} != True ]] && at "$name is Ready"
		done
		for name in "${!was[@]}"; do
			[[ -v is[$name] ]] || at "restarted $name"
		done
		for name in "${!is[@]}"; do
			[[ -v was[$name] ]] || at "replacement $name"
		done
		was=()
		for name in "${!is[@]}"; do was[$name]=${is[$name]}; done
		"$@" && break
		((i < 400)) || cw_die "not done after 2 min: $*"
		sleep 0.3
	done
	why "Fewest Ready webapp pods at any moment: $fewest of $replicas."
}
# rolled_out: the round of OBJECT recorded data other than RECORD, and every pod is Ready.
rolled_out() { round_done "$1" "$2" && ready_pods; }

say "Deploying the webapp: the webapp-config ConfigMap, the webapp-credentials Secret, the webapp Deployment"
run k apply -n default -k "$repo/manifests/demo/"
run k scale deployment webapp -n default --replicas=$replicas
why "The annotation k8spatterns.io/podDeleteSelector: app=webapp tells config-watcher which pods"
why "to restart when this ConfigMap's data changes. Environment variables are read only at"
why "container start, so the pods must be replaced to see new data."
until_ok 60 ready_pods || cw_die "the webapp pods are not Ready after 60 s"
until_ok 30 round_done configmap/webapp-config "" || cw_die "config-watcher did not adopt webapp-config"
show_pods
adopted=$(record)
why "config-watcher saw the ConfigMap for the first time and adopted it: it recorded the hash"
why "of its data (config-watcher.k8spatterns.io/restarted-for=${adopted:0:12}…) and deleted nothing."

say "Changing the ConfigMap's data: the pods restart in waves"
why "MAX_UNAVAILABLE is 25 % (the default): of $replicas pods, one may be down at a time. Each wave"
why "restarts one Ready pod, then waits until its replacement is Ready before the next."
roll_out '{"data":{"message":"Hello, World"}}'
changed=$(record)
why "Restarted for data hash: ${changed:0:12}…; from config-watcher's /metrics:"
curl -fsS "http://127.0.0.1:$http_port/metrics" | grep -E '^config_watcher_(pod_deletions|reconciles)_total' | grep -v ' 0$' | sed 's/^/      /'
why "And the Kubernetes Events config-watcher left on the ConfigMap (kubectl describe shows them too):"
show_events webapp-config

say "A bad change: an empty message, which this webapp refuses to start with"
why "The first replacement never becomes Ready. No other pod may go while it is not, so after"
why "PROGRESS_DEADLINE ($progress_deadline here) with no restart possible, the rollout halts: the other"
why "pods keep serving the old message."
remember_pods
run k patch configmap webapp-config -n default --type merge -p '{"data":{"message":""}}'
narrate halted
show_pods
why "The Warning Event, and the gauge config_watcher_rounds_halted=$(metric config_watcher_rounds_halted):"
k get events -n default --field-selector involvedObject.name=webapp-config,reason=RolloutHalted -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message --no-headers | sed 's/^/      /'

say "The fix: a good message again"
why "The fix is a new change: its round restarts the pod that is not Ready first (it serves"
why "nothing), then the others in waves."
roll_out '{"data":{"message":"Hello again"}}'
why "No round halted any more: config_watcher_rounds_halted=$(metric config_watcher_rounds_halted)."
show_pods

say "Changing only a label: nothing should restart"
now=$(webapp_names)
before=$(metric 'config_watcher_events_total{type="MODIFIED"}')
run k label configmap webapp-config -n default demo=label-only
until_ok 20 test "$(metric 'config_watcher_events_total{type="MODIFIED"}')" != "$before" || true
sleep 1
if [[ $(webapp_names) == "$now" ]]; then
	why "config-watcher saw the MODIFIED event, found the data hash unchanged, and left the pods alone:"
	why "the same $replicas pods as before."
else
	why "Unexpected: the pods changed to $(webapp_names | tr '\n' ' ')"
fi

say "Rotating the webapp's Secret: its pods restart too, in waves"
why "The same annotation on the Secret webapp-credentials; the pods read its token as API_TOKEN."
why "Nothing is written on the Secret: config-watcher keeps its state in a ConfigMap of its own,"
why "config-watcher-secret.webapp-credentials, owned by the Secret, as a keyed digest (HMAC)."
state='configmap/config-watcher-secret.webapp-credentials'
until_ok 30 round_done "$state" "" || cw_die "config-watcher did not adopt the Secret"
secret_adopted=$(record "$state")
remember_pods
run k patch secret webapp-credentials -n default --type merge -p '{"stringData":{"token":"demo-token-2"}}'
narrate rolled_out "$state" "$secret_adopted"
why "The state ConfigMap's annotations (the digest is keyed: it cannot be tested against guesses):"
# shellcheck disable=SC2016 # a Go template, not a shell expansion
k get "$state" -n default -o go-template='{{range $k, $v := .metadata.annotations}}{{$k}}={{$v}}{{"\n"}}{{end}}' | sed 's/^/      /'
why "The Event on the Secret names its resourceVersion, never a digest of its data:"
show_events webapp-credentials

say "Restarting the pods that read the ConfigMap, with no selector, down to the key"
why "Instead of a selector, k8spatterns.io/restartReferencingPods: \"true\" restarts the pods of the"
why "namespace whose containers read this ConfigMap (env, envFrom, a volume), and of those that read"
why "keys by name only the ones that read a key that changed. The webapp reads the key message."
run k annotate configmap webapp-config -n default k8spatterns.io/podDeleteSelector- k8spatterns.io/restartReferencingPods=true
keys='{.metadata.annotations.config-watcher\.k8spatterns\.io/restarted-for-keys}'
has_keys() { [[ -n $(k get configmap/webapp-config -n default -o jsonpath="$keys" 2>/dev/null) ]]; }
until_ok 30 has_keys || cw_die "config-watcher did not record the keys of webapp-config"
why "config-watcher recorded a short digest of each key beside the record:"
printf '      %s\n' "$(k get configmap/webapp-config -n default -o jsonpath="$keys")"
now=$(webapp_names)
unread=$(record)
run k patch configmap webapp-config -n default --type merge -p '{"data":{"note":"a key no pod reads"}}'
until_ok 30 round_done configmap/webapp-config "$unread" || cw_die "config-watcher did not record the change of an unread key"
if [[ $(webapp_names) == "$now" ]]; then
	why "A key no pod reads changed: the data's record moved on, and no pod was restarted."
else
	why "Unexpected: the pods changed to $(webapp_names | tr '\n' ' ')"
fi
roll_out '{"data":{"message":"Hello from the key"}}'
why "The key the webapp reads changed: its pods restarted, in waves, as with the selector:"
k get events -n default --field-selector involvedObject.name=webapp-config,reason=PodsRestarted -o custom-columns=MESSAGE:.message --no-headers |
	grep referencing | sed 's/^/      /'
