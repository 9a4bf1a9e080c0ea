# syntax=docker/dockerfile:1
#
# config-watcher image: a static Go binary on distroless, running as 65532:65532.
#
#   docker build --build-arg VERSION=v0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     -t ghcr.io/k8spatterns/config-watcher:v0.1.0 .
#
# For those who build with Docker. The released images are not built from this file:
# `make release` assembles them without Docker, for linux/amd64 and linux/arm64, with a
# pinned CA bundle (docs/deployment.md, "Release files").
#
# Base images are pinned by tag, and by digest once `make pin-images` ran (docs/deployment.md,
# "Images by digest"); the golang digest names GO_VERSION's default: another GO_VERSION
# needs the digest dropped.

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, in their own layer: it is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG VERSION=dev
# The commit, for --version and config_watcher_build_info; empty: the one the go command
# records from .git, if it can.
ARG REVISION=
ARG TARGETOS TARGETARCH
# Static (no cgo), reproducible paths (-trimpath), no symbol table or DWARF (-s -w).
# The Go compiler cross-compiles, so the build runs on the build host's platform.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${REVISION}" -o /out/config-watcher .

# distroless/static rather than scratch: same single binary, plus ca-certificates,
# tzdata, /etc/passwd with the nonroot user and a /tmp, and a base that Google rebuilds
# with Debian's security updates. It holds no shell and no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="config-watcher" \
      org.opencontainers.image.description="Kubernetes controller: restarts the pods named by a ConfigMap's k8spatterns.io/podDeleteSelector annotation when its data changes" \
      org.opencontainers.image.source="https://github.com/k8spatterns/config-watcher" \
      org.opencontainers.image.url="https://github.com/k8spatterns/config-watcher" \
      org.opencontainers.image.vendor="k8spatterns" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"
COPY --from=build /out/config-watcher /config-watcher
# Numeric, so that runAsNonRoot can be verified without reading /etc/passwd.
USER 65532:65532
# /healthz, /readyz, /metrics (HTTP_ADDR, default :8080).
EXPOSE 8080
ENTRYPOINT ["/config-watcher"]
