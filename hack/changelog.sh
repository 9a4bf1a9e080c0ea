#!/usr/bin/env bash
# Prints the section of CHANGELOG.md for one version (release notes), or fails if it
# has none: a release says what it changes.
# Usage: hack/changelog.sh vX.Y.Z
set -euo pipefail
version="${1:?usage: hack/changelog.sh vX.Y.Z}"
changelog="$(dirname "${BASH_SOURCE[0]}")/../CHANGELOG.md"
awk -v v="$version" '
	/^## / { inside = ($2 == v) ; if (inside) { found = 1 ; next } }
	inside { print }
	END { if (!found) { print "CHANGELOG.md has no section ## " v > "/dev/stderr" ; exit 1 } }
' "$changelog"
