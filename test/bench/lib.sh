# lib.sh: what bench.sh and php.sh share. Sourced, not run: it expects
# `set -euo pipefail` and defines log, die, install_missing, the scratch
# directory $work with the pids array its trap stops, free_port, wait_port
# and run_bg.

log() { printf '%s bench: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "$*"; exit 1; }

# install_missing PKG:CHECK...: apt-get installs each Debian package PKG
# whose CHECK fails; CHECK is a command name, a path or glob when it starts
# with /, or php:EXT for a PHP extension (php -m lists it). Debian starts the packaged nginx (port 80 on every address),
# memcached and php-fpm on install; a temporary policy-rc.d keeps them
# stopped.
install_missing() {
  local need=() spec pkg check
  for spec in "$@"; do
    pkg=${spec%%:*} check=${spec#*:}
    case $check in
    /*) compgen -G "$check" >/dev/null && continue ;;
    php:*) php -m 2>/dev/null | grep -qx "${check#php:}" && continue ;;
    *) command -v "$check" >/dev/null 2>&1 && continue ;;
    esac
    need+=("$pkg")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "missing ${need[*]}; run as root (or install them) so apt-get can add them"
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  local policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
  fi
  local rc=0
  { apt-get update && apt-get install -y --no-install-recommends "${need[@]}"; } >&2 || rc=$?
  [ -n "$policy" ] && rm -f "$policy"
  [ $rc -eq 0 ] || die "apt-get install ${need[*]} failed"
}

# The scratch directory and everything started in it: the trap stops the
# pids, newest first, on exit, failure or Ctrl-C, and removes $work unless
# BENCH_KEEP=1 or the script failed.
work=$(mktemp -d /tmp/memcgate-bench.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ ${#pids[@]} -gt 0 ]; then
    local p i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
    for _ in $(seq 30); do
      local alive=0
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break
      sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
  fi
  if [ "${BENCH_KEEP:-0}" = 1 ] || [ $rc -ne 0 ]; then
    log "scratch directory kept: $work"
  else
    rm -rf "$work"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'log interrupted; exit 130' INT TERM

# Free loopback ports outside the ephemeral range, never the same twice;
# BENCH_PORTS=LOW-HIGH picks them in that range instead (a machine whose
# users share out port ranges).
used_ports=" "
port_low=20000 port_span=12000
if [ -n "${BENCH_PORTS:-}" ]; then
  [[ $BENCH_PORTS =~ ^([0-9]+)-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1024 ] &&
    [ "${BASH_REMATCH[2]}" -le 65535 ] && [ "${BASH_REMATCH[2]}" -ge $((BASH_REMATCH[1] + 15)) ] ||
    die "BENCH_PORTS=$BENCH_PORTS: want LOW-HIGH, 1024 ≤ LOW, LOW + 15 ≤ HIGH ≤ 65535"
  port_low=${BASH_REMATCH[1]} port_span=$((BASH_REMATCH[2] - BASH_REMATCH[1] + 1))
fi
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((port_low + RANDOM % port_span))
    [[ $used_ports == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! grep -qi ":$(printf '%04X' "$p") " /proc/net/tcp; then
      used_ports+="$p "
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
}
wait_port() { # port pid name
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || die "$3 exited at start (logs in $work)"
    sleep 0.05
  done
  die "$3 is not listening on 127.0.0.1:$1"
}
child_pids() { # pid name: the pid's children, comma-separated, once it has any
  local kids=
  for _ in $(seq 50); do
    kids=$(pgrep -P "$1" | paste -sd, -)
    [ -n "$kids" ] && { echo "$kids"; return 0; }
    sleep 0.05
  done
  die "no $2"
}

# Load generators run in the background and are waited for: a Ctrl-C then
# interrupts `wait` at once and the trap stops everything (run in the
# foreground, wrk would catch SIGINT itself, print partial results and let
# the script go on).
run_bg() { # outfile cmd...
  local out=$1
  shift
  "$@" >"$out" 2>&1 &
  local p=$!
  pids+=("$p")
  wait "$p" || true
  unset 'pids[-1]'
}
