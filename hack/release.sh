#!/usr/bin/env bash
# Writes dist/ for a release (make release VERSION=vX.Y.Z [IMAGE=...]): the controller
# built for linux/amd64 and linux/arm64, its images as one OCI index in the forms the
# loaders take, the install files (install.yaml, install-cluster-wide.yaml and each with
# Secrets: install-secrets.yaml, install-cluster-wide-secrets.yaml) pinned to the index by
# digest, the Helm chart (hack/helm) with the same digest, as a .tgz and as the OCI layout
# the release workflow pushes (config-watcher-chart.oci.tar), an SPDX SBOM and SHA256SUMS. The
# assembler is hack/image (`image release`).
#
# Reproducible: the same commit and Go version give byte-identical dist/ on any machine.
# Every input that could differ is fixed here: GOOS, GOARCH and their feature levels,
# no cgo, -trimpath, no VCS stamp (GOFLAGS is replaced, so a -buildvcs from the
# environment cannot add a dirty tree's), the commit's time for every timestamp, the
# CA bundle from a Go module go.mod pins, kustomize from a pinned module.
#
# The other images (the ambassador's) are named as manifests/ names them: by tag and digest
# once `make pin-images` ran (the release workflow runs it first), else by tag.
#
# Usage: hack/release.sh      (VERSION, IMAGE, SOURCE, DIST from the environment)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib.sh
source "$repo/hack/lib.sh"

: "${VERSION:?set VERSION, e.g. make release VERSION=v0.2.0}"
IMAGE="${IMAGE:-ghcr.io/k8spatterns/config-watcher}"
# The repository the image's source label and the SBOM point to (a fork's own).
SOURCE="${SOURCE:-https://github.com/k8spatterns/config-watcher}"
DIST="${DIST:-$repo/dist}"
ARCHES=(amd64 arm64)

revision="$(git -C "$repo" rev-parse HEAD)"
SOURCE_DATE_EPOCH="$(git -C "$repo" log -1 --format=%ct)"
export SOURCE_DATE_EPOCH
if [[ -n $(git -C "$repo" status --porcelain --untracked-files=no) ]]; then
	cw_log "warning: the tree has uncommitted changes: dist/ is not what $revision gives"
fi

work="$repo/bin/release-build"
mkdir -p "$work"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOAMD64=v1 GOARM64=v8.0
(cd "$repo/hack/image" && go build -trimpath -o "$work/image" .)
# RELEASE_GOCACHE: a build cache for the controller alone (make release-test passes an
# empty one, as a second machine would start with).
gocache="${RELEASE_GOCACHE:-$(go env GOCACHE)}"
bins=()
for arch in "${ARCHES[@]}"; do
	cw_log "building config-watcher $VERSION for linux/$arch"
	(cd "$repo" && GOCACHE="$gocache" GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$revision" \
		-o "$work/linux-$arch/config-watcher" .)
	bins+=(-bin "$arch=$work/linux-$arch/config-watcher")
done
"$work/image" release -version "$VERSION" -image "$IMAGE" -source "$SOURCE" -revision "$revision" \
	-manifests "$repo/manifests" -o "$DIST" "${bins[@]}"
# The chart names the index by the digest install.yaml names, known once dist/ is written, and
# the ambassador by the digest make pin-images wrote there, if it ran.
digest="$(grep -o -m1 "$IMAGE@sha256:[0-9a-f]\{64\}" "$DIST/install.yaml" | cut -d@ -f2)" ||
	cw_die "no $IMAGE@sha256:… in $DIST/install.yaml"
ambassador="$(grep -o -m1 'registry.k8s.io/kubectl:[^@" ]*@sha256:[0-9a-f]\{64\}' "$DIST/install.yaml" | cut -d@ -f2)" || true
(cd "$repo/hack/helm" && go build -trimpath -o "$work/helm" .)
cw_log "packaging the chart $VERSION"
"$work/helm" package -version "$VERSION" -image "$IMAGE" -digest "$digest" \
	-ambassador-digest "$ambassador" -o "$DIST" "$repo/charts/config-watcher" >/dev/null
"$work/image" sums "$DIST"
cw_log "wrote $DIST:"
(cd "$DIST" && ls -l)
