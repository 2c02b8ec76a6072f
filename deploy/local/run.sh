#!/usr/bin/env bash
# run.sh: starts three memcached servers on loopback ports that do not clash
# with a system memcached (21211-21213), then memcgate in the foreground
# against them, and prints curl examples. Ctrl-C stops everything it started.
set -euo pipefail
bin=${1:-bin/memcgate}
ports=(21211 21212 21213)
pids=()
cleanup() {
  trap - INT TERM EXIT
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  echo "stopped memcgate and memcached ${ports[*]}"
}
trap cleanup INT TERM EXIT
user=()
[ "$(id -u)" = 0 ] && user=(-u nobody)
for p in "${ports[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p is taken; stop whatever listens there first" >&2; exit 1
  fi
  memcached -l 127.0.0.1 -p "$p" -U 0 -m 64 "${user[@]}" &
  pids+=($!)
done
# The three servers above; logs for a terminal; Ctrl-C stops at once (no
# load balancer to drain). The listeners keep their defaults: data :8080,
# admin 127.0.0.1:9090.
export MEMCGATE_SERVERS=${MEMCGATE_SERVERS:-127.0.0.1:21211,127.0.0.1:21212,127.0.0.1:21213}
export MEMCGATE_LOG_FORMAT=${MEMCGATE_LOG_FORMAT:-text}
export MEMCGATE_DRAIN_DELAY=${MEMCGATE_DRAIN_DELAY:-0s}
cat <<TXT
memcached: ${ports[*]} on 127.0.0.1
memcgate:  data http://localhost:8080   admin http://127.0.0.1:9090

Try, from another shell:
  curl -i -X PUT --data-binary 'hello' 'localhost:8080/greeting?exptime=300'
  curl -i localhost:8080/greeting
  curl -I localhost:8080/greeting
  curl -i -X PUT --data-binary @/etc/os-release localhost:8080/a/b && curl -s localhost:8080/a/b | cmp - /etc/os-release && echo identical
  curl -i -X PUT -H 'If-None-Match: *' --data-binary 'first' localhost:8080/once    # add: 412 the second time
  curl -i -X PUT --data-binary 10 localhost:8080/counter && curl -i -X POST 'localhost:8080/counter?op=incr&delta=5'
  curl -i -X POST --data-binary '!' 'localhost:8080/greeting?op=append'
  curl -i -X DELETE localhost:8080/greeting
  curl -s 127.0.0.1:9090/debug/nodes ; curl -s '127.0.0.1:9090/debug/owners?key=greeting'
  curl -s 127.0.0.1:9090/metrics | grep ^memcgate_
Ctrl-C stops memcgate and the three memcached servers.
TXT
"$bin" &
pids+=($!)
wait "${pids[-1]}"
