#!/usr/bin/env bash
# Writes the images as tarballs into bin/images/, with no container engine and no
# registry (the assembler is hack/image, a module of its own):
#
#   config-watcher.tar  ghcr.io/k8spatterns/config-watcher:dev-<commit> ($VERSION): the static linux
#                       binary for this machine's architecture (CGO_ENABLED=0), the CA
#                       bundle (Mozilla's roots from the Go module go.mod pins, not this
#                       machine's), 65532:65532. Same content as the Dockerfile's
#                       result, without distroless' /etc/passwd and tzdata. A release's
#                       images for both platforms: make release (hack/release.sh).
#
#   kustomization.yaml  manifests/ with that image: kubectl apply -n default -k bin/images/
#
# With --e2e, also the images the e2e node runs under the manifests' exact names, none
# of which can be pulled here:
#
#   kubectl.tar         registry.k8s.io/kubectl:v$CW_KUBE_VERSION, the ambassador: the
#                       static kubectl from hack/node-build.sh
#   pause.tar           registry.k8s.io/pause:3.10.2, containerd's sandbox image
#   http-echo.tar       hashicorp/http-echo:1.0.0, the demo's web server (hack/image/cmd/http-echo)
#
# Load them with `docker load -i`, `kind load image-archive`, `ctr -n k8s.io images import`.
# Usage: hack/image/build.sh [--e2e]      (make image, make image-e2e)
set -euo pipefail

image_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$image_dir/../.." && pwd)"
# shellcheck source=hack/node-lib.sh
source "$repo/hack/node-lib.sh"

# A dev build is tagged as one (dev-<commit>, -dirty with uncommitted changes), never with a
# release's tag: a node that loaded it would keep it under that tag after the release.
commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$repo" diff --quiet HEAD 2>/dev/null || commit+="-dirty"
VERSION="${VERSION:-dev-$commit}"
# Reproducible by default: the time of the last commit, else 0.
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH
# Linux binaries whatever the host (a Mac builds for a kind node), of the host's
# architecture, which the assembler records (-arch defaults to it).
export GOOS=linux GOARCH="$(go env GOHOSTARCH)" CGO_ENABLED=0

out="$repo/bin/images"
work="$repo/bin/image-build"
mkdir -p "$out" "$work"

assembler="$work/image"
(cd "$image_dir" && GOOS= GOARCH= go build -o "$assembler" .)
"$assembler" cabundle "$work/ca-certificates.crt"

cw_log "building config-watcher $VERSION (static)"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
(cd "$repo" && go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$revision" -o "$work/config-watcher" .)
"$assembler" -ref "ghcr.io/k8spatterns/config-watcher:$VERSION" -o "$out/config-watcher.tar" \
	-entrypoint /config-watcher -user 65532:65532 -port 8080/tcp \
	-file "$work/config-watcher=/config-watcher:0755" \
	-file "$work/ca-certificates.crt=/etc/ssl/certs/ca-certificates.crt:0644" \
	-label org.opencontainers.image.title=config-watcher \
	-label org.opencontainers.image.source=https://github.com/k8spatterns/config-watcher \
	-label "org.opencontainers.image.version=$VERSION"

cat >"$out/kustomization.yaml" <<EOF
# Written by make image: manifests/ running the image it built (bin/images/config-watcher.tar).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../../manifests
images:
- name: ghcr.io/k8spatterns/config-watcher
  newTag: $VERSION
EOF
cw_log "bin/images/config-watcher.tar is ghcr.io/k8spatterns/config-watcher:$VERSION; bin/images/kustomization.yaml deploys it"

[[ ${1:-} == --e2e ]] || exit 0

"$repo/hack/node-build.sh"
cw_log "building the e2e images: ambassador (kubectl v$CW_KUBE_VERSION), pause, http-echo"
"$assembler" -ref "registry.k8s.io/kubectl:v$CW_KUBE_VERSION" -o "$out/kubectl.tar" \
	-entrypoint /bin/kubectl -user 65532:65532 \
	-file "$CW_NODE_BIN_DIR/kubectl-static=/bin/kubectl:0755"
(cd "$image_dir" && go build -trimpath -ldflags "-s -w" -o "$work/pause" ./cmd/pause)
"$assembler" -ref registry.k8s.io/pause:3.10.2 -o "$out/pause.tar" \
	-entrypoint /pause -user 65535:65535 -file "$work/pause=/pause:0755"
(cd "$image_dir" && go build -trimpath -ldflags "-s -w" -o "$work/http-echo" ./cmd/http-echo)
"$assembler" -ref docker.io/hashicorp/http-echo:1.0.0 -o "$out/http-echo.tar" \
	-entrypoint /http-echo -user 65532:65532 -port 5678/tcp -file "$work/http-echo=/http-echo:0755"
