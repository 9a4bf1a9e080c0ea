# shellcheck shell=bash
# Shared settings for the hack/ scripts. Source it; do not run it.
#
#   CW_CACHE_DIR      where built control-plane binaries are kept
#                     (default ${XDG_CACHE_HOME:-$HOME/.cache}/config-watcher)
#   CW_ETCD_VERSION   etcd version to build (default 3.6.6)
#   CW_KUBE_VERSION   kube-apiserver / kube-controller-manager / kubectl version (default 1.37.2)
#   CW_SYSTEM_KUBECTL 1: use the kubectl on PATH instead of building one

CW_ETCD_VERSION="${CW_ETCD_VERSION:-3.6.6}"
CW_KUBE_VERSION="${CW_KUBE_VERSION:-1.37.2}"
CW_CACHE_DIR="${CW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/config-watcher}"
CW_CP_DIR="$CW_CACHE_DIR/controlplane/v${CW_ETCD_VERSION}-v${CW_KUBE_VERSION}"
CW_BIN_DIR="$CW_CP_DIR/bin"

# Go lives at /usr/local/go on our machines; CI's environment may not have it on PATH.
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	PATH="/usr/local/go/bin:$PATH"
fi

CW_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

cw_log() { printf '==> %s\n' "$*" >&2; }
cw_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# cw_kubectl prints the kubectl to use: the one built with the control plane (its
# version matches the apiserver's, as the ambassador's image does in manifests/), else
# the one on PATH.
# CW_SYSTEM_KUBECTL=1 prefers the one on PATH.
cw_kubectl() {
	if [[ ${CW_SYSTEM_KUBECTL:-} == 1 ]] && command -v kubectl >/dev/null 2>&1; then
		command -v kubectl
	elif [[ -x "$CW_BIN_DIR/kubectl" ]]; then
		echo "$CW_BIN_DIR/kubectl"
	elif command -v kubectl >/dev/null 2>&1; then
		command -v kubectl
	else
		return 1
	fi
}

# cw_elapsed SECONDS prints a duration as "3m07s".
cw_elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# cw_free_port prints a TCP port on 127.0.0.1 that nothing listens on now.
cw_free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# cw_cluster_down RC WHAT stops the control plane of $CW_STATE_DIR (for the EXIT trap of
# a script that started it). When RC is not 0 the state dir (component logs, audit log
# and whatever WHAT wrote there) is kept for a look, and its path printed.
cw_cluster_down() {
	if (($1 == 0)); then
		"$CW_HACK_DIR/cluster.sh" down || true
	else
		"$CW_HACK_DIR/cluster.sh" down --keep || true
		cw_log "$2 failed (exit $1); its logs and the audit log are kept in $CW_STATE_DIR"
	fi
}
