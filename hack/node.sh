#!/usr/bin/env bash
# A real node for the e2e tests and the demo: the local control plane (hack/cluster.sh,
# with kube-scheduler), containerd, runc, a kubelet and its pods, all inside a network
# namespace and a mount namespace this script creates, so that nothing they send can
# leave the machine and nothing they mount or set outlives them. Then CMD runs inside the
# same namespaces, with the cluster's environment; everything is torn down when it ends,
# on failure too.
#
# Usage: hack/node.sh run CMD [ARG...]      (make e2e-node, make demo-node)
#        hack/node.sh clear-stale           (what a killed run left; root)
#
# Inside the namespace:
#   lo          127.0.0.1, and 10.0.0.1: the `kubernetes` Service's ClusterIP (first
#               address of hack/cluster.sh's --service-cluster-ip-range=10.0.0.0/24).
#               There is no kube-proxy: the apiserver listens on 0.0.0.0:443 itself, so a
#               pod's in-cluster config (KUBERNETES_SERVICE_HOST=10.0.0.1, port 443) reaches it.
#   cw0         an empty bridge (no ports; these kernels have no dummy driver) holding the
#               node IP 192.0.2.10 (TEST-NET-1, never routed; the kubelet refuses a loopback
#               node IP). The default route points into it: a packet for anywhere else is
#               dropped there.
#   cw-br0      the CNI bridge, pods on 10.88.0.0/24. Pods cannot share the node's network
#               (hostNetwork): the Deployments run two replicas on one node, and both would
#               bind 127.0.0.1:8001 and :8080.
#
# The kubelet rewrites vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
# kernel.panic_on_oops and kernel.keys.root_max* when they differ from what it wants:
# inside the mount namespace, files holding those values are bind-mounted over the
# /proc/sys entries, so it reads what it wants and writes nothing. /var/log,
# /var/lib/cni, /var/lib/kubelet and /run/containerd (fixed paths of the kubelet, CNI,
# the runc shim and runc, whatever the configuration says) are state-dir directories
# there; nothing is created on the machine for them.
#
# Cgroups: the kubelet's cgroupRoot is /cw-node-<pid> in every hierarchy. Every process
# this script starts runs inside it (the pids hierarchy keeps track of them, shims and
# containers included); teardown kills what is left there by PID and removes the
# directories. Then it checks that sysctls, mounts, cgroups and the paths the node could
# write are as they were before this run, and fails if not. A run killed before its
# teardown (SIGKILL, a CI timeout) leaves its cgroups and processes behind: the next run
# refuses to start until `hack/node.sh clear-stale` has removed them.
#
# Images: containerd holds what a user's node would pull, imported, never pulled (there is
# no registry to reach): the release's index from $CW_RELEASE_DIST/config-watcher.ctr.tar
# (all platforms, named by tag and digest: install.yaml names it by digest), and the
# ambassador, pause and demo images from bin/images (make image-e2e).
#
# Environment for CMD: what `hack/cluster.sh env` prints (KUBECONFIG, CW_PROXY_URL,
# CW_AUDIT_LOG, CW_KUBECTL, …), plus
#   CW_RELEASE_DIST  the release CMD installs (make release-e2e: bin/release-e2e)
#   CW_NODE_NAME   the Node's name (cw-node)
#   CW_CTR         ctr with its flags: `$CW_CTR tasks ls` lists the containers
#   CW_NODE_STATE  the state dir (logs of containerd and the kubelet)
#   GOPROXY=off    no module download can hang on the dropped default route
#
# Settings: CW_NODE_KEEP_STATE=1 keeps the state dir (it is kept on failure anyway);
# CW_CACHE_DIR and the versions as in hack/lib.sh and hack/node-lib.sh.
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$hack_dir")"
# shellcheck source=hack/node-lib.sh
source "$hack_dir/node-lib.sh"

NODE_NAME=cw-node
RELEASE_DIST="${CW_RELEASE_DIST:-$repo/bin/release-e2e}"
NODE_IP=192.0.2.10
SERVICE_IP=10.0.0.1
POD_CIDR=10.88.0.0/24
SANDBOX_IMAGE=registry.k8s.io/pause:3.10.2
# What the kubelet sets at start (pkg/kubelet/cm: setupKernelTunables).
KERNEL_TUNABLES=(vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1
	kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)
# Fixed paths the node's programs would create on the machine if nothing redirected them.
FIXED_PATHS=(/var/lib/kubelet /var/lib/containerd /run/containerd /opt/containerd /var/lib/cni
	/etc/cni /opt/cni /var/log/containers /var/log/pods /run/netns /etc/kubernetes)

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

# --- outside: namespaces, cgroups, teardown and the check that the machine is as before ---

# live_run PID: whether PID is a `node.sh run` now (this one, or another one beside it).
live_run() {
	local c
	c=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
	[[ $c == *"node.sh run "* ]]
}

snapshot() { # prints what must be the same before and after
	local kv k d
	for kv in "${KERNEL_TUNABLES[@]}"; do
		k=${kv%%=*}
		printf 'sysctl %s=%s\n' "$k" "$(<"/proc/sys/$k")"
	done
	awk '{print "mount " $5 " " $9}' /proc/self/mountinfo | sort
	# Ours, and what a kubelet, containerd or runc make when a cgroup parent is not passed.
	# A node run beside this one comes and goes with its own cgroups: not a change of ours.
	for d in /sys/fs/cgroup/*/*/; do
		d=${d%/} k=${d##*/}
		case $k in
		cw-node-*) [[ $k == "$ID" ]] || ! live_run "${k#cw-node-}" || continue ;;
		kubepods* | k8s.io | kubelet* | containerd* | runtime*) ;;
		*) continue ;;
		esac
		echo "cgroup $d"
	done | sort
	# What the node's programs write when not redirected: their fixed paths with all they
	# hold, and the names beside them, so that a path nobody listed shows up too. Mtimes
	# and sizes below the parents would change with the machine's own work.
	local fixed=() parents=()
	for d in "${FIXED_PATHS[@]}"; do [[ -e $d || -L $d ]] && fixed+=("$d"); done
	((${#fixed[@]})) && find "${fixed[@]}" -printf 'path %y %m %s %T@ %p\n' 2>/dev/null | sort
	mapfile -t parents < <(printf '%s\n' "${FIXED_PATHS[@]%/*}" | sort -u)
	find "${parents[@]}" -mindepth 1 -maxdepth 1 -printf 'entry %y %p\n' 2>/dev/null | sort
	true
}

# cgroup_pids ID prints every PID in cgroup ID's subtree of the pids hierarchy.
cgroup_pids() {
	[[ -d /sys/fs/cgroup/pids/$1 ]] || return 0
	find "/sys/fs/cgroup/pids/$1" -name cgroup.procs -exec cat {} + 2>/dev/null
}

# remove_cgroup ID kills every process left in cgroup ID by PID, then removes ID in every
# hierarchy. Only PIDs read from the cgroup are killed: nothing of the machine's is in it.
remove_cgroup() {
	local id=$1 i pids h
	for ((i = 0; i < 100; i++)); do
		mapfile -t pids < <(cgroup_pids "$id")
		((${#pids[@]})) || break
		((i == 0)) && cw_log "killing ${#pids[@]} leftover process(es) of $id by PID"
		kill -KILL "${pids[@]}" 2>/dev/null || true
		sleep 0.1
	done
	for h in /sys/fs/cgroup/*/; do
		[[ -d $h$id ]] && { find "$h$id" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
	done
	return 0
}

# What a run killed before its teardown leaves: its cgroups (with its containerd, kubelet,
# control plane, shims and containers, which outlive it and keep its namespaces alive),
# and, should anything have escaped those, processes of the node's programs naming a
# state dir, and mounts of a state dir in the machine's namespace.
stale_cgroups() {
	local d k
	for d in /sys/fs/cgroup/*/cw-node-*/; do
		[[ -d $d ]] || continue
		d=${d%/} k=${d##*/}
		live_run "${k#cw-node-}" || echo "$k"
	done | sort -u
}
stale_pids() {
	local p
	for p in /proc/[0-9]*; do
		case $(readlink "$p/exe" 2>/dev/null) in
		*/containerd | */containerd-shim-runc-v2 | */kubelet | */etcd | */kube-apiserver | */kube-controller-manager | */kube-scheduler | */kubectl) ;;
		*) continue ;;
		esac
		tr '\0' '\n' 2>/dev/null <"$p/cmdline" | grep -q '/config-watcher-node\.' || continue
		grep -q '^[0-9]*:pids:/cw-node-' "$p/cgroup" 2>/dev/null && continue # counted with its cgroup
		echo "${p#/proc/}"
	done
}
stale_mounts() {
	awk '$4 ~ /\/config-watcher-node\./ || $5 ~ /\/config-watcher-node\./ {print $5}' /proc/self/mountinfo
}

# refuse_stale exits with what an earlier run left and how to clear it: taken as "before",
# it would make the check blind to it, and its node would still be running.
refuse_stale() {
	local cgroups pids mounts all c dirs
	mapfile -t cgroups < <(stale_cgroups)
	mapfile -t pids < <(stale_pids)
	mapfile -t mounts < <(stale_mounts)
	((${#cgroups[@]} + ${#pids[@]} + ${#mounts[@]})) || return 0
	all=("${pids[@]}")
	for c in "${cgroups[@]}"; do mapfile -t -O "${#all[@]}" all < <(cgroup_pids "$c"); done
	dirs=$(for c in "${all[@]}"; do tr '\0' '\n' 2>/dev/null <"/proc/$c/cmdline" || true; done |
		grep -o '/[^=]*/config-watcher-node\.[^/]*' | sort -u | paste -sd ' ' - || true)
	{
		echo "error: an earlier node run was killed before its teardown and left:"
		for c in "${cgroups[@]}"; do
			echo "  cgroup $c in $(find /sys/fs/cgroup/*/ -maxdepth 1 -name "$c" | wc -l) hierarchies, $(cgroup_pids "$c" | wc -l) process(es) in it"
		done
		for c in "${pids[@]}"; do echo "  process $c: $(tr '\0' ' ' 2>/dev/null <"/proc/$c/cmdline" | cut -c1-150)"; done
		for c in "${mounts[@]}"; do echo "  mount $c"; done
		echo "Clear it (kills those processes by PID, removes those cgroups and mounts, nothing else):"
		echo "  sudo bash $hack_dir/node.sh clear-stale"
		echo "Its logs stay in ${dirs:-${TMPDIR:-/tmp}/config-watcher-node.*}: remove them once read."
	} >&2
	exit 1
}

cmd_clear_stale() {
	((EUID == 0)) || cw_die "hack/node.sh clear-stale needs root"
	local c pids mounts
	for c in $(stale_cgroups); do remove_cgroup "$c"; done
	mapfile -t pids < <(stale_pids)
	if ((${#pids[@]})); then
		cw_log "kill -KILL ${pids[*]}"
		kill -KILL "${pids[@]}" 2>/dev/null || true
	fi
	mapfile -t mounts < <(stale_mounts | tac) # the innermost first
	for c in "${mounts[@]}"; do
		cw_log "umount -l -n $c"
		umount -l -n "$c" || true # -n: no /run/mount/utab
	done
	refuse_stale
	cw_log "nothing stale left"
}

outer_cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	# Whatever the inner teardown left (it stops the kubelet, containerd and the control
	# plane gracefully): container processes, shims.
	remove_cgroup "$ID"

	local after
	after=$(snapshot)
	if [[ $after != "$before" ]]; then
		cw_log "the machine is NOT as before the node ran:"
		diff <(echo "$before") <(echo "$after") >&2 || true
		((rc == 0)) && rc=1
	else
		cw_log "machine as before: sysctls, mounts, cgroups and the paths the node could write unchanged"
	fi
	if ((rc != 0)) || [[ ${CW_NODE_KEEP_STATE:-} == 1 ]]; then
		rm -rf "$STATE/containerd/root" 2>/dev/null || true # images and snapshots: large, rebuilt each run
		cw_log "logs kept in $STATE"
	else
		rm -rf "$STATE"
	fi
	exit "$rc"
}

cmd_run() {
	(($# > 0)) || usage
	((EUID == 0)) || cw_die "hack/node.sh needs root (namespaces, cgroups, containerd)"
	local t
	for t in ip unshare runc flock; do command -v "$t" >/dev/null || cw_die "$t not found (Debian: iproute2, util-linux, runc)"; done
	[[ -d /sys/fs/cgroup/pids ]] || cw_die "no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids: hack/node.sh knows cgroup v1 (hybrid) machines only"
	refuse_stale

	"$hack_dir/build-controlplane.sh"
	"$hack_dir/node-build.sh"
	local img
	for img in kubectl pause http-echo; do
		[[ -f $repo/bin/images/$img.tar ]] || { "$hack_dir/image/build.sh" --e2e; break; }
	done
	[[ -f $RELEASE_DIST/install.yaml && -f $RELEASE_DIST/config-watcher.ctr.tar ]] ||
		cw_die "no release in $RELEASE_DIST: make release-e2e (or set CW_RELEASE_DIST to a make release's dist/)"
	RELEASE_DIST=$(cd "$RELEASE_DIST" && pwd)
	export CW_RELEASE_DIST=$RELEASE_DIST

	ID="cw-node-$$"
	STATE=$(mktemp -d "${TMPDIR:-/tmp}/config-watcher-node.XXXXXX")
	chmod 755 "$STATE" # containers run as 65532 and read their volumes under it
	export ID STATE
	before=$(snapshot)
	trap outer_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	local h
	for h in /sys/fs/cgroup/*/; do
		[[ -f ${h}cgroup.procs ]] || continue
		mkdir -p "$h$ID"
		# A cpuset cgroup starts without CPUs or memory nodes; give it its parent's.
		if [[ -f ${h}cpuset.cpus ]]; then
			cat "${h}cpuset.cpus" >"$h$ID/cpuset.cpus"
			cat "${h}cpuset.mems" >"$h$ID/cpuset.mems"
		fi
	done
	mkdir -p "/sys/fs/cgroup/pids/$ID/node"

	cw_log "starting a node in new network and mount namespaces (state: $STATE)"
	local rc=0
	# The subshell joins the node's cgroup, so every descendant is counted there. It runs
	# in the background so that a signal reaches this script's trap at once (bash runs
	# traps only between commands): on SIGINT or SIGTERM the node is not drained, its
	# processes are killed by PID and everything else is removed as after a normal run.
	(
		echo "$BASHPID" >"/sys/fs/cgroup/pids/$ID/node/cgroup.procs"
		exec unshare --net --mount --propagation private --fork --kill-child -- "$hack_dir/node.sh" __inner "$@"
	) &
	wait "$!" || rc=$?
	exit "$rc"
}

# --- inside the namespaces -------------------------------------------------------------------

inner_pids=()

start_bg() { # NAME CMD...: starts CMD in the background, logging to $STATE/NAME.log
	local name=$1
	shift
	"$@" >"$STATE/$name.log" 2>&1 </dev/null &
	inner_pids+=("$!")
	echo "$!" >"$STATE/$name.pid"
}

stop_pid() { # PID: SIGTERM, then SIGKILL after 10 s
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

inner_teardown() {
	local rc=$?
	trap - EXIT
	set +e
	# Pods first, while the kubelet still runs, so that their containers stop the way
	# the kubelet stops them; the outer teardown kills by PID whatever is left.
	if [[ -n ${KUBECONFIG:-} ]]; then
		timeout 90 "$CW_KUBECTL" delete deployments,replicasets,pods --all --all-namespaces --wait=true --timeout=80s >/dev/null 2>&1
	fi
	[[ -f $STATE/kubelet.pid ]] && stop_pid "$(<"$STATE/kubelet.pid")"
	[[ -f $STATE/containerd.pid ]] && stop_pid "$(<"$STATE/containerd.pid")"
	CW_STATE_DIR="$STATE/cluster" "$hack_dir/cluster.sh" down $( ((rc != 0)) && echo --keep) >/dev/null 2>&1
	exit "$rc"
}

# wait_until NAME SECONDS CMD...: polls CMD until it succeeds; fails with NAME's log tail.
wait_until() {
	local name=$1 timeout=$2 deadline
	shift 2
	deadline=$((SECONDS + timeout))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)) || ! kill -0 "$(<"$STATE/$name.pid")" 2>/dev/null; then
			printf -- '--- last 40 lines of %s ---\n' "$STATE/$name.log" >&2
			tail -n 40 "$STATE/$name.log" >&2
			cw_die "$name not ready after ${timeout}s (or exited)"
		fi
		sleep 0.5
	done
}

setup_network() {
	ip link set lo up
	ip addr add "$SERVICE_IP/32" dev lo
	ip link add cw0 type bridge
	ip addr add "$NODE_IP/24" dev cw0
	ip link set cw0 up
	ip route add default dev cw0
	# Check, do not assume: a destination off the machine must route into cw0, and the
	# namespace must hold no other interface that could lead out.
	local via
	via=$(ip -o route get 198.51.100.1) || cw_die "no route at all in the node's namespace"
	[[ $via == *" dev cw0 "* ]] || cw_die "the node's namespace routes off-machine traffic elsewhere: $via"
	[[ $(ip -o link show | awk -F': ' '{print $2}' | sort | tr '\n' ' ') == "cw0 lo " ]] ||
		cw_die "unexpected interfaces in the node's namespace: $(ip -o link show)"
}

setup_mounts() {
	local kv k v
	# mount(8), ours and the kubelet's, records mounts in /run/mount/utab, and makes
	# /run/mount on the machine for it where there is none.
	export LIBMOUNT_UTAB="$STATE/mount-utab"
	mkdir -p "$STATE/sysctl"
	for kv in "${KERNEL_TUNABLES[@]}"; do
		k=${kv%%=*} v=${kv#*=}
		[[ $(<"/proc/sys/$k") == "$v" ]] && continue
		echo "$v" >"$STATE/sysctl/${k//\//.}"
		mount --bind "$STATE/sysctl/${k//\//.}" "/proc/sys/$k"
	done
	mkdir -p "$STATE/var-log" "$STATE/var-lib-cni" "$STATE/var-lib-kubelet" "$STATE/containerd/run"
	mount --bind "$STATE/var-log" /var/log
	# The device plugin manager's socket is in /var/lib/kubelet whatever --root-dir says;
	# CNI caches its results in /var/lib/cni.
	shadow /var/lib cni="$STATE/var-lib-cni" kubelet="$STATE/var-lib-kubelet"
	# The runc shim's sockets (/run/containerd/s) and runc's root (/run/containerd/runc)
	# follow containerd's default state dir, not the configured one. Where a system
	# containerd runs, that directory is its own.
	shadow /run containerd="$STATE/containerd/run"
}

# shadow DIR NAME=SRC...: in this mount namespace, DIR becomes a tmpfs holding the machine's
# entries of DIR (bind mounts, symlinks copied) and SRC as DIR/NAME, in place of the
# machine's NAME if it has one. A bind mount straight onto DIR/NAME would need a mount
# point, made on the machine when it has none; the tmpfs holds that mount point instead,
# and goes with the namespace. The machine's entries stay visible because the node reads
# some of them: /etc/resolv.conf may point into /run/systemd, flock takes /run/lock.
shadow() {
	local dir=$1 kv e name
	shift
	local stage="$STATE/shadow${dir//\//-}"
	local -A ours=()
	for kv; do ours[${kv%%=*}]=${kv#*=}; done
	mkdir "$stage"
	mount -t tmpfs -o "mode=$(stat -c %a "$dir")" cw-node "$stage"
	for e in "$dir"/* "$dir"/.*; do
		name=${e##*/}
		[[ $name == . || $name == .. || -n ${ours[$name]:-} ]] && continue
		if [[ -L $e ]]; then
			cp -P "$e" "$stage/"
		elif [[ -d $e ]]; then
			mkdir "$stage/$name"
			mount --rbind "$e" "$stage/$name"
		elif [[ -e $e ]]; then
			touch "$stage/$name"
			mount --bind "$e" "$stage/$name"
		fi
	done
	for name in "${!ours[@]}"; do
		mkdir "$stage/$name"
		mount --bind "${ours[$name]}" "$stage/$name"
	done
	mount --move "$stage" "$dir"
}

write_configs() {
	local sock="$STATE/containerd/containerd.sock"
	mkdir -p "$STATE/containerd" "$STATE/cni/net.d" "$STATE/kubelet" "$STATE/pod-logs"
	cat >"$STATE/containerd/config.toml" <<EOF
version = 4
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
imports = []
# Nothing but the CRI, overlayfs and runc; none of them at their default paths under
# /opt, /etc or /run.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri",
  "io.containerd.image-verifier.v1.bindir"]

[plugins.'io.containerd.server.v1.grpc']
  address = "$sock"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "$sock.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$SANDBOX_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: without it runc fails with "can't get final child's PID
  # from pipe" when a container's oom_score_adj is lower than containerd's.
  restrict_oom_score_adj = true
  # Pod network namespaces under the state dir, not /run/netns.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CW_NODE_BIN_DIR/cni"]
    conf_dir = "$STATE/cni/net.d"
EOF
	cat >"$STATE/cni/net.d/10-cw-pods.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cw-pods",
  "plugins": [{
    "type": "bridge",
    "bridge": "cw-br0",
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": "$POD_CIDR"}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": "$STATE/cni/ipam"
    }
  }]
}
EOF
	cat >"$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 (hybrid) machine, no systemd managing cgroups.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$ID
containerRuntimeEndpoint: unix://$sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# The apiserver has no client certificate for the kubelet to check: no webhook
# authentication or authorization; the port is reachable only inside the namespace.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
podLogsDir: $STATE/pod-logs
failSwapOn: false
resolvConf: ""
# The images are imported, never pulled: keep them, and do not evict on a full disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
registerNode: true
EOF
}

kubeconfig() { # FILE TOKEN USER
	mkdir -p "$(dirname "$1")"
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cw
  cluster:
    server: https://127.0.0.1:443
    certificate-authority: $STATE/cluster/certs/apiserver.crt
users:
- name: $3
  user:
    token: $2
contexts:
- name: cw
  context: {cluster: cw, user: $3}
current-context: cw
EOF
	chmod 600 "$1"
}

cmd_inner() {
	trap inner_teardown EXIT
	setup_network
	setup_mounts
	# Temporary files of the node's programs and of CMD go with the state dir, including
	# what a killed run leaves.
	mkdir -p "$STATE/tmp"
	export TMPDIR="$STATE/tmp"

	# The apiserver reaches the kubelet (logs, exec) at the node IP: by default it would
	# try the node's hostname first, a DNS lookup that goes nowhere in here.
	export CW_STATE_DIR="$STATE/cluster" CW_APISERVER_PORT=443
	export CW_APISERVER_ARGS="--bind-address=0.0.0.0 --kubelet-preferred-address-types=InternalIP ${CW_APISERVER_ARGS:-}"
	# Pods go to the node as a user's do, placed by kube-scheduler. The apiserver taints a
	# new Node not-ready (NoSchedule); the node lifecycle controller lifts it once the
	# kubelet reports Ready. The endpointslice controller keeps each Service's
	# EndpointSlices, which say which pods take traffic (what kube-proxy would follow).
	export CW_SCHEDULER=1
	export CW_KCM_EXTRA_CONTROLLERS=root-ca-cert-publisher,nodelifecycle,endpointslice${CW_KCM_EXTRA_CONTROLLERS:+,$CW_KCM_EXTRA_CONTROLLERS}
	"$hack_dir/cluster.sh" up
	eval "$("$hack_dir/cluster.sh" env)"

	# The kubelet's identity: a ServiceAccount, so that the audit log tells its requests
	# from the tests' (admin) and the controller's. The Node authorizer is not enabled.
	"$CW_KUBECTL" create serviceaccount cw-kubelet -n kube-system >/dev/null
	"$CW_KUBECTL" create clusterrolebinding cw-kubelet --clusterrole=cluster-admin --serviceaccount=kube-system:cw-kubelet >/dev/null
	kubeconfig "$STATE/kubelet/kubeconfig" "$("$CW_KUBECTL" create token cw-kubelet -n kube-system --duration=24h)" cw-kubelet

	write_configs
	local ctr=("$CW_NODE_BIN_DIR/ctr" --address "$STATE/containerd/containerd.sock" -n k8s.io)
	cw_log "starting containerd v$CW_CONTAINERD_VERSION"
	PATH="$CW_NODE_BIN_DIR:$PATH" start_bg containerd "$CW_NODE_BIN_DIR/containerd" --config "$STATE/containerd/config.toml"
	wait_until containerd 30 "${ctr[@]}" version

	local tar
	for tar in "$repo"/bin/images/{pause,kubectl,http-echo}.tar "$RELEASE_DIST/config-watcher.ctr.tar"; do
		"${ctr[@]}" images import --all-platforms "$tar" >>"$STATE/import.log" 2>&1 ||
			{ cat "$STATE/import.log" >&2; cw_die "importing $tar failed"; }
	done
	cw_log "imported images: $("${ctr[@]}" images ls -q | grep -v '^sha256:' | tr '\n' ' ')"

	cw_log "starting kubelet v$CW_KUBE_VERSION as node $NODE_NAME ($NODE_IP)"
	start_bg kubelet "$CW_NODE_BIN_DIR/kubelet" --config="$STATE/kubelet/config.yaml" \
		--kubeconfig="$STATE/kubelet/kubeconfig" --root-dir="$STATE/kubelet/root" \
		--cert-dir="$STATE/kubelet/pki" --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" --v=2
	wait_until kubelet 120 bash -c "[[ \$('$CW_KUBECTL' get node $NODE_NAME -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status} {.spec.taints}') == 'True ' ]]"
	cw_log "node $NODE_NAME is Ready, untainted: pods can be scheduled onto it"

	export CW_NODE_NAME=$NODE_NAME CW_NODE_STATE=$STATE CW_CTR="${ctr[*]}" GOPROXY=off
	cd "$repo"
	local rc=0
	"$@" || rc=$?
	exit "$rc"
}

case "${1:-}" in
run) shift; cmd_run "$@" ;;
clear-stale) cmd_clear_stale ;;
__inner) shift; cmd_inner "$@" ;;
*) usage ;;
esac
