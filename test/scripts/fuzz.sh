#!/usr/bin/env bash
# fuzz.sh [TIME]: runs every Go fuzz target of the module for a short,
# fixed time each (default 5s): a regression net for the parsers.
set -euo pipefail
t=${1:-5s}
for pkg in $(go list ./...); do
  for fn in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $fn ($t)"
    go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$t" "$pkg"
  done
done
