#!/usr/bin/env bash
# Validate docker-compose.yaml offline: no Docker engine needed.
#
# Usage: hack/check-compose.sh [COMPOSE_FILE]      (default: docker-compose.yaml)
#
# 1. `docker compose config` for the default profile and for --profile sandbox: the
#    Compose specification's schema, interpolation, profiles, depends_on. This is the
#    real Compose v2+ loader, and `config` never talks to an engine.
# 2. What the schema cannot know, with jq on the JSON that `config` prints:
#    - `docker compose up` without a profile starts the controller alone;
#    - the controller service is hardened (non-root, read-only, no capabilities,
#      no-new-privileges) and uses the host network and http://localhost:8001;
#    - the sandbox has its services, publishes the ambassador on loopback only, and
#      uses the same kubectl image as manifests/;
#    - the bash scripts of the one-shot services parse (bash -n) and pass shellcheck.
#
# Compose, in this order: the docker CLI's plugin (`docker compose`), a v2+
# `docker-compose` on PATH, a cached build, or else a build of the pinned Compose from
# the Go module proxy (about 5 minutes cold on 2 cores; cached in $CW_CACHE_DIR).
# Debian's docker-compose package is Compose v1 (1.29, Python, end of life since 2023)
# and does not know parts of the current specification (e.g. depends_on.required), so
# it is not used. jq and shellcheck are installed with apt-get when missing (as root).
#
# Environment:
#   CW_CACHE_DIR      cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/config-watcher)
#   COMPOSE_VERSION   Compose to build when none is found (default v5.6.0; its go.mod
#                     must not need a newer Go than the one installed)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
file="$(realpath "${1:-$repo/docker-compose.yaml}")"
COMPOSE_VERSION="${COMPOSE_VERSION:-v5.6.0}"
CW_CACHE_DIR="${CW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/config-watcher}"
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	PATH="/usr/local/go/bin:$PATH"
fi

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'check-compose: %s\n' "$*" >&2; exit 1; }

failures=0
fail() { printf 'FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }
pass() { printf 'ok:   %s\n' "$*"; }

# --- tools -----------------------------------------------------------------------------

apt_install() { # apt_install PACKAGE: for a tool that is missing
	[[ $(id -u) == 0 ]] || die "$1 is missing; install it (apt-get install $1)"
	log "installing $1 with apt-get"
	if ! apt-get install -y -qq "$1" >/dev/null 2>&1; then
		{ apt-get update -qq >/dev/null && apt-get install -y -qq "$1" >/dev/null; } || die "apt-get install $1 failed"
	fi
}

# is_compose_v2 CMD...: true if CMD is Compose v2 or later.
is_compose_v2() {
	local v
	v="$("$@" version --short 2>/dev/null)" || return 1
	[[ $v =~ ^v?([0-9]+)\. ]] && ((BASH_REMATCH[1] >= 2))
}

build_compose() { # build_compose DEST: the pinned Compose, as its own module
	local dest="$1" src work
	command -v go >/dev/null || die "no Compose found and no Go to build it with"
	log "building Docker Compose $COMPOSE_VERSION from the Go module proxy (once; ~5 min cold)"
	src="$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json "github.com/docker/compose/v5@$COMPOSE_VERSION" | jq -r .Dir)"
	[[ -d $src ]] || die "go mod download github.com/docker/compose/v5@$COMPOSE_VERSION failed"
	# Build inside a writable copy of the module, so that its own go.mod and go.sum
	# (with its exclude directives) decide the dependency versions, as in its release.
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' RETURN
	cp -r "$src/." "$work" && chmod -R u+w "$work"
	(cd "$work" && CGO_ENABLED=0 go build -trimpath \
		-ldflags "-s -w -X github.com/docker/compose/v5/internal.Version=$COMPOSE_VERSION" \
		-o "$dest.tmp" ./cmd) || die "building Compose failed"
	mv "$dest.tmp" "$dest"
}

compose=()
if docker compose version >/dev/null 2>&1 && is_compose_v2 docker compose; then
	compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1 && is_compose_v2 docker-compose; then
	compose=(docker-compose)
else
	cached="$CW_CACHE_DIR/compose/$COMPOSE_VERSION/docker-compose"
	command -v jq >/dev/null || apt_install jq
	if [[ ! -x $cached ]]; then
		mkdir -p "$(dirname "$cached")"
		build_compose "$cached"
	fi
	compose=("$cached")
fi
command -v jq >/dev/null || apt_install jq
command -v shellcheck >/dev/null || apt_install shellcheck
log "using ${compose[*]} ($("${compose[@]}" version --short))"

# --- 1. the specification ------------------------------------------------------------

cd "$(dirname "$file")"
# Interpolate with the defaults written in the file, not with this shell's settings.
unset VERSION WATCH_NAMESPACE HTTP_ADDR LOG_FORMAT LOG_LEVEL RECORD_HASH K3S_IMAGE KUBECTL_IMAGE COMPOSE_PROFILES
default_json="$(mktemp)" sandbox_json="$(mktemp)"
trap 'rm -f "$default_json" "$sandbox_json"' EXIT
if "${compose[@]}" -f "$file" config --format json >"$default_json"; then
	pass "docker compose config (default profile)"
else
	fail "docker compose config (default profile)"
fi
if "${compose[@]}" -f "$file" --profile sandbox config --format json >"$sandbox_json"; then
	pass "docker compose --profile sandbox config"
else
	fail "docker compose --profile sandbox config"
fi
((failures == 0)) || die "$failures failure(s)"

# --- 2. what the schema cannot know -----------------------------------------------------

# expect NAME JSON JQ-FILTER: the filter must print true.
expect() {
	local name="$1" json="$2" filter="$3" got
	got="$(jq -r "$filter" "$json" 2>&1)" || true
	if [[ $got == true ]]; then pass "$name"; else fail "$name (got: ${got:-nothing})"; fi
}

expect "docker compose up starts the controller alone" "$default_json" \
	'(.services | keys) == ["config-watcher"]'
for profile in default sandbox; do
	json="$default_json"
	[[ $profile == sandbox ]] && json="$sandbox_json"
	expect "controller is hardened: 65532, read-only, cap_drop ALL, no-new-privileges ($profile)" "$json" \
		'.services["config-watcher"] | .user == "65532:65532" and .read_only == true
		 and (.cap_drop | index("ALL") != null)
		 and (.security_opt | index("no-new-privileges:true") != null)
		 and (.privileged | not)'
	expect "controller reaches the ambassador on the host's loopback ($profile)" "$json" \
		'.services["config-watcher"] | .network_mode == "host"
		 and .environment.API_URL == "http://localhost:8001"
		 and (.environment.HTTP_ADDR | startswith("127.0.0.1:"))'
done
expect "sandbox has k3s, setup, ambassador, config-watcher and demo" "$sandbox_json" \
	'(.services | keys) == ["ambassador","config-watcher","demo","k3s","setup"]'
expect "sandbox publishes only the ambassador, on the host's loopback only" "$sandbox_json" \
	'[.services | to_entries[] | select(.value.ports) | {svc: .key, ip: .value.ports[].host_ip}]
	 == [{svc: "ambassador", ip: "127.0.0.1"}]'
expect "only k3s is privileged" "$sandbox_json" \
	'[.services | to_entries[] | select(.value.privileged) | .key] == ["k3s"]'
expect "the controller waits for a healthy ambassador, the ambassador for setup, setup for k3s" "$sandbox_json" \
	'.services["config-watcher"].depends_on.ambassador.condition == "service_healthy"
	 and .services.ambassador.depends_on.setup.condition == "service_completed_successfully"
	 and .services.setup.depends_on.k3s.condition == "service_healthy"
	 and .services.demo.depends_on.ambassador.condition == "service_healthy"'

# The kubectl image must be the one manifests/ deploys as the ambassador.
if command -v kubectl >/dev/null 2>&1; then
	want="$(KUBECONFIG=/dev/null kubectl kustomize "$repo/manifests" | sed -n 's/^ *image: *\(registry\.k8s\.io\/kubectl:.*\)$/\1/p' | sort -u)"
	expect "sandbox kubectl image is manifests/' ambassador image ($want)" "$sandbox_json" \
		"[.services[] | .image | select(startswith(\"registry.k8s.io/kubectl\"))] | unique == [\"$want\"]"
else
	log "kubectl not found: skipping the image comparison with manifests/"
fi

# The one-shot services' scripts. `config` re-escapes $ as $$ in its output.
for svc in setup demo; do
	script="$(mktemp)"
	jq -r --arg s "$svc" '.services[$s].command[0] // empty' "$sandbox_json" | sed 's/\$\$/$/g' >"$script"
	if [[ ! -s $script ]]; then
		fail "$svc has a bash script"
	elif bash -n "$script" && shellcheck -s bash "$script"; then
		pass "$svc script: bash -n and shellcheck"
	else
		fail "$svc script: bash -n or shellcheck"
	fi
	rm -f "$script"
done

((failures == 0)) || die "$failures failure(s)"
log "docker-compose.yaml: all checks passed (not run: no Docker engine is needed or used)"
