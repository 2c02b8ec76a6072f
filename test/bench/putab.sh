#!/usr/bin/env bash
# putab.sh: side-by-side big PUTs of memcgate builds and the copying
# floor (benchtool proxy), pinned as `make bench` pins, for an A/B of a
# change to the big-value write path (docs/benchmarks.md, "Big PUTs
# side by side").
#
#   test/bench/putab.sh SIZE CLIENTS ROUNDS SECONDS BINARY...
#
# memcached (-t 1 -m 1024 -I 2m), each BINARY (GOMAXPROCS=1, defaults
# otherwise) and benchtool proxy run on CPU 0, wrk (bench.lua's put of
# one SIZE-byte value to 50 preloaded keys) on CPU 1. Each round runs
# every target once, after a 1 s warm-up, in an order that rotates from
# round to round. With PUTAB_PERF=1 each run is also counted by perf stat
# (system calls by name, context switches) over the target's process.
# One line per run on stdout; the medians of each target and of the
# per-round ratios of each BINARY to the first on stderr at the end.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
size=$1 conc=$2 rounds=$3 secs=$4
shift 4
bins=("$@")
[ ${#bins[@]} -ge 1 ] || { echo "usage: $0 SIZE CLIENTS ROUNDS SECONDS BINARY..." >&2; exit 2; }
. "$here/lib.sh"
ulimit -n 65536 2>/dev/null || true
taskset -pc 1 $$ >/dev/null

go build -o "$work/benchtool" "$here/cmd/benchtool"
bt=$work/benchtool
memc_port=$(free_port)
user=()
[ "$(id -u)" = 0 ] && user=(-u nobody)
taskset -c 0 memcached "${user[@]}" -l 127.0.0.1 -p "$memc_port" -U 0 -m 1024 -I 2m -c 4096 -t 1 -b 4096 &
memc_pid=$!
pids+=("$memc_pid")
wait_port "$memc_port" "$memc_pid" memcached
"$bt" preload -addr "127.0.0.1:$memc_port" -n 50 -keylen 96 -vallen "$size" \
  -keys "$work/keys.txt" -value "$work/value.txt" >&2

declare -A pid url
names=()
i=0
for b in "${bins[@]}"; do
  n="$i:$(basename "$b")" i=$((i + 1))
  cp "$b" "$work/bin$i"
  gport=$(free_port) aport=$(free_port)
  taskset -c 0 env GOMAXPROCS=1 MEMCGATE_SERVERS="127.0.0.1:$memc_port" \
    MEMCGATE_LISTEN_ADDR="127.0.0.1:$gport" MEMCGATE_ADMIN_ADDR="127.0.0.1:$aport" \
    MEMCGATE_ACCESS_LOG=false MEMCGATE_DRAIN_DELAY=0s MEMCGATE_LOG_LEVEL=warn \
    "$work/bin$i" >"$work/gate$i.log" 2>&1 &
  pid[$n]=$! url[$n]="http://127.0.0.1:$gport/"
  pids+=($!)
  wait_port "$gport" "${pid[$n]}" "$n"
  names+=("$n")
done
pport=$(free_port)
taskset -c 0 env GOMAXPROCS=1 "$bt" proxy -listen "127.0.0.1:$pport" -memc "127.0.0.1:$memc_port" >"$work/proxy.log" 2>&1 &
pid[copy-proxy]=$! url[copy-proxy]="http://127.0.0.1:$pport/"
pids+=($!)
wait_port "$pport" "${pid[copy-proxy]}" "benchtool proxy"
names+=(copy-proxy)

key0=$(head -1 "$work/keys.txt")
for n in "${names[@]}"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Expect:' --data-binary "@$work/value.txt" "${url[$n]}$key0")
  [ "$code" = 201 ] || die "$n: PUT answered $code"
done

cpu_of() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
wrk_put() { # url seconds
  BENCH_LUA_BODIES=0 taskset -c 1 wrk -t 1 -c "$conc" -d "${2}s" --timeout 5s -s "$here/bench.lua" "$1" \
    -- put "$work/keys.txt" "$work/value.txt" /
}
# Unmeasured: every target's buffers and connections warmed up first.
for n in "${names[@]}"; do run_bg /dev/null wrk_put "${url[$n]}" 3; done
hz=$(getconf CLK_TCK)
out=$work/runs.txt
: >"$out"
for ((r = 0; r < rounds; r++)); do
  k=${#names[@]}
  for ((j = 0; j < k; j++)); do
    n=${names[$(((j + r) % k))]}
    run_bg /dev/null wrk_put "${url[$n]}" 1
    g0=$(cpu_of "${pid[$n]}") m0=$(cpu_of "$memc_pid")
    if [ "${PUTAB_PERF:-0}" = 1 ]; then
      perf stat -x, -e 'syscalls:sys_enter_*,context-switches' -p "${pid[$n]}" -o "$work/perf.out" &
      pp=$!
      pids+=("$pp")
      perf stat -x, -e 'syscalls:sys_enter_*,context-switches' -p "$memc_pid" -o "$work/perfm.out" &
      pm=$!
      pids+=("$pm")
    fi
    if [ -n "${PUTAB_RECORD:-}" ]; then # a profile of the target and memcached, into PUTAB_RECORD/
      mkdir -p "$PUTAB_RECORD"
      perf record -q ${PUTAB_RECORD_G:+-g} -e cpu-clock -F 4999 -p "${pid[$n]},$memc_pid" -o "$PUTAB_RECORD/r$r-${n//[:\/]/_}.data" 2>/dev/null &
      pr=$!
      pids+=("$pr")
    fi
    run_bg "$work/wrk.out" wrk_put "${url[$n]}" "$secs"
    if [ -n "${PUTAB_RECORD:-}" ]; then
      kill -INT "$pr"
      wait "$pr" || true
      unset 'pids[-1]'
    fi
    g1=$(cpu_of "${pid[$n]}") m1=$(cpu_of "$memc_pid")
    sc=
    if [ "${PUTAB_PERF:-0}" = 1 ]; then
      kill -INT "$pp" "$pm"
      wait "$pp" "$pm" || true
      unset 'pids[-1]' 'pids[-1]'
    fi
    b=$(grep '^BENCH ' "$work/wrk.out" | sed 's/^BENCH //')
    req=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$b")
    bad=$(sed 's/.*non2xx=\([0-9]*\).*/\1/' <<<"$b")
    ok=$((req - bad))
    if [ "${PUTAB_PERF:-0}" = 1 ]; then # per stored value, the calls made more than 0.05 times a value
      sc=$(awk -F, -v ok="$ok" '$1 ~ /^[0-9]+$/ && ok > 0 && $1 / ok >= 0.05 {
        sub("syscalls:sys_enter_", "", $3); printf " %s=%.2f", $3, $1 / ok }' "$work/perf.out")
      sc+=$(awk -F, -v ok="$ok" '$1 ~ /^[0-9]+$/ && ok > 0 && $1 / ok >= 0.05 {
        sub("syscalls:sys_enter_", "", $3); printf " m_%s=%.2f", $3, $1 / ok }' "$work/perfm.out")
    fi
    line=$(awk -v r="$r" -v n="$n" -v b="$b" -v ok="$ok" -v hz="$hz" -v g=$((g1 - g0)) -v m=$((m1 - m0)) -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
      split(b, f, " "); for (i in f) { split(f[i], kv, "="); v[kv[1]] = kv[2] }
      printf "round=%d target=%s stored_s=%.0f p99_ms=%.1f non2xx=%d gw_us=%.0f memc_us=%.0f load=%s", r, n,
        ok / (v["duration_us"] / 1e6), v["p99_us"] / 1000, v["non2xx"], (ok ? g * 1e6 / hz / ok : 0), (ok ? m * 1e6 / hz / ok : 0), l }')
    echo "$line$sc" | tee -a "$out"
  done
done

# Medians per target, and of each binary's per-round ratios to the first.
awk -v first="${names[0]}" '
function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
{ delete v; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  t = v["target"]; r = v["round"]; if (!(t in seen)) order[++nt] = t; seen[t] = 1; nr = r + 1 > nr ? r + 1 : nr
  for (k in v) if (k != "target" && k != "round" && k != "load") { val[t, r, k] = v[k]; if (!(k in keys)) klist[++nk] = k; keys[k] = 1 } }
END {
  for (i = 2; i <= nk; i++) for (j = i; j > 1 && klist[j-1] > klist[j]; j--) { x = klist[j]; klist[j] = klist[j-1]; klist[j-1] = x }
  m = split("stored_s p99_ms non2xx gw_us memc_us", head, " "); nl = 0
  for (i = 1; i <= m; i++) if (head[i] in keys) { list[++nl] = head[i]; done[head[i]] = 1 }
  for (i = 1; i <= nk; i++) if (!(klist[i] in done)) list[++nl] = klist[i]
  for (o = 1; o <= nt; o++) {
    t = order[o]; line = t
    for (q = 1; q <= nl; q++) { k = list[q]; n = 0; for (r = 0; r < nr; r++) if ((t, r, k) in val) a[++n] = val[t, r, k]; if (n) line = line sprintf(" %s=%.4g", k, med(a, n)) }
    print "median " line
  }
  for (o = 1; o <= nt; o++) {
    t = order[o]; if (t == first) continue
    line = t "/" first
    for (q = 1; q <= nl; q++) { k = list[q]; n = 0; for (r = 0; r < nr; r++) if ((t, r, k) in val && (first, r, k) in val && val[first, r, k] > 0) a[++n] = val[t, r, k] / val[first, r, k]
      if (n) line = line sprintf(" %s=%.3f", k, med(a, n)) }
    print "ratio " line
  } }' "$out" >&2
