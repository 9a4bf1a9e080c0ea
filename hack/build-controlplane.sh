#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from
# the Go module proxy, and caches them outside the repo, keyed by version:
#
#   $CW_CACHE_DIR/controlplane/v<etcd>-v<kube>/bin/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#
# kube-scheduler runs only where a node does (hack/node.sh); without one, pods stay Pending.
#
# kubectl is built too, even where the machine has one: the ambassador (kubectl proxy) and
# the tests then use the apiserver's own version, as the ambassador image in manifests/
# does, instead of whatever skew the machine's kubectl has (v1.32 here: unsupported
# against a v1.37 server). Set CW_SYSTEM_KUBECTL=1 to use the machine's and skip it.
#
# Idempotent: returns at once when the binaries are there. Each binary is built to a
# temporary name and renamed into place, so an interrupted build never leaves a half
# binary that would count as cached. A cold build takes ~15-25 minutes on 2 cores.
#
# Usage: hack/build-controlplane.sh [--print-bin-dir]
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
	echo "$CW_BIN_DIR"
	exit 0
fi

# missing lists the binaries still to build.
missing() {
	local b
	for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
		if [[ $b == kubectl && ${CW_SYSTEM_KUBECTL:-} == 1 ]] && command -v kubectl >/dev/null; then
			continue
		fi
		[[ -x "$CW_BIN_DIR/$b" ]] || echo "$b"
	done
}
mapfile -t need < <(missing)
if ((${#need[@]} == 0)); then
	cw_log "control plane binaries cached in $CW_BIN_DIR"
	exit 0
fi

command -v go >/dev/null || cw_die "go not found (expected /usr/local/go/bin/go)"
mkdir -p "$CW_BIN_DIR"

# Two builds at once (say, make test and make demo) would only fight for the 2 cores;
# the second waits for the first and then finds the binaries cached.
exec 9>"$CW_CP_DIR/.build.lock"
if ! flock -n 9; then
	cw_log "another build of the control plane is running; waiting for it"
	flock 9
	mapfile -t need < <(missing)
	((${#need[@]} == 0)) && { cw_log "control plane binaries cached in $CW_BIN_DIR"; exit 0; }
fi

build_dir="$CW_CP_DIR/build"
tmp_files=()
cleanup() { ((${#tmp_files[@]})) && rm -f "${tmp_files[@]}"; return 0; }
trap cleanup EXIT

start_all=$SECONDS
cw_log "building control plane into $CW_BIN_DIR (missing: ${need[*]})"
cw_log "a cold build takes ~15-25 min on 2 cores (less with a warm Go build cache); logs in $build_dir/*.log"

# go_build PKG NAME LDFLAGS DIR: builds PKG in module DIR into the cache, atomically.
go_build() {
	local pkg=$1 name=$2 ldflags=$3 dir=$4 hint=$5
	local tmp="$CW_BIN_DIR/.$name.tmp.$$" start=$SECONDS
	tmp_files+=("$tmp")
	cw_log "building $name ($hint)…"
	if ! (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$tmp" "$pkg") >"$build_dir/$name.log" 2>&1; then
		tail -n 40 "$build_dir/$name.log" >&2
		cw_die "building $name failed; full log: $build_dir/$name.log"
	fi
	mv -f "$tmp" "$CW_BIN_DIR/$name"
	cw_log "built $name in $(cw_elapsed $((SECONDS - start)))"
}

contains() { local x; for x in "${@:2}"; do [[ $x == "$1" ]] && return 0; done; return 1; }

# --- etcd -----------------------------------------------------------------------------
if contains etcd "${need[@]}"; then
	d="$build_dir/etcd"
	mkdir -p "$d"
	if [[ ! -f "$d/go.sum" ]] || ! grep -q "go.etcd.io/etcd/server/v3 v${CW_ETCD_VERSION}" "$d/go.mod" 2>/dev/null; then
		cw_log "resolving go.etcd.io/etcd/server/v3 v$CW_ETCD_VERSION modules…"
		rm -f "$d/go.mod" "$d/go.sum"
		cat >"$d/main.go" <<'GO'
// Command etcd is etcd's own main, built from the module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
		(cd "$d" && go mod init cw-etcd && go mod edit -require="go.etcd.io/etcd/server/v3@v${CW_ETCD_VERSION}" && go mod tidy) \
			>"$build_dir/etcd-mod.log" 2>&1 || { tail -n 40 "$build_dir/etcd-mod.log" >&2; cw_die "resolving etcd modules failed"; }
	fi
	go_build . etcd "" "$d" "v$CW_ETCD_VERSION, ~1.5 min"
fi

# --- kubernetes -----------------------------------------------------------------------
kube_need=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	contains "$b" "${need[@]}" && kube_need+=("$b")
done
if ((${#kube_need[@]})); then
	d="$build_dir/kubernetes"
	mkdir -p "$d"
	staging_version="v0.${CW_KUBE_VERSION#*.}" # 1.37.2 -> v0.37.2
	# Resolved again when a command is new to tools.go: its modules may be missing from go.sum.
	if [[ ! -f "$d/go.sum" ]] || ! grep -q "k8s.io/kubernetes v${CW_KUBE_VERSION}" "$d/go.mod" 2>/dev/null ||
		! grep -q 'cmd/kube-scheduler"' "$d/tools.go" 2>/dev/null; then
		start=$SECONDS
		cw_log "resolving k8s.io/kubernetes v$CW_KUBE_VERSION modules (~1-2 min)…"
		rm -f "$d/go.mod" "$d/go.sum"
		# kubernetes' go.mod requires its staging modules as v0.0.0 and replaces them with
		# ./staging paths, so it cannot be required as is: point each at its published tag.
		kube_gomod=$(cd "$d" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v${CW_KUBE_VERSION}" |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
		mapfile -t staging < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kube_gomod" | sort -u)
		((${#staging[@]} > 0)) || cw_die "found no k8s.io/* v0.0.0 staging modules in $kube_gomod"
		cw_log "pinning ${#staging[@]} staging modules to $staging_version"
		cat >"$d/tools.go" <<'GO'
//go:build tools

// Package tools pins the Kubernetes commands this module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
		edits=(-require="k8s.io/kubernetes@v${CW_KUBE_VERSION}")
		for m in "${staging[@]}"; do edits+=(-replace="$m=$m@$staging_version"); done
		(cd "$d" && go mod init cw-kubernetes && go mod edit "${edits[@]}" && go mod tidy) \
			>"$build_dir/kubernetes-mod.log" 2>&1 || { tail -n 40 "$build_dir/kubernetes-mod.log" >&2; cw_die "resolving kubernetes modules failed"; }
		cw_log "resolved kubernetes modules in $(cw_elapsed $((SECONDS - start)))"
	fi
	minor=${CW_KUBE_VERSION#*.}
	minor=${minor%%.*}
	v=k8s.io/component-base/version
	cv=k8s.io/client-go/pkg/version # what clients put in their User-Agent
	kube_ldflags="-X $v.gitVersion=v$CW_KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
	kube_ldflags+=" -X $cv.gitVersion=v$CW_KUBE_VERSION -X $cv.gitMajor=1 -X $cv.gitMinor=$minor -X $cv.gitTreeState=clean"
	for b in "${kube_need[@]}"; do
		case $b in
		kube-apiserver) hint="v$CW_KUBE_VERSION, cold build ~10 min" ;;
		kube-controller-manager) hint="v$CW_KUBE_VERSION, ~3 min after the apiserver" ;;
		kube-scheduler) hint="v$CW_KUBE_VERSION, ~2 min after the apiserver" ;;
		kubectl) hint="v$CW_KUBE_VERSION, the ambassador, ~2 min" ;;
		esac
		go_build "k8s.io/kubernetes/cmd/$b" "$b" "$kube_ldflags" "$d" "$hint"
	done
fi

cw_log "control plane ready in $CW_BIN_DIR (took $(cw_elapsed $((SECONDS - start_all))))"
