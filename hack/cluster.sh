#!/usr/bin/env bash
# A real, local Kubernetes control plane for the e2e tests and the demo: etcd,
# kube-apiserver (RBAC, token auth, audit log), kube-controller-manager (so Deployments
# get pods and namespaces get a default ServiceAccount) and a `kubectl proxy` ambassador.
# No kubelet, and by default no scheduler: pods stay Pending, which is all config-watcher
# needs (hack/node.sh, which adds a kubelet, sets CW_SCHEDULER=1).
#
# Usage: hack/cluster.sh up|down [--keep]|env|status
#
#   up      build the binaries if needed (hack/build-controlplane.sh), start everything,
#           wait until it is usable. Refuses if this state dir already runs a cluster.
#   down    stop what `up` started, by pid (SIGTERM, then SIGKILL after 5 s), and remove
#           the state dir (keep it with --keep or CW_KEEP_STATE=1).
#   env     print `export KUBECONFIG=… CW_PROXY_URL=…` for eval "$(hack/cluster.sh env)".
#   status  say what runs; exits 1 if a component is down.
#
# Environment:
#   CW_STATE_DIR        state dir: pids, logs, certs, kubeconfigs, audit log, etcd data
#                       (default ${TMPDIR:-/tmp}/config-watcher-cluster-<hash of repo path>,
#                       so two checkouts never share one; set it to run a second copy)
#   CW_ETCD_PORT, CW_ETCD_PEER_PORT, CW_APISERVER_PORT, CW_PROXY_PORT
#                       ports on 127.0.0.1 (default: free ports picked at `up`)
#   CW_WATCH_CACHE      kube-apiserver --watch-cache (default true; hack/record.sh runs one of each)
#   CW_APISERVER_ARGS   extra kube-apiserver flags, space-separated
#   CW_KCM_EXTRA_CONTROLLERS  more kube-controller-manager controllers, comma-separated
#                       (hack/node.sh: root-ca-cert-publisher, for pods' kube-root-ca.crt;
#                       nodelifecycle, which lifts a new Node's not-ready taint)
#   CW_SCHEDULER        1 starts kube-scheduler too (hack/node.sh), serving no port: it
#                       only talks to the apiserver on 127.0.0.1
#   CW_KEEP_STATE       1 keeps the state dir on `down`
#   CW_CACHE_DIR, CW_ETCD_VERSION, CW_KUBE_VERSION, CW_SYSTEM_KUBECTL   see hack/lib.sh
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
source "$hack_dir/lib.sh"

repo_hash=$(printf '%s' "$(dirname "$hack_dir")" | cksum | cut -d' ' -f1)
STATE="${CW_STATE_DIR:-${TMPDIR:-/tmp}/config-watcher-cluster-$repo_hash}"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kubectl-proxy)
[[ ${CW_SCHEDULER:-} == 1 ]] && COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl-proxy)

# free_ports N prints N distinct free TCP ports on 127.0.0.1, one a line.
free_ports() {
	if command -v python3 >/dev/null 2>&1; then
		python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
PY
		return
	fi
	# No python3: probe random ports; a refused connection means nobody listens there.
	local n=0 p seen=" "
	while ((n < $1)); do
		p=$((20000 + RANDOM % 40000))
		[[ $seen == *" $p "* ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			seen+="$p "
			n=$((n + 1))
		fi
	done
}

# alive NAME: true if the pid recorded for NAME runs and is still the process we started
# (its command line names our state dir), so a recycled pid is never signalled.
alive() {
	local pidfile="$STATE/$1.pid" pid cmdline
	[[ -f $pidfile ]] || return 1
	pid=$(<"$pidfile")
	cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
	[[ $cmdline == *"$STATE"* ]]
}

# start NAME CMD...: starts CMD in its own session, logging to $STATE/NAME.log. It returns
# once the child runs CMD: until its exec, the fork's command line is this script's, which
# names no state dir, and alive would take a child not yet started on a loaded machine for
# one that exited (an empty log, "exited during start-up").
start() {
	local name=$1 pid i
	shift
	setsid "$@" >"$STATE/$name.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >"$STATE/$name.pid"
	for ((i = 0; i < 500; i++)); do
		[[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *"$STATE"* ]] && return 0
		kill -0 "$pid" 2>/dev/null || return 0 # gone: wait_for says so
		sleep 0.01
	done
}

stop_one() {
	local name=$1 pid i
	alive "$name" || { rm -f "$STATE/$name.pid"; return 0; }
	pid=$(<"$STATE/$name.pid")
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		alive "$name" || break
		sleep 0.1
	done
	if alive "$name"; then
		cw_log "$name (pid $pid) ignored SIGTERM for 5 s; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.2
	fi
	rm -f "$STATE/$name.pid"
}

stop_all() {
	local i
	for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_one "${COMPONENTS[i]}"; done
	# Started by an `up` with CW_SCHEDULER=1, stopped by a `down` without it.
	stop_one kube-scheduler
}

# fail NAME MSG: shows the tail of NAME's log, stops what was started, keeps the state dir.
fail() {
	local name=$1
	shift
	printf 'error: %s\n' "$*" >&2
	if [[ -f $STATE/$name.log ]]; then
		printf -- '--- last 30 lines of %s ---\n' "$STATE/$name.log" >&2
		tail -n 30 "$STATE/$name.log" >&2
		printf -- '---\n' >&2
	fi
	stop_all
	printf 'state dir kept for inspection: %s (remove with: CW_STATE_DIR=%s %s down)\n' "$STATE" "$STATE" "$0" >&2
	exit 1
}

# wait_for NAME SECONDS CMD...: polls CMD every 0.2 s until it succeeds; fails if NAME dies.
wait_for() {
	local name=$1 timeout=$2 deadline
	shift 2
	deadline=$((SECONDS + timeout))
	until "$@" >/dev/null 2>&1; do
		alive "$name" || fail "$name" "$name exited during start-up"
		((SECONDS < deadline)) || fail "$name" "$name not ready after ${timeout}s"
		sleep 0.2
	done
}

write_kubeconfig() { # FILE SERVER CA TOKEN USER
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: config-watcher-e2e
  cluster:
    server: $2
    certificate-authority: $3
users:
- name: $5
  user:
    token: $4
contexts:
- name: config-watcher-e2e
  context:
    cluster: config-watcher-e2e
    user: $5
    namespace: default
current-context: config-watcher-e2e
EOF
	chmod 600 "$1"
}

cmd_up() {
	for c in "${COMPONENTS[@]}"; do
		if [[ -d $STATE ]] && alive "$c"; then
			cw_die "a cluster already runs from $STATE ($c is up); use it (eval \"\$($0 env)\"), stop it ($0 down), or set CW_STATE_DIR for a second one"
		fi
	done
	"$hack_dir/build-controlplane.sh"
	local kubectl
	kubectl=$(cw_kubectl) || cw_die "no kubectl on PATH and none built in $CW_BIN_DIR"
	command -v openssl >/dev/null || cw_die "openssl not found"
	command -v curl >/dev/null || cw_die "curl not found"

	rm -rf "$STATE"
	mkdir -p "$STATE/certs" "$STATE/etcd"
	chmod 700 "$STATE"
	local start_time=$SECONDS

	local ports
	mapfile -t ports < <(free_ports 3)
	local etcd_port=${CW_ETCD_PORT:-${ports[0]}} peer_port=${CW_ETCD_PEER_PORT:-${ports[1]}}
	local api_port=${CW_APISERVER_PORT:-${ports[2]}}
	# The proxy starts last, a minute after the ports were picked, by which time another
	# process may have taken its port: unless one is set, it picks a free one as it binds.
	local proxy_port=${CW_PROXY_PORT:-0}
	local etcd_url="http://127.0.0.1:$etcd_port" api_url="https://127.0.0.1:$api_port"

	# Credentials: one token for us, another for the controller manager, so the audit
	# log tells their requests apart; an RSA key pair to sign ServiceAccount tokens.
	local admin_token kcm_token sched_token
	admin_token=$(openssl rand -hex 24)
	kcm_token=$(openssl rand -hex 24)
	sched_token=$(openssl rand -hex 24)
	printf '%s,admin,admin,system:masters\n%s,system:kube-controller-manager,kube-controller-manager,system:masters\n%s,system:kube-scheduler,kube-scheduler,system:masters\n' \
		"$admin_token" "$kcm_token" "$sched_token" >"$STATE/tokens.csv"
	openssl genrsa -out "$STATE/sa.key" 2048 2>/dev/null
	openssl rsa -in "$STATE/sa.key" -pubout -out "$STATE/sa.pub" 2>/dev/null
	chmod 600 "$STATE/tokens.csv" "$STATE/sa.key"

	# Metadata level records user, verb, object and response code (with µs timestamps)
	# without bodies: enough to count deletions and see refusals. Everything a
	# ServiceAccount does is logged too, so a 403 on a list or watch shows up. Secrets
	# stay at Metadata like everything else: any level above it would write their data
	# into the log.
	cat >"$STATE/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["delete", "deletecollection", "create", "patch", "update"]
  resources:
  - group: ""
    resources: ["pods", "pods/eviction", "configmaps", "secrets", "events"]
  - group: "apps"
    resources: ["deployments"]
  - group: "coordination.k8s.io"
    resources: ["leases"]
  - group: "events.k8s.io"
    resources: ["events"]
- level: Metadata
  verbs: ["get"]
  resources:
  - group: "apps"
    resources: ["replicasets/scale", "statefulsets/scale"]
  - group: ""
    resources: ["replicationcontrollers/scale"]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
  omitStages: ["RequestReceived", "ResponseStarted"]
- level: None
EOF

	cw_log "starting etcd v$CW_ETCD_VERSION on $etcd_url"
	start etcd "$CW_BIN_DIR/etcd" --name=cw --data-dir="$STATE/etcd" \
		--listen-client-urls="$etcd_url" --advertise-client-urls="$etcd_url" \
		--listen-peer-urls="http://127.0.0.1:$peer_port" \
		--initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
		--initial-cluster="cw=http://127.0.0.1:$peer_port" \
		--unsafe-no-fsync --log-level=warn
	wait_for etcd 30 curl -fsS "$etcd_url/health"

	cw_log "starting kube-apiserver v$CW_KUBE_VERSION on $api_url (watch cache: ${CW_WATCH_CACHE:-true})"
	# shellcheck disable=SC2086 # CW_APISERVER_ARGS is a list of flags
	start kube-apiserver "$CW_BIN_DIR/kube-apiserver" \
		--etcd-servers="$etcd_url" \
		--secure-port="$api_port" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
		--endpoint-reconciler-type=none --service-cluster-ip-range=10.0.0.0/24 \
		--token-auth-file="$STATE/tokens.csv" --authorization-mode=RBAC \
		--service-account-issuer=https://kubernetes.default.svc \
		--service-account-key-file="$STATE/sa.pub" \
		--service-account-signing-key-file="$STATE/sa.key" \
		--cert-dir="$STATE/certs" \
		--audit-log-path="$STATE/audit.log" --audit-policy-file="$STATE/audit-policy.yaml" \
		--watch-cache="${CW_WATCH_CACHE:-true}" \
		--profiling=false ${CW_APISERVER_ARGS:-}
	wait_for kube-apiserver 90 curl -fsS --cacert "$STATE/certs/apiserver.crt" \
		-H "Authorization: Bearer $admin_token" "$api_url/readyz"

	write_kubeconfig "$STATE/admin.kubeconfig" "$api_url" "$STATE/certs/apiserver.crt" "$admin_token" admin
	write_kubeconfig "$STATE/kcm.kubeconfig" "$api_url" "$STATE/certs/apiserver.crt" "$kcm_token" kube-controller-manager
	write_kubeconfig "$STATE/scheduler.kubeconfig" "$api_url" "$STATE/certs/apiserver.crt" "$sched_token" kube-scheduler

	cw_log "starting kube-controller-manager v$CW_KUBE_VERSION"
	start kube-controller-manager "$CW_BIN_DIR/kube-controller-manager" \
		--kubeconfig="$STATE/kcm.kubeconfig" --leader-elect=false --secure-port=0 \
		--controllers=deployment,replicaset,statefulset,replicationcontroller,serviceaccount,serviceaccount-token,garbagecollector,namespace,disruption${CW_KCM_EXTRA_CONTROLLERS:+,$CW_KCM_EXTRA_CONTROLLERS} \
		--service-account-private-key-file="$STATE/sa.key" \
		--root-ca-file="$STATE/certs/apiserver.crt" \
		--use-service-account-credentials=false
	# Pods are refused until their namespace has a default ServiceAccount.
	wait_for kube-controller-manager 60 \
		"$kubectl" --kubeconfig="$STATE/admin.kubeconfig" get serviceaccount default -n default

	if [[ ${CW_SCHEDULER:-} == 1 ]]; then
		cw_log "starting kube-scheduler v$CW_KUBE_VERSION"
		# --secure-port=0: no health or metrics port. Leader election, alone, takes the
		# Lease at once: holding it says the scheduler reached the apiserver and schedules.
		start kube-scheduler "$CW_BIN_DIR/kube-scheduler" \
			--kubeconfig="$STATE/scheduler.kubeconfig" --secure-port=0 --leader-elect=true
		wait_for kube-scheduler 60 bash -c "[[ -n \$('$kubectl' --kubeconfig='$STATE/admin.kubeconfig' get lease kube-scheduler -n kube-system -o jsonpath='{.spec.holderIdentity}') ]]"
	fi

	cw_log "starting kubectl proxy (the ambassador)"
	start kubectl-proxy "$kubectl" --kubeconfig="$STATE/admin.kubeconfig" proxy \
		--address=127.0.0.1 --port="$proxy_port" --accept-hosts='^(localhost|127\.0\.0\.1)$'
	# It says where it serves: "Starting to serve on 127.0.0.1:PORT".
	wait_for kubectl-proxy 30 grep -q 'Starting to serve on' "$STATE/kubectl-proxy.log"
	local proxy_url
	proxy_url="http://$(sed -n 's/^Starting to serve on //p' "$STATE/kubectl-proxy.log" | head -n 1)"
	wait_for kubectl-proxy 30 curl -fsS "$proxy_url/version"
	cw_log "kubectl proxy serves on $proxy_url"

	cat >"$STATE/env" <<EOF
export KUBECONFIG=$STATE/admin.kubeconfig CW_PROXY_URL=$proxy_url CW_AUDIT_LOG=$STATE/audit.log CW_STATE_DIR=$STATE CW_APISERVER_URL=$api_url CW_ETCD_URL=$etcd_url CW_KUBECTL=$kubectl
EOF
	cw_log "control plane up in $(cw_elapsed $((SECONDS - start_time))); state in $STATE"
	cw_log "use it with: eval \"\$(CW_STATE_DIR=$STATE $0 env)\""
}

cmd_env() {
	[[ -f $STATE/env ]] || cw_die "no cluster in $STATE (start one with: $0 up)"
	cat "$STATE/env"
}

cmd_status() {
	local rc=0 c
	[[ -d $STATE ]] || { echo "no cluster in $STATE"; return 1; }
	for c in "${COMPONENTS[@]}"; do
		if alive "$c"; then
			printf '%-24s running (pid %s)\n' "$c" "$(<"$STATE/$c.pid")"
		else
			printf '%-24s stopped\n' "$c"
			rc=1
		fi
	done
	[[ -f $STATE/env ]] && sed 's/^export //; s/ /\n/g' "$STATE/env" | sed 's/^/  /'
	return $rc
}

cmd_down() {
	[[ -d $STATE ]] || { cw_log "no cluster in $STATE"; return 0; }
	cw_log "stopping control plane in $STATE"
	stop_all
	if [[ ${1:-} == --keep || ${CW_KEEP_STATE:-} == 1 ]]; then
		cw_log "kept $STATE"
	else
		rm -rf "$STATE"
	fi
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down "${2:-}" ;;
env) cmd_env ;;
status) cmd_status ;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
