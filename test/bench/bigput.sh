#!/usr/bin/env bash
# bigput.sh: many clients PUT (or GET) one large value at once through a
# memcgate that shares one CPU with memcached (docs/benchmarks.md, "Large
# PUTs").
#
#   test/bench/bigput.sh BINARY SIZE [REQUESTS] [CLIENTS] [PUT|GET]
#
# memcached (-t 1 -I 2m) and the gateway (GOMAXPROCS=1) run on CPU 0, ab
# on CPU 1. Prints one line: the binary, the size, the requests answered
# 2xx, memcached's cmd_set (cmd_get for GET), ab's requests per second,
# the gateway's CPU per request (utime+stime from /proc), its peak RSS,
# and the nodes ejected.
set -euo pipefail

bin=$1 size=$2 n=${3:-1500} c=${4:-64} method=${5:-PUT}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mport=$(free_port) gport=$(free_port) aport=$(free_port)

memc_stat() { # memc_stat NAME: one of memcached's stats
  exec 3<>"/dev/tcp/127.0.0.1/$mport"
  printf 'stats\r\nquit\r\n' >&3
  awk -v k="$1" '$2 == k { sub("\r", "", $3); print $3 }' <&3
  exec 3>&-
}

user=()
[ "$(id -u)" = 0 ] && user=(-u nobody)
taskset -c 0 memcached "${user[@]}" -l 127.0.0.1 -p "$mport" -U 0 -m 1024 -I 2m -c 4096 -t 1 &
pids+=($!)
taskset -c 0 env GOMAXPROCS=1 MEMCGATE_SERVERS="127.0.0.1:$mport" \
  MEMCGATE_LISTEN_ADDR="127.0.0.1:$gport" MEMCGATE_ADMIN_ADDR="127.0.0.1:$aport" \
  MEMCGATE_MAX_VALUE_BYTES=1048576 MEMCGATE_ACCESS_LOG=false MEMCGATE_DRAIN_DELAY=0s \
  "$bin" 2>"$work/gate.log" &
gpid=$!
pids+=($gpid)
for _ in $(seq 100); do
  curl -fs -o /dev/null -X PUT --data-binary x "http://127.0.0.1:$gport/warm" && break
  sleep 0.05
done

head -c "$size" /dev/urandom >"$work/value"
cpu() { awk '{ print $14 + $15 }' "/proc/$gpid/stat"; }
stat=cmd_set load=(-u "$work/value" -T application/octet-stream)
if [ "$method" = GET ]; then
  curl -fs -o /dev/null -X PUT --data-binary @"$work/value" "http://127.0.0.1:$gport/k"
  stat=cmd_get load=()
fi
sets0=$(memc_stat $stat) cpu0=$(cpu)
taskset -c 1 ab -k -q -r -s 10 -c "$c" -n "$n" "${load[@]}" \
  "http://127.0.0.1:$gport/k" >"$work/ab.out" 2>&1 || true
cpu1=$(cpu) sets1=$(memc_stat $stat)
hwm=$(awk '/VmHWM/ { print int($2 / 1024) }' "/proc/$gpid/status")

complete=$(awk '/^Complete requests:/ { print $3 }' "$work/ab.out")
# ab counts a response of another length than the first as failed
# (Length): only its connect, receive and exception failures are.
failed=$(sed -n 's/.*(Connect: \([0-9]*\), Receive: \([0-9]*\), Length: [0-9]*, Exceptions: \([0-9]*\)).*/\1 \2 \3/p' "$work/ab.out" |
  awk '{ print $1 + $2 + $3 }')
non2xx=$(awk '/^Non-2xx responses:/ { print $3 }' "$work/ab.out")
rps=$(awk '/^Requests per second:/ { print $4 }' "$work/ab.out")
ok=$((${complete:-0} - ${failed:-0} - ${non2xx:-0}))
hz=$(getconf CLK_TCK)
cpu_us=$(awk -v d=$((cpu1 - cpu0)) -v hz="$hz" -v n="${complete:-0}" 'BEGIN { if (n > 0) printf "%.0f", d * 1e6 / hz / n; else print "-" }')
ejected=$(grep -c 'node down' "$work/gate.log" || true)
echo "$(basename "$bin") $method size=$size n=$n c=$c ok_2xx=$ok memcached_${stat#cmd_}s=$((sets1 - sets0)) rps=${rps:-0} cpu_us_per_req=$cpu_us peak_rss_mib=$hwm ejections=$ejected"
grep -m1 'node down' "$work/gate.log" | cut -c1-300 || true
