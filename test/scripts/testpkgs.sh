#!/usr/bin/env bash
# testpkgs.sh PATTERN...: the packages of make test's main go test run,
# one a line: those the patterns name except test/abuse (make test runs
# it alone afterwards), the longest to test first. go test starts the
# test binaries in the order given, -p at a time; one of the long ones
# started last would run on alone at the end while the other slots idle.
# The long ones are from the -json times of make test runs; a package
# missing here only starts in go list's order.
set -euo pipefail
long=(./test/e2e ./upstream/hashring ./gateway ./upstream/route ./upstream/mcpipe ./gateway/h1 ./test/pools ./upstream)
pkgs=$(go list "$@" | grep -v '/test/abuse$')
{ go list "${long[@]}" | grep -Fx -f <(printf '%s\n' "$pkgs") || true; printf '%s\n' "$pkgs"; } | awk '!seen[$0]++'
