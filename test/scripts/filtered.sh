#!/usr/bin/env bash
# filtered.sh PATTERN COMMAND [ARG...]: runs COMMAND, shows only the lines
# of its standard output that match the extended regular expression
# PATTERN, and exits with COMMAND's status, not grep's: a failing run fails
# the make target that prints a table from a verbose test run. The lines
# that say why a test failed are rarely among those shown, so the whole
# output is kept in a file, named on standard error when COMMAND fails.
set -uo pipefail
pattern=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/memcgate-test-XXXXXX")
"$@" | tee "$log" | grep -E "$pattern"
st=("${PIPESTATUS[@]}")
if [ "${st[0]}" -ne 0 ]; then
  echo "filtered.sh: $1 exited with status ${st[0]}; its whole output: $log" >&2
  exit "${st[0]}"
fi
rm -f "$log"
# grep: 1 is no line shown, 2 a bad pattern or a read error
if [ "${st[2]}" -gt 1 ]; then
  exit "${st[2]}"
fi
exit 0
