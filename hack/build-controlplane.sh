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
# Idempotent: returns at once when the binaries are there; a second invocation waits for
# the first (cw_build_start in hack/lib.sh, shared with hack/node-build.sh). A cold build
# takes ~15-25 minutes on 2 cores.
#
# Usage: hack/build-controlplane.sh [--print-bin-dir]
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
	echo "$CW_BIN_DIR"
	exit 0
fi

bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
if [[ ${CW_SYSTEM_KUBECTL:-} == 1 ]] && command -v kubectl >/dev/null; then
	bins=("${bins[@]:0:4}")
fi
cw_build_start "control plane binaries" "$CW_CP_DIR" "${bins[@]}" || exit 0
build_dir="$CW_CP_DIR/build"
start_all=$SECONDS
cw_log "a cold build takes ~15-25 min on 2 cores (less with a warm Go build cache)"

# --- etcd -----------------------------------------------------------------------------
if cw_contains etcd "${need[@]}"; then
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
		if ! { (cd "$d" && go mod init cw-etcd && go mod edit -require="go.etcd.io/etcd/server/v3@v${CW_ETCD_VERSION}") >"$build_dir/etcd-mod.log" 2>&1 &&
			cw_logged "$build_dir/etcd-mod.log" "$d" go mod tidy; }; then
			tail -n 40 "$build_dir/etcd-mod.log" >&2
			cw_die "resolving etcd modules failed"
		fi
	fi
	cw_go_build etcd "v$CW_ETCD_VERSION, ~1.5 min" "$d" .
fi

# --- kubernetes -----------------------------------------------------------------------
kube_need=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	cw_contains "$b" "${need[@]}" && kube_need+=("$b")
done
if ((${#kube_need[@]})); then
	d="$build_dir/kubernetes"
	cw_kube_module "$d" kube-apiserver kube-controller-manager kube-scheduler kubectl
	kube_ldflags=$(cw_kube_ldflags)
	for b in "${kube_need[@]}"; do
		case $b in
		kube-apiserver) hint="v$CW_KUBE_VERSION, cold build ~10 min" ;;
		kube-controller-manager) hint="v$CW_KUBE_VERSION, ~3 min after the apiserver" ;;
		kube-scheduler) hint="v$CW_KUBE_VERSION, ~2 min after the apiserver" ;;
		kubectl) hint="v$CW_KUBE_VERSION, the ambassador, ~2 min" ;;
		esac
		cw_go_build "$b" "$hint" "$d" "k8s.io/kubernetes/cmd/$b" "$kube_ldflags"
	done
fi

cw_log "control plane ready in $CW_BIN_DIR (took $(cw_elapsed $((SECONDS - start_all))))"
