#!/usr/bin/env bash
# make release-test: `make release` twice, each into a dist of its own, the second
# compiling the controller with an empty Go build cache (as a second machine would),
# then compares the two SHA256SUMS and runs the release tests (hack/image, build tag
# release) on the first: both platforms' images, install files pinned to the index digest, a push to a
# registry on loopback and a pull back by digest, the chart's OCI layout pushed there as
# release.yml pushes it and pulled back as `helm install oci://…` fetches it (hack/helm
# pull, the binary make release built), SHA256SUMS, the SBOM.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib.sh
source "$repo/hack/lib.sh"

export VERSION="${VERSION:-v0.0.0-test}"
out="$repo/bin/release-test"
rm -rf "$out"
mkdir -p "$out"
# Outside the repository: go vet ./... and friends would walk it.
gocache="$(mktemp -d)"
trap 'chmod -R u+w "$gocache"; rm -rf "$gocache"' EXIT

cw_log "make release VERSION=$VERSION, first"
DIST="$out/a" bash "$repo/hack/release.sh" >/dev/null
cw_log "make release VERSION=$VERSION, again with an empty build cache"
DIST="$out/b" RELEASE_GOCACHE="$gocache" bash "$repo/hack/release.sh" >/dev/null
if ! cmp -s "$out/a/SHA256SUMS" "$out/b/SHA256SUMS"; then
	diff "$out/a/SHA256SUMS" "$out/b/SHA256SUMS" >&2 || true
	cw_die "two builds of the same tree differ"
fi
cw_log "identical: SHA256SUMS $(sha256sum "$out/a/SHA256SUMS" | cut -d' ' -f1)"
cat "$out/a/SHA256SUMS"

cd "$repo/hack/image"
CW_DIST="$out/a" CW_HELM="$repo/bin/release-build/helm" go test -tags release -count=1 -run 'TestDist' .
