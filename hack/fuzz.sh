#!/usr/bin/env bash
# `make fuzz`: explores every fuzz target of the module for FUZZ_TIME (default
# 30s) each. An input that fails is saved under the package's testdata/fuzz/,
# where plain `go test` (make unit) replays it from then on, and fails the run.
# Not part of `make test`: exploration can find an input on any run, and CI's
# result must depend on the tree only.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" when -fuzztime ends while a worker is busy (go.dev/issue/75804,
# fixed in Go 1.27); it writes no input. A target that fails without writing
# one is therefore run once more; a second failure fails the run.
#
# Each new input that adds coverage is minimized first, by default for up to
# 60 s, during which the target explores nothing: podindex's FuzzHandle (a
# list, two snapshots and a relist per input) spent whole 30 s runs that way.
# FUZZ_MINIMIZE_TIME (5s) bounds it; a failing input is saved either way.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO="${GO:-go}"
FUZZ_TIME="${FUZZ_TIME:-30s}"
FUZZ_MINIMIZE_TIME="${FUZZ_MINIMIZE_TIME:-5s}"

targets=$(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(' . | sort)
[[ -n $targets ]] || { echo "no fuzz targets found" >&2; exit 1; }

# inputs DIR: how many failing inputs the fuzzer has saved in DIR.
inputs() { if [[ -d $1 ]]; then find "$1" -type f | wc -l; else echo 0; fi; }

failed=()
for file in $targets; do
	pkg=./$(dirname "${file#./}")
	for fn in $(sed -nE 's/^func (Fuzz[A-Za-z0-9_]+)\(.*/\1/p' "$file"); do
		corpus="$pkg/testdata/fuzz/$fn"
		for try in 1 2; do
			echo "==> fuzz $pkg $fn for $FUZZ_TIME"
			before=$(inputs "$corpus")
			if "$GO" test -run='^$' -fuzz="^$fn\$" -fuzztime="$FUZZ_TIME" -fuzzminimizetime="$FUZZ_MINIMIZE_TIME" "$pkg"; then
				break
			fi
			if (($(inputs "$corpus") != before)) || ((try == 2)); then
				failed+=("$pkg $fn")
				break
			fi
			echo "==> $fn failed without saving an input (go.dev/issue/75804); once more"
		done
	done
done
if ((${#failed[@]})); then
	printf 'fuzz: FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
