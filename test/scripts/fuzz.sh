#!/usr/bin/env bash
# fuzz.sh [BUDGET [--not] [PACKAGE...]]: runs every Go fuzz target of the
# module for a short, fixed budget each: a regression net for the
# parsers. With packages (go list patterns), only their targets; with
# --not before them, every target but theirs, so that of two runs that
# split the module (make test's), a target added anywhere is in one.
# The default budget is a count of executions (20000x), not a duration:
# with a duration, Go 1.26's fuzz coordinator can report a spurious
# "context deadline exceeded" when the time runs out while a worker is
# mid-call (golang/go#75804, fixed in Go 1.27), which would fail CI with
# no failing input. A real finding writes its input to testdata/fuzz/ and
# fails the run either way.
#
# FUZZ_TARGET_TIMEOUT (5m) bounds each target's run: longer for a run at
# a low priority beside other work, which can hold it off the cores.
set -euo pipefail
t=${1:-20000x}
shift || true
not=
if [ "${1:-}" = --not ]; then
  not=1
  shift
fi
# The packages whose targets run, one a line.
pkgs=$(go list ./...)
if [ $# -gt 0 ]; then
  named=$(go list "$@")
  if [ -n "$not" ]; then
    pkgs=$(grep -vxF -f <(printf '%s\n' "$named") <<<"$pkgs" || true)
  else
    pkgs=$named
  fi
fi
cache=$(go env GOCACHE)/fuzz # where go test -fuzz keeps what it found interesting
bins=$(mktemp -d)
trap 'rm -rf "$bins"' EXIT
# The targets are read from each package's test files (those its build
# constraints select), which compiles nothing: "go test -list" would build
# and link every test binary of the module first.
# shellcheck disable=SC2086 # import paths have no spaces
[ -z "$pkgs" ] || go list -f '{{.ImportPath}} {{.Dir}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' $pkgs |
  while read -r pkg dir files; do
    [ -n "$files" ] || continue
    # shellcheck disable=SC2086 # file names from go list have no spaces
    fns=$(cd "$dir" && sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)([A-Za-z0-9_]* \*testing\.F).*/\1/p' $files)
    [ -n "$fns" ] || continue
    # One instrumented test binary per package, run once per target as
    # go test -fuzz would run it: in the package's directory (its
    # testdata/fuzz corpus), with the go command's cache of interesting
    # inputs. go test -fuzz would build and link it again for each target.
    bin=$bins/$(echo "$pkg" | tr / _).test
    go test -c -fuzz=. -o "$bin" "$pkg"
    # -test.fuzzminimizetime bounds the minimizing of each input that
    # widened coverage: go test's default, 60 s or half the run's count of
    # executions, went to shrinking inputs kept in the cache, one worker
    # each, and those executions count against the budget (FuzzServersDNS:
    # 10,000 of 20,000 on minimizing two seeds, 0 new inputs tried for 33 s).
    # 200 is enough to cut a long input's tail, the minimizer's first step;
    # a failing input is written to testdata/fuzz either way.
    for fn in $fns; do
      echo "fuzz $pkg $fn ($t)"
      (cd "$dir" && "$bin" -test.run='^$' -test.fuzz="^${fn}\$" -test.fuzztime="$t" \
        -test.fuzzminimizetime=200x \
        -test.timeout="${FUZZ_TARGET_TIMEOUT:-5m}" -test.paniconexit0 -test.fuzzcachedir="$cache/$pkg")
    done
  done
