# shellcheck shell=bash
# Shared settings and helpers for the hack/ scripts. Source it; do not run it.
#
#   CW_CACHE_DIR      where built control-plane and node binaries are kept
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

# --- building into the cache (hack/build-controlplane.sh, hack/node-build.sh) -----------
#
# A build script calls cw_build_start with its cache dir (binaries in DIR/bin, logs and
# Go modules in DIR/build), then cw_go_build / cw_build_step for what cw_build_start put
# in need. Every binary is built under a temporary name and renamed into place, so an
# interrupted build never leaves a half binary that would count as cached.

# cw_missing DIR NAME... sets the array need to the NAMEs not executable in DIR/bin.
cw_missing() {
	local dir=$1 n
	shift
	need=()
	for n; do [[ -x "$dir/bin/$n" ]] || need+=("$n"); done
}

# cw_build_start WHAT DIR NAME...: the "already built?" check and the lock. Sets need
# (see cw_missing); when nothing is missing it says "WHAT cached in DIR/bin" and returns
# 1, so a script goes `cw_build_start … || exit 0`. Otherwise it holds DIR/.build.lock
# on fd 9 until the script exits: two builds at once (say, make test and make demo) would
# only fight for the 2 cores, so the second waits for the first and then looks again.
# It also removes, on exit or signal, the temporary files cw_build_tmp names.
cw_build_start() {
	local what=$1 dir=$2
	shift 2
	cw_missing "$dir" "$@"
	if ((${#need[@]} == 0)); then
		cw_log "$what cached in $dir/bin"
		return 1
	fi
	command -v go >/dev/null || cw_die "go not found (expected /usr/local/go/bin/go)"
	mkdir -p "$dir/bin" "$dir/build"
	exec 9>"$dir/.build.lock"
	if ! flock -n 9; then
		cw_log "another build of the $what is running; waiting for it"
		flock 9
		cw_missing "$dir" "$@"
		if ((${#need[@]} == 0)); then
			cw_log "$what cached in $dir/bin"
			return 1
		fi
	fi
	CW_BUILD_DIR=$dir
	CW_BUILD_TMP=()
	trap 'if ((${#CW_BUILD_TMP[@]})); then rm -rf "${CW_BUILD_TMP[@]}"; fi' EXIT
	trap 'exit 143' TERM
	trap 'exit 130' INT
	cw_log "building $what into $dir/bin (missing: ${need[*]}); logs in $dir/build/*.log"
}

# cw_build_tmp PATH: a temporary file or dir of this build, removed when the script exits.
cw_build_tmp() { CW_BUILD_TMP+=("$1"); }

# cw_logged LOG DIR CMD...: runs CMD in DIR with its output in LOG. A cold build fetches
# hundreds of modules from the module proxy, which now and then answers 5xx or times out:
# such a failure is tried again (4 tries in all, 15, 30, then 60 s apart); any other
# failure, and the fourth, returns non-zero at once.
cw_logged() {
	local log=$1 dir=$2 try
	shift 2
	for try in 1 2 3 4; do
		(cd "$dir" && "$@") >"$log" 2>&1 && return 0
		((try < 4)) || return 1
		local why
		why=$(grep -m1 -oE '50[234] [A-Za-z ]+|connection (timeout|reset|refused)|i/o timeout|TLS handshake timeout|unexpected EOF' "$log") || return 1
		cw_log "the module proxy failed ($why); trying again in $((15 << (try - 1))) s"
		sleep $((15 << (try - 1)))
	done
}

# cw_build_step NAME HINT DIR CMD...: runs CMD in DIR with its output in build/NAME.log
# (cw_logged), and on failure shows the log's tail and exits.
cw_build_step() {
	local name=$1 hint=$2 dir=$3 start=$SECONDS log="$CW_BUILD_DIR/build/$1.log"
	shift 3
	cw_log "building $name ($hint)…"
	if ! cw_logged "$log" "$dir" "$@"; then
		tail -n 40 "$log" >&2
		cw_die "building $name failed; full log: $log"
	fi
	cw_log "built $name in $(cw_elapsed $((SECONDS - start)))"
}

# cw_go_build NAME HINT DIR PKG [LDFLAGS]: builds PKG of the module in DIR into bin/NAME.
cw_go_build() {
	local name=$1 hint=$2 dir=$3 pkg=$4 ldflags=${5:-}
	local tmp="$CW_BUILD_DIR/bin/.$name.tmp.$$"
	cw_build_tmp "$tmp"
	cw_build_step "$name" "$hint" "$dir" go build -trimpath -ldflags "-s -w $ldflags" -o "$tmp" "$pkg"
	mv -f "$tmp" "$CW_BUILD_DIR/bin/$name"
}

# cw_contains X LIST...: whether X is one of LIST.
cw_contains() {
	local x
	for x in "${@:2}"; do [[ $x == "$1" ]] && return 0; done
	return 1
}

# cw_kube_module DIR CMD...: makes DIR a Go module that requires k8s.io/kubernetes
# v$CW_KUBE_VERSION and pins (in tools.go) the commands CMD (kubelet, kubectl, …). It is
# resolved again when the version or a command is new: a new command's modules may be
# missing from go.sum.
cw_kube_module() {
	local d=$1 c
	shift
	mkdir -p "$d"
	local fresh=1
	[[ -f "$d/go.sum" ]] && grep -q "k8s.io/kubernetes v${CW_KUBE_VERSION}" "$d/go.mod" 2>/dev/null || fresh=0
	for c; do grep -q "cmd/$c\"" "$d/tools.go" 2>/dev/null || fresh=0; done
	((fresh)) && return 0

	local start=$SECONDS staging_version="v0.${CW_KUBE_VERSION#*.}" # 1.37.2 -> v0.37.2
	local log="$CW_BUILD_DIR/build/kubernetes-mod.log"
	cw_log "resolving k8s.io/kubernetes v$CW_KUBE_VERSION modules for ${*} (~1-2 min)…"
	rm -f "$d/go.mod" "$d/go.sum"
	# kubernetes' go.mod requires its staging modules as v0.0.0 and replaces them with
	# ./staging paths, so it cannot be required as is: point each at its published tag.
	local kube_gomod staging m download="$CW_BUILD_DIR/build/kubernetes-download.json"
	cw_logged "$download" "$d" env GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v${CW_KUBE_VERSION}" ||
		{ tail -n 40 "$download" >&2; cw_die "downloading k8s.io/kubernetes failed; full log: $download"; }
	kube_gomod=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["GoMod"])' "$download")
	mapfile -t staging < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kube_gomod" | sort -u)
	((${#staging[@]} > 0)) || cw_die "found no k8s.io/* v0.0.0 staging modules in $kube_gomod"
	cw_log "pinning ${#staging[@]} staging modules to $staging_version"
	{
		printf '//go:build tools\n\n// Package tools pins the Kubernetes commands this module builds.\npackage tools\n\nimport (\n'
		for c; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
		printf ')\n'
	} >"$d/tools.go"
	local edits=(-require="k8s.io/kubernetes@v${CW_KUBE_VERSION}")
	for m in "${staging[@]}"; do edits+=(-replace="$m=$m@$staging_version"); done
	# tidy adds what each command needs beyond the others (the kubelet: k8s.io/cri-streaming, …).
	if ! { (cd "$d" && go mod init cw-kubernetes && go mod edit "${edits[@]}") >"$log" 2>&1 && cw_logged "$log" "$d" go mod tidy; }; then
		tail -n 40 "$log" >&2
		cw_die "resolving kubernetes modules failed; full log: $log"
	fi
	cw_log "resolved kubernetes modules in $(cw_elapsed $((SECONDS - start)))"
}

# cw_kube_ldflags prints the -X flags that stamp v$CW_KUBE_VERSION into a Kubernetes
# binary (`kubectl version`, /version) and into what its clients send as User-Agent.
cw_kube_ldflags() {
	local minor=${CW_KUBE_VERSION#*.} p f=()
	minor=${minor%%.*}
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		f+=("-X $p.gitVersion=v$CW_KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean")
	done
	echo "${f[*]}"
}
