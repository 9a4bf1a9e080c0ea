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
# everything is there; a second invocation waits for the first (cw_build_start in
# hack/lib.sh, shared with hack/build-controlplane.sh). Cold, on 2 busy cores: containerd
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

cw_build_start "node binaries" "$CW_NODE_DIR" "${BINARIES[@]}" || exit 0
build_dir="$CW_NODE_DIR/build"
mkdir -p "$CW_NODE_BIN_DIR/cni"
start_all=$SECONDS

# go_install NAME HINT SUBDIR PKG...: `go install`s PKGs into a temporary GOBIN, then
# renames each binary into bin/SUBDIR (cni/ for the plugins).
go_install() {
	local name=$1 hint=$2 sub=${3%/}
	shift 3
	local gobin="$CW_NODE_BIN_DIR/.gobin.$name.$$"
	cw_build_tmp "$gobin"
	GOBIN="$gobin" GOFLAGS=-mod=mod cw_build_step "$name" "$hint" "$build_dir" go install -trimpath -ldflags "-s -w" "$@"
	local f
	for f in "$gobin"/*; do mv -f "$f" "$CW_NODE_BIN_DIR/$sub${sub:+/}$(basename "$f")"; done
}

# --- containerd -------------------------------------------------------------------------
if cw_contains containerd "${need[@]}" || cw_contains ctr "${need[@]}" || cw_contains containerd-shim-runc-v2 "${need[@]}"; then
	c=github.com/containerd/containerd/v2/cmd
	v=v$CW_CONTAINERD_VERSION
	# no_btrfs: Debian's btrfs headers are not needed (overlayfs is the snapshotter);
	# urfave_cli_no_docs: drops a documentation generator nobody here calls.
	go_install containerd "$v, cold ~12 min" "" -tags "no_btrfs urfave_cli_no_docs" \
		"$c/containerd@$v" "$c/ctr@$v" "$c/containerd-shim-runc-v2@$v"
fi

# --- CNI plugins ------------------------------------------------------------------------
if cw_contains cni/bridge "${need[@]}" || cw_contains cni/host-local "${need[@]}" || cw_contains cni/loopback "${need[@]}"; then
	p=github.com/containernetworking/plugins/plugins
	v=v$CW_CNI_VERSION
	CGO_ENABLED=0 go_install cni "$v, ~2 min" cni "$p/main/bridge@$v" "$p/ipam/host-local@$v" "$p/main/loopback@$v"
fi

# --- kubelet and a static kubectl -------------------------------------------------------
if cw_contains kubelet "${need[@]}" || cw_contains kubectl-static "${need[@]}"; then
	d="$build_dir/kubernetes"
	cw_kube_module "$d" kubectl kubelet
	kube_ldflags=$(cw_kube_ldflags)
	if cw_contains kubelet "${need[@]}"; then
		CGO_ENABLED=1 cw_go_build kubelet "v$CW_KUBE_VERSION, cold ~20 min" "$d" k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
	fi
	if cw_contains kubectl-static "${need[@]}"; then
		CGO_ENABLED=0 cw_go_build kubectl-static "v$CW_KUBE_VERSION, CGO_ENABLED=0, ~6 min" "$d" k8s.io/kubernetes/cmd/kubectl "$kube_ldflags"
	fi
fi

cw_log "node binaries ready in $CW_NODE_BIN_DIR (took $(cw_elapsed $((SECONDS - start_all))))"
