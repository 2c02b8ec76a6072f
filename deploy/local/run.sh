#!/usr/bin/env bash
# run.sh: starts three memcached servers on loopback ports that do not clash
# with a system memcached (21211-21213), then memcgate in the foreground
# against them, and prints curl examples once it accepts connections.
# Ctrl-C stops everything it started.
#
# Other ports, when those are taken or several people share a machine
# (below 32768: a port of the kernel's ephemeral range, 32768-60999, may
# be held by any outgoing connection at the moment it is wanted):
#   MEMCACHED_PORTS='22211 22212 22213' MEMCGATE_LISTEN_ADDR=127.0.0.1:28080 \
#     MEMCGATE_ADMIN_ADDR=127.0.0.1:29090 make run
# The examples it prints use the addresses it was given.
set -euo pipefail
bin=${1:-bin/memcgate}
# The MEMCGATE_ variables this shell passes on (one exported while trying
# a deployment, say): the gateway takes them over this script's choices,
# and the banner names them, so that examples answering otherwise than
# shown (a 503 from other servers, a 401 from tokens) have their cause
# on the screen. The listeners' are left out: the banner shows them.
read -r -a given <<<"$(compgen -e | grep '^MEMCGATE_' | grep -vx -e MEMCGATE_LISTEN_ADDR -e MEMCGATE_ADMIN_ADDR | tr '\n' ' ' || true)"
read -r -a ports <<<"${MEMCACHED_PORTS:-21211 21212 21213}"
[ ${#ports[@]} -gt 0 ] || { echo "MEMCACHED_PORTS is empty: name at least one port" >&2; exit 2; }
# The listeners the gateway will use: its defaults unless the environment
# sets them (it reads the same variables).
listen=${MEMCGATE_LISTEN_ADDR:-:8080}
admin=${MEMCGATE_ADMIN_ADDR:-127.0.0.1:9090}
pids=()
started=()
cleanup() {
  trap - INT TERM EXIT
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  [ ${#started[@]} -gt 0 ] && echo "stopped ${started[*]}"
  return 0
}
trap cleanup INT TERM EXIT

# hostport ADDR: where a client on this host reaches a listener address
# (":8080", "0.0.0.0:8080" and "[::]:8080" are all reached on localhost).
hostport() {
  local host=${1%:*} port=${1##*:}
  case $host in '' | 0.0.0.0 | '[::]') host=localhost ;; esac
  echo "$host:$port"
}
# open HOST:PORT: true if something accepts connections there.
open() {
  local host=${1%:*} port=${1##*:}
  host=${host#[}; host=${host%]}
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}
data=$(hostport "$listen")
adm=$(hostport "$admin")

# Refuse before starting anything if a port is taken, naming the variable
# that moves it.
for p in "${ports[@]}"; do
  if open "127.0.0.1:$p"; then
    echo "port $p is taken (memcached); stop whatever listens there, or set MEMCACHED_PORTS='P1 P2 P3'" >&2; exit 1
  fi
done
if open "$data"; then
  echo "$data is taken (data listener); stop whatever listens there, or set MEMCGATE_LISTEN_ADDR=HOST:PORT" >&2; exit 1
fi
if open "$adm"; then
  echo "$adm is taken (admin listener); stop whatever listens there, or set MEMCGATE_ADMIN_ADDR=HOST:PORT" >&2; exit 1
fi

user=()
[ "$(id -u)" = 0 ] && user=(-u nobody)
servers=()
for p in "${ports[@]}"; do
  memcached -l 127.0.0.1 -p "$p" -U 0 -m 64 "${user[@]}" &
  pids+=($!)
  started+=("memcached:$p")
  servers+=("127.0.0.1:$p")
done
# Wait for each memcached to accept connections: one that did not start
# (its port taken meanwhile, a bad flag) stops the run here, not later as a
# node the gateway marks down.
for i in "${!ports[@]}"; do
  for _ in $(seq 50); do
    open "127.0.0.1:${ports[$i]}" && break
    kill -0 "${pids[$i]}" 2>/dev/null || break
    sleep 0.1
  done
  open "127.0.0.1:${ports[$i]}" || { echo "memcached on port ${ports[$i]} did not start (see its message above)" >&2; exit 1; }
done

# The servers above; logs for a terminal; Ctrl-C stops at once (no load
# balancer to drain).
# (MEMCGATE_SERVERS is made from MEMCACHED_PORTS, so test/deploy reads no
# literal value here; TestLocalRun runs this script instead.)
[ -n "${MEMCGATE_SERVERS:-}" ] || MEMCGATE_SERVERS=$(IFS=,; echo "${servers[*]}")
export MEMCGATE_SERVERS
export MEMCGATE_LOG_FORMAT=${MEMCGATE_LOG_FORMAT:-text}
export MEMCGATE_DRAIN_DELAY=${MEMCGATE_DRAIN_DELAY:-0s}
"$bin" &
gw=$!
pids+=("$gw")
started+=(memcgate)
# Print the examples only once the gateway accepts connections; if it
# exits first (a bad variable, a port taken meanwhile), its own message
# says why and the run ends with its status.
until open "$data"; do
  if ! kill -0 "$gw" 2>/dev/null; then
    rc=0; wait "$gw" || rc=$?
    exit $((rc == 0 ? 1 : rc))
  fi
  sleep 0.1
done
cat <<TXT
memcached: ${ports[*]} on 127.0.0.1
memcgate:  data http://$data   admin http://$adm
TXT
if [ ${#given[@]} -gt 0 ]; then
  echo "           with ${given[*]} from the environment"
  if [[ " ${given[*]} " == *" MEMCGATE_SERVERS "* ]]; then
    echo "           (MEMCGATE_SERVERS=$MEMCGATE_SERVERS: not the memcached above)"
  fi
fi
cat <<TXT

Try, from another shell:
  curl -i -X PUT --data-binary 'hello' '$data/greeting?exptime=300'
  curl -i $data/greeting
  curl -I $data/greeting
  curl -i -X PUT --data-binary @/etc/os-release $data/a/b && curl -s $data/a/b | cmp - /etc/os-release && echo identical
  curl -i -X PUT -H 'If-None-Match: *' --data-binary 'first' $data/once    # 201; add: 412 the second time
  curl -i -X PUT --data-binary 10 $data/counter && curl -i -X POST '$data/counter?op=incr&delta=5'
  curl -i -X POST --data-binary '!' '$data/greeting?op=append'
  curl -i -X DELETE $data/greeting
  curl -s $adm/debug/nodes ; curl -s '$adm/debug/owners?key=greeting'
  curl -s $adm/metrics | grep ^memcgate_
Ctrl-C stops memcgate and the memcached servers.
TXT
wait "$gw"
