#!/usr/bin/env bash
# Builds what a real node needs, from the Go module proxy, and caches it outside the
# repo, keyed by version (see hack/node-lib.sh for the variables):
#
#   $CW_NODE_BIN_DIR/{containerd,ctr,containerd-shim-runc-v2}   containerd v$CW_CONTAINERD_VERSION
#   $CW_NODE_BIN_DIR/kubelet                                     v$CW_KUBE_VERSION, as the control plane
#   $CW_NODE_BIN_DIR/kubectl-static                              the same kubectl, CGO_ENABLED=0: the
#                                                                ambassador image has no libc
#   $CW_NODE_BIN_DIR/cni/{bridge,host-local,loopback}            CNI plugins v$CW_CNI_VERSION
#
# runc is Debian's package (.ci/run installs it). Idempotent: returns at once when
# everything is there. Each binary is built under a temporary name and renamed into
# place, so an interrupted build never leaves a half binary that counts as cached; a
# lock makes a second invocation wait for the first. Cold, on 2 busy cores: containerd
# ~12 min, kubelet ~20 min, kubectl ~6 min (much less once the control plane's build
# has filled the Go build cache).
#
# Usage: hack/node-build.sh [--print-bin-dir | BINARY...]   (default: all of them, e.g.
#        hack/node-build.sh containerd cni/bridge builds only those and their siblings)
set -euo pipefail

# shellcheck source=hack/node-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/node-lib.sh"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
	echo "$CW_NODE_BIN_DIR"
	exit 0
fi

BINARIES=(containerd ctr containerd-shim-runc-v2 kubelet kubectl-static cni/bridge cni/host-local cni/loopback)
(($#)) && BINARIES=("$@")

missing() {
	local b
	for b in "${BINARIES[@]}"; do
		[[ -x "$CW_NODE_BIN_DIR/$b" ]] || echo "$b"
	done
}
mapfile -t need < <(missing)
if ((${#need[@]} == 0)); then
	cw_log "node binaries cached in $CW_NODE_BIN_DIR"
	exit 0
fi

command -v go >/dev/null || cw_die "go not found (expected /usr/local/go/bin/go)"
mkdir -p "$CW_NODE_BIN_DIR/cni"

exec 9>"$CW_NODE_DIR/.build.lock"
if ! flock -n 9; then
	cw_log "another build of the node binaries is running; waiting for it"
	flock 9
	mapfile -t need < <(missing)
	((${#need[@]} == 0)) && { cw_log "node binaries cached in $CW_NODE_BIN_DIR"; exit 0; }
fi

build_dir="$CW_NODE_DIR/build"
mkdir -p "$build_dir"
tmp_paths=()
cleanup() { ((${#tmp_paths[@]})) && rm -rf "${tmp_paths[@]}"; return 0; }
trap cleanup EXIT
trap "exit 143" TERM
trap "exit 130" INT

start_all=$SECONDS
cw_log "building node binaries into $CW_NODE_BIN_DIR (missing: ${need[*]}); logs in $build_dir/*.log"

contains() { local x; for x in "${@:2}"; do [[ $x == "$1" ]] && return 0; done; return 1; }

# go_install NAME HINT PKG...: `go install`s PKGs into a temporary GOBIN, then renames
# each binary into place (under the name NAME's directory, cni/ for the plugins).
go_install() {
	local name=$1 hint=$2 sub=${3%/} start=$SECONDS
	shift 3
	local gobin="$CW_NODE_BIN_DIR/.gobin.$name.$$"
	tmp_paths+=("$gobin")
	cw_log "building $name ($hint)…"
	if ! (cd "$build_dir" && GOBIN="$gobin" GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" "$@") >"$build_dir/$name.log" 2>&1; then
		tail -n 40 "$build_dir/$name.log" >&2
		cw_die "building $name failed; full log: $build_dir/$name.log"
	fi
	local f
	for f in "$gobin"/*; do mv -f "$f" "$CW_NODE_BIN_DIR/$sub${sub:+/}$(basename "$f")"; done
	cw_log "built $name in $(cw_elapsed $((SECONDS - start)))"
}

# --- containerd -------------------------------------------------------------------------
if contains containerd "${need[@]}" || contains ctr "${need[@]}" || contains containerd-shim-runc-v2 "${need[@]}"; then
	c=github.com/containerd/containerd/v2/cmd
	v=v$CW_CONTAINERD_VERSION
	# no_btrfs: Debian's btrfs headers are not needed (overlayfs is the snapshotter);
	# urfave_cli_no_docs: drops a documentation generator nobody here calls.
	go_install containerd "$v, cold ~12 min" "" -tags "no_btrfs urfave_cli_no_docs" \
		"$c/containerd@$v" "$c/ctr@$v" "$c/containerd-shim-runc-v2@$v"
fi

# --- CNI plugins ------------------------------------------------------------------------
if contains cni/bridge "${need[@]}" || contains cni/host-local "${need[@]}" || contains cni/loopback "${need[@]}"; then
	p=github.com/containernetworking/plugins/plugins
	v=v$CW_CNI_VERSION
	CGO_ENABLED=0 go_install cni "$v, ~2 min" cni "$p/main/bridge@$v" "$p/ipam/host-local@$v" "$p/main/loopback@$v"
fi

# --- kubelet and a static kubectl -------------------------------------------------------
kube_need=()
contains kubelet "${need[@]}" && kube_need+=(kubelet)
contains kubectl-static "${need[@]}" && kube_need+=(kubectl-static)
if ((${#kube_need[@]})); then
	d="$build_dir/kubernetes"
	mkdir -p "$d"
	staging_version="v0.${CW_KUBE_VERSION#*.}"
	if [[ ! -f "$d/go.sum" ]] || ! grep -q "k8s.io/kubernetes v${CW_KUBE_VERSION}" "$d/go.mod" 2>/dev/null; then
		start=$SECONDS
		cw_log "resolving k8s.io/kubernetes v$CW_KUBE_VERSION modules for the kubelet (~1-2 min)…"
		rm -f "$d/go.mod" "$d/go.sum"
		# As in hack/build-controlplane.sh: kubernetes' staging modules are v0.0.0 with
		# replace directives; point each at its published tag.
		kube_gomod=$(cd "$d" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v${CW_KUBE_VERSION}" |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
		mapfile -t staging < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kube_gomod" | sort -u)
		((${#staging[@]} > 0)) || cw_die "found no k8s.io/* v0.0.0 staging modules in $kube_gomod"
		cat >"$d/tools.go" <<'GO'
//go:build tools

// Package tools pins the Kubernetes commands this module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
		edits=(-require="k8s.io/kubernetes@v${CW_KUBE_VERSION}")
		for m in "${staging[@]}"; do edits+=(-replace="$m=$m@$staging_version"); done
		# tidy adds what the kubelet needs beyond the apiserver (k8s.io/cri-streaming, …).
		(cd "$d" && go mod init cw-kubelet && go mod edit "${edits[@]}" && go mod tidy) \
			>"$build_dir/kubernetes-mod.log" 2>&1 || { tail -n 40 "$build_dir/kubernetes-mod.log" >&2; cw_die "resolving kubernetes modules failed"; }
		cw_log "resolved kubernetes modules in $(cw_elapsed $((SECONDS - start)))"
	fi
	minor=${CW_KUBE_VERSION#*.}
	minor=${minor%%.*}
	v=k8s.io/component-base/version
	cv=k8s.io/client-go/pkg/version
	kube_ldflags="-s -w -X $v.gitVersion=v$CW_KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
	kube_ldflags+=" -X $cv.gitVersion=v$CW_KUBE_VERSION -X $cv.gitMajor=1 -X $cv.gitMinor=$minor -X $cv.gitTreeState=clean"
	for b in "${kube_need[@]}"; do
		case $b in
		kubelet) pkg=k8s.io/kubernetes/cmd/kubelet cgo=1 hint="v$CW_KUBE_VERSION, cold ~20 min" ;;
		kubectl-static) pkg=k8s.io/kubernetes/cmd/kubectl cgo=0 hint="v$CW_KUBE_VERSION, CGO_ENABLED=0, ~6 min" ;;
		esac
		tmp="$CW_NODE_BIN_DIR/.$b.tmp.$$"
		tmp_paths+=("$tmp")
		start=$SECONDS
		cw_log "building $b ($hint)…"
		if ! (cd "$d" && CGO_ENABLED=$cgo go build -trimpath -ldflags "$kube_ldflags" -o "$tmp" "$pkg") >"$build_dir/$b.log" 2>&1; then
			tail -n 40 "$build_dir/$b.log" >&2
			cw_die "building $b failed; full log: $build_dir/$b.log"
		fi
		mv -f "$tmp" "$CW_NODE_BIN_DIR/$b"
		cw_log "built $b in $(cw_elapsed $((SECONDS - start)))"
	done
fi

cw_log "node binaries ready in $CW_NODE_BIN_DIR (took $(cw_elapsed $((SECONDS - start_all))))"
