# shellcheck shell=bash
# Settings for the real-node scripts (hack/node-build.sh, hack/node.sh), on top of
# hack/lib.sh. Source it; do not run it.
#
#   CW_CONTAINERD_VERSION  containerd to build (default 2.4.2)
#   CW_CNI_VERSION         CNI plugins to build (default 1.10.0)
#
# Binaries are cached in $CW_CACHE_DIR/node/<versions>/bin, beside the control plane's.

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CW_CONTAINERD_VERSION="${CW_CONTAINERD_VERSION:-2.4.2}"
CW_CNI_VERSION="${CW_CNI_VERSION:-1.10.0}"
CW_NODE_DIR="$CW_CACHE_DIR/node/containerd-v${CW_CONTAINERD_VERSION}-kube-v${CW_KUBE_VERSION}-cni-v${CW_CNI_VERSION}"
CW_NODE_BIN_DIR="$CW_NODE_DIR/bin"
