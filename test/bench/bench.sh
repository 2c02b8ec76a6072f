#!/usr/bin/env bash
# bench.sh: memcgate against nginx + HttpMemcModule (memc-nginx-module),
# both in front of the same memcached, on loopback; for GET also two
# floors: nginx answering a constant body (nginx-const) and memcgate's own
# HTTP server answering one (h1-const, test/bench/cmd/h1const). What `make bench` runs
# (after `make build`). docs/benchmarks.md explains the method and holds
# the last full run.
#
# Settings (environment):
#   BENCH_QUICK=1            ~1-minute smoke run (1s runs, 1 repeat, 64 and 2048 clients)
#   BENCH_DURATION=5         seconds per measured wrk run
#   BENCH_WARMUP=1           seconds of unmeasured wrk load before every run
#   BENCH_REPS=3             repeats per (workload, clients, target), interleaved A B A B
#   BENCH_CONCURRENCY="64 256 1024 2048"
#   BENCH_WORKLOADS="get put mix"   (empty: none of them)
#   BENCH_BIG=0              1: also the big-value points (GET and PUT of 100 KB and
#                            1 MB values, memcgate and nginx + memc, and for PUT the
#                            floor of a copying gateway, benchtool proxy; about 8
#                            minutes more); only: just those (no small-value wrk
#                            runs, no ab)
#   BENCH_BIG_WORKLOADS="get-100k put-100k get-1m put-1m"
#   BENCH_BIG_CONCURRENCY="64 256"
#   BENCH_AB_N=50000 BENCH_AB_REPS=3   the ab runs (BENCH_AB_N=0 skips them): with
#                            keep-alive (-k), then a new connection per request
#   BENCH_AB_NEWCONN=1       the new-connection ab runs (0 skips them)
#   BENCH_SERVER_CPUS=0      CPUs of memcgate and nginx (GOMAXPROCS and worker_processes follow)
#   BENCH_MEMCACHED_CPUS=0   CPUs of memcached (default: shares the servers' CPUs)
#   BENCH_LOAD_CPUS=1        CPUs of wrk, ab and this script's helpers
#   BENCH_NGINX_KEEPALIVE=1024  idle upstream connections nginx keeps (per worker)
#   BENCH_ACCESS_LOG=1       access logs on for both, each to a file (memcgate's
#                            default JSON lines; nginx's combined format with
#                            buffer=64k flush=200ms), truncated before every run;
#                            the results then go to no document unless BENCH_DOC says
#   BENCH_DOC=docs/benchmarks.md  where the results go (default: none for BENCH_QUICK)
#   BENCH_MAX_FOREIGN=10     a run is repeated (up to BENCH_RETRIES=3 times; the least
#                            disturbed attempt is kept) when other
#                            processes took more than this % of a CPU on either side,
#                            after waiting up to BENCH_QUIET_TIMEOUT=300 s for a quiet machine
#   BENCH_PERF=1             after the runs, system calls and context switches per
#                            request of each target, with perf stat in wrk runs of
#                            their own: get at the first and last client count, and
#                            the put-* big points at the last big client count
#                            (0 skips them)
#   BENCH_KEEP=1             keep the scratch directory (logs, raw results)
#   BENCH_PORTS=45000-45999  pick the servers' loopback ports in this range
#                            (default: free ports in 20000-31999)
#   BENCH_RAW=DIR            copy the raw results (runs.txt, ab.txt, section.md) there
# Raw results stay in the scratch directory: runs.txt (one line per wrk
# run), ab.txt, and the logs of every server.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
  d_dur=1 d_warm=1 d_reps=1 d_conc="64 2048" d_abn=5000 d_abreps=1 d_doc=
else
  d_dur=5 d_warm=1 d_reps=3 d_conc="64 256 1024 2048" d_abn=50000 d_abreps=3 d_doc=docs/benchmarks.md
fi
duration=${BENCH_DURATION:-$d_dur}
warmup=${BENCH_WARMUP:-$d_warm}
reps=${BENCH_REPS:-$d_reps}
concs=${BENCH_CONCURRENCY:-$d_conc}
workloads=${BENCH_WORKLOADS-get put mix}
ab_n=${BENCH_AB_N:-$d_abn}
big=${BENCH_BIG:-0}
big_workloads=${BENCH_BIG_WORKLOADS:-get-100k put-100k get-1m put-1m}
big_concs=${BENCH_BIG_CONCURRENCY:-64 256}
case $big in
0) big_workloads= ;;
1) ;;
only) workloads= ab_n=0 ;;
*) echo "BENCH_BIG is 0, 1 or only, not $big" >&2; exit 2 ;;
esac
ab_reps=${BENCH_AB_REPS:-$d_abreps}
ab_newconn=${BENCH_AB_NEWCONN:-1}
use_perf=${BENCH_PERF:-1}
server_cpus=${BENCH_SERVER_CPUS:-0}
memc_cpus=${BENCH_MEMCACHED_CPUS:-$server_cpus}
load_cpus=${BENCH_LOAD_CPUS:-1}
nginx_keepalive=${BENCH_NGINX_KEEPALIVE:-1024}
access_log=${BENCH_ACCESS_LOG:-0}
[ "$access_log" = 1 ] && d_doc= # the main table compares without access logs
doc=${BENCH_DOC-$d_doc}
wrk_timeout=${BENCH_WRK_TIMEOUT:-5s}
max_foreign=${BENCH_MAX_FOREIGN:-10}
retries=${BENCH_RETRIES:-3}
quiet_timeout=${BENCH_QUIET_TIMEOUT:-300}
nkeys=10000 keylen=96 vallen=400
# The big-value sets: value bytes and keys per size, about 50 MB each in
# memcached (-m 1024 leaves room for PUTs replacing them), wrk's request
# strings included.
declare -A big_bytes=([100k]=100000 [1m]=1000000) big_keys=([100k]=500 [1m]=50)
for wl in $big_workloads; do
  [[ $wl =~ ^(get|put)-(100k|1m)$ ]] || { echo "unknown big workload $wl (get-100k put-100k get-1m put-1m)" >&2; exit 2; }
done
[ -n "$workloads$big_workloads" ] || { echo "no workloads to run" >&2; exit 2; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# log, die, install_missing, $work and its trap, free_port, wait_port, run_bg
. "$here/lib.sh"

# ---------------------------------------------------------------- packages
install_missing memcached:memcached nginx:nginx libnginx-mod-http-memc:/usr/lib/nginx/modules/ngx_http_memc_module.so \
  wrk:wrk apache2-utils:ab curl:curl util-linux:taskset procps:pgrep linux-perf:perf
command -v go >/dev/null 2>&1 || die "go is required (to build bin/memcgate and the bench helper)"
[ -x bin/memcgate ] || die "bin/memcgate is missing; run 'make bench' (it builds it) or 'make build'"
if [ "$use_perf" = 1 ] && ! command -v perf >/dev/null 2>&1; then
  log "no perf (Debian: linux-perf): system calls per request are not counted"
  use_perf=0
fi

ncpu=$(nproc --all)
cpu_count() { local n=0 part; IFS=, read -ra parts <<<"$1"; for part in "${parts[@]}"; do
  if [[ $part == *-* ]]; then n=$((n + ${part#*-} - ${part%-*} + 1)); else n=$((n + 1)); fi; done; echo $n; }
if [ "$ncpu" -lt 2 ]; then
  log "only $ncpu CPU: servers and load generator share it; ratios still compare, absolute numbers do not"
  server_cpus=0 memc_cpus=0 load_cpus=0
fi
server_n=$(cpu_count "$server_cpus")

# Everything this shell runs from here on (curl, the sampler, wrk, ab)
# stays on the load generator's CPUs; servers get theirs explicitly.
taskset -pc "$load_cpus" $$ >/dev/null

# Raise the descriptor limit for 2048 clients plus upstream connections.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge 8192 ] || die "ulimit -n is $(ulimit -n); need at least 8192 for 2048 clients"

# ---------------------------------------------------------------- build helper
log "building the bench helpers"
go build -o "$work/benchtool" ./test/bench/cmd/benchtool
go build -o "$work/h1const" ./test/bench/cmd/h1const
bt=$work/benchtool

# Our own copy: others may rebuild bin/memcgate while the benchmark runs.
cp bin/memcgate "$work/memcgate"
gate_build=$(go version -m "$work/memcgate" | awk '$2 == "vcs.revision" { r = substr($3, 1, 7) } $2 == "vcs.modified" && $3 == "true" { m = "+uncommitted changes" } END { if (r) print r m }')
if [ -z "$gate_build" ]; then
  gate_build="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  [ -n "$(git status --porcelain -- '*.go' go.mod go.sum 2>/dev/null)" ] && gate_build+="+uncommitted changes"
fi
gate_build+=" (binary sha256 $(sha256sum "$work/memcgate" | cut -c1-12))"

# ---------------------------------------------------------------- memcached
memc_port=$(free_port)
memc_user=()
[ "$(id -u)" = 0 ] && memc_user=(-u nobody)
# -I 2m: items of 1 MB values (the default largest item is 1 MiB in all,
# key and header included).
taskset -c "$memc_cpus" memcached -l 127.0.0.1 -p "$memc_port" -U 0 -m 1024 -I 2m -c 4096 -t 1 -b 4096 \
  "${memc_user[@]}" >"$work/memcached.log" 2>&1 &
memc_pid=$!
pids+=("$memc_pid")
wait_port "$memc_port" "$memc_pid" memcached
"$bt" preload -addr "127.0.0.1:$memc_port" -n $nkeys -keylen $keylen -vallen $vallen \
  -keys "$work/keys.txt" -value "$work/value.txt" >&2
key0=$(head -1 "$work/keys.txt")
big_sizes=$(for wl in $big_workloads; do echo "${wl#*-}"; done | sort -u | paste -sd' ' -)
for sz in $big_sizes; do
  "$bt" preload -addr "127.0.0.1:$memc_port" -n "${big_keys[$sz]}" -keylen $keylen -vallen "${big_bytes[$sz]}" \
    -keys "$work/keys-$sz.txt" -value "$work/value-$sz.txt" >&2
done

# ---------------------------------------------------------------- nginx
nginx_port=$(free_port)
mkdir -p "$work/nginx/tmp"
nginx_access=off gate_access=false gate_level=warn
if [ "$access_log" = 1 ]; then
  nginx_access="$work/nginx/access.log combined buffer=64k flush=200ms" gate_access=true gate_level=info
fi
sed -e "s|@PREFIX@|$work/nginx|g" -e "s|@HTTP_PORT@|$nginx_port|g" -e "s|@MEMC_PORT@|$memc_port|g" \
  -e "s|@WORKERS@|$server_n|g" -e "s|@WORKER_CONNECTIONS@|16384|g" -e "s|@NOFILE@|$(ulimit -n)|g" \
  -e "s|@KEEPALIVE@|$nginx_keepalive|g" -e "s|@KEEPALIVE_REQUESTS@|1000000|g" -e "s|@BACKLOG@|4096|g" \
  -e "s|@ACCESS_LOG@|$nginx_access|g" -e "s|@CONST_BODY@|$(head -c $vallen "$work/value.txt")|g" \
  "$here/nginx.conf.in" >"$work/nginx/nginx.conf"
nginx -t -q -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" ||
  die "nginx -t failed (see $work/nginx/error.log)"
taskset -c "$server_cpus" nginx -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" \
  >"$work/nginx/stdout.log" 2>&1 &
nginx_pid=$!
pids+=("$nginx_pid")
wait_port "$nginx_port" "$nginx_pid" nginx
for _ in $(seq 50); do
  nginx_workers=$(pgrep -P "$nginx_pid" | paste -sd, -)
  [ "$(tr ',' '\n' <<<"$nginx_workers" | grep -c .)" -ge "$server_n" ] && break
  sleep 0.05
done
[ -n "$nginx_workers" ] || die "no nginx workers"
IFS=, read -ra wlist <<<"$nginx_workers"
pids+=("${wlist[@]}") # so that cleanup reaps them even if the master dies first

# ---------------------------------------------------------------- memcgate
gate_port=$(free_port)
admin_port=$(free_port)
taskset -c "$server_cpus" env GOMAXPROCS="$server_n" \
  MEMCGATE_SERVERS="127.0.0.1:$memc_port" MEMCGATE_ACCESS_LOG=$gate_access \
  MEMCGATE_LISTEN_ADDR="127.0.0.1:$gate_port" MEMCGATE_ADMIN_ADDR="127.0.0.1:$admin_port" \
  MEMCGATE_DRAIN_DELAY=0s MEMCGATE_LOG_LEVEL=$gate_level \
  "$work/memcgate" >>"$work/memcgate.log" 2>&1 & # appending, so that truncate works
gate_pid=$!
pids+=("$gate_pid")
wait_port "$gate_port" "$gate_pid" memcgate
for _ in $(seq 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$admin_port/readyz" && break
  sleep 0.05
done
curl -sf -o /dev/null "http://127.0.0.1:$admin_port/readyz" || die "memcgate never became ready"

declare -A url tpids rpids
url[memcgate]="http://127.0.0.1:$gate_port/"
url[nginx]="http://127.0.0.1:$nginx_port/key/"
tpids[memcgate]=$gate_pid rpids[memcgate]=$gate_pid
tpids[nginx]="$nginx_pid,$nginx_workers" rpids[nginx]=$nginx_workers
targets=(memcgate nginx)
# The floor of an HTTP hop: nginx answering a constant body as long as a
# value, no memcached. GET only, in the get workload and the ab runs.
floor=nginx-const
url[$floor]="http://127.0.0.1:$nginx_port/const/"
tpids[$floor]=${tpids[nginx]} rpids[$floor]=${rpids[nginx]}
# The floor of Go and memcgate's own HTTP server: gateway/h1 set up as
# memcgate sets it up (listener, accept path, timeouts, connection cap),
# pinned as memcgate is, answering a constant body as long as a value
# with no memcached and no routing. GET only, in the get workload.
hfloor=h1-const
head -c $vallen "$work/value.txt" >"$work/const.txt"
hfloor_port=$(free_port)
taskset -c "$server_cpus" env GOMAXPROCS="$server_n" "$work/h1const" -listen "127.0.0.1:$hfloor_port" \
  -body "$work/const.txt" >"$work/h1const.log" 2>&1 &
hfloor_pid=$!
pids+=("$hfloor_pid")
wait_port "$hfloor_port" "$hfloor_pid" h1const
url[$hfloor]="http://127.0.0.1:$hfloor_port/"
tpids[$hfloor]=$hfloor_pid rpids[$hfloor]=$hfloor_pid
# The floor of a big-value PUT: benchtool's proxy, the least a gateway that
# copies a value does (a memcached connection per client connection, the
# body read whole into a reused buffer and written at once, no bounds, no
# checks). PUT only, in the big put workloads.
pfloor=copy-proxy
if [[ " $big_workloads " == *" put-"* ]]; then
  pfloor_port=$(free_port)
  taskset -c "$server_cpus" env GOMAXPROCS="$server_n" "$bt" proxy -listen "127.0.0.1:$pfloor_port" \
    -memc "127.0.0.1:$memc_port" >"$work/proxy.log" 2>&1 &
  pfloor_pid=$!
  pids+=("$pfloor_pid")
  wait_port "$pfloor_port" "$pfloor_pid" "benchtool proxy"
  url[$pfloor]="http://127.0.0.1:$pfloor_port/"
  tpids[$pfloor]=$pfloor_pid rpids[$pfloor]=$pfloor_pid
fi

# ---------------------------------------------------------------- sanity
for t in "${targets[@]}"; do
  code=$(curl -s -o "$work/check.$t" -w '%{http_code}' "${url[$t]}$key0")
  [ "$code" = 200 ] && [ "$(wc -c <"$work/check.$t")" = $vallen ] || die "$t: GET of a preloaded key: $code"
done
cmp -s "$work/check.memcgate" "$work/check.nginx" || die "memcgate and nginx return different values for one key"
for t in "$floor" "$hfloor"; do
  curl -s "${url[$t]}$key0" | cmp -s - "$work/const.txt" || die "$t: GET does not answer the constant body"
done
for t in "${targets[@]}"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Expect:' --data-binary "@$work/value.txt" "${url[$t]}$key0")
  [ "$code" = 201 ] || die "$t: PUT answered $code, want 201"
  curl -s "${url[$t]}$key0" | cmp -s - "$work/value.txt" || die "$t: GET after PUT differs"
done
for sz in $big_sizes; do
  bkey=$(head -1 "$work/keys-$sz.txt")
  for t in "${targets[@]}"; do
    curl -s "${url[$t]}$bkey" | cmp -s - <(curl -s "${url[memcgate]}$bkey") || die "$t: GET of a $sz value differs from memcgate's"
    code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Expect:' --data-binary "@$work/value-$sz.txt" "${url[$t]}$bkey")
    [ "$code" = 201 ] || die "$t: PUT of a $sz value answered $code, want 201"
    curl -s "${url[$t]}$bkey" | cmp -s - "$work/value-$sz.txt" || die "$t: GET after PUT of a $sz value differs"
  done
  if [ -n "${url[$pfloor]:-}" ]; then
    code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Expect:' --data-binary "@$work/value-$sz.txt" "${url[$pfloor]}$bkey")
    [ "$code" = 201 ] || die "$pfloor: PUT of a $sz value answered $code, want 201"
    curl -s "${url[memcgate]}$bkey" | cmp -s - "$work/value-$sz.txt" || die "$pfloor: GET after its PUT of a $sz value differs"
  fi
done
log "memcached 127.0.0.1:$memc_port (cpu $memc_cpus), nginx 127.0.0.1:$nginx_port (pid $nginx_pid, workers $nginx_workers, cpu $server_cpus), memcgate 127.0.0.1:$gate_port (pid $gate_pid, cpu $server_cpus), h1const 127.0.0.1:$hfloor_port (pid $hfloor_pid), load on cpu $load_cpus"
base_conns=$("$bt" sample -memc "127.0.0.1:$memc_port" -target "$memc_pid" -memcached "$memc_pid" </dev/null & sp=$!; sleep 0.3; kill -TERM $sp; wait $sp)
base_conns=$(sed -n 's/.*conn_max=\([0-9]*\).*/\1/p' <<<"$base_conns")

# ---------------------------------------------------------------- wrk runs
prefix_of() { case $1 in nginx) echo /key/ ;; "$floor") echo /const/ ;; *) echo / ;; esac; }
# A big workload, get-1m, is bench.lua's get over keys-1m.txt; wrk then
# keeps the bodies out of Lua (BENCH_LUA_BODIES=0).
wrk_base() { # target workload conc seconds
  local base=${url[$1]%"$(prefix_of "$1")"} wl=$2 set= bodies=1
  if [[ $wl == *-* ]]; then set=-${wl#*-} wl=${wl%%-*} bodies=0; fi
  BENCH_LUA_BODIES=$bodies taskset -c "$load_cpus" wrk -t 1 -c "$3" -d "${4}s" --timeout "$wrk_timeout" -s "$here/bench.lua" "$base/" \
    -- "$wl" "$work/keys$set.txt" "$work/value$set.txt" "$(prefix_of "$1")"
}
value_bytes() { if [[ $1 == *-* ]]; then echo "${big_bytes[${1#*-}]}"; else echo $vallen; fi; }

# CPU seconds (user+sys) of this shell's waited-for children so far;
# `times` must run in this shell, not in a $(...) subshell.
children_cpu() {
  times >"$work/times.out"
  awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } print t }' "$work/times.out" >"$work/cpu.out"
}
alive() { # name pid...
  local n=$1 p
  shift
  for p in "$@"; do kill -0 "$p" 2>/dev/null || die "$n (pid $p) is gone; logs in $work"; done
}

# wait_quiet: while our servers are idle, wait (up to $quiet_timeout s)
# until the whole machine uses less than $max_foreign % of one CPU, so that
# a build or test run of someone else does not end up in the numbers.
busy_all() { awk '/^cpu / { print $2 + $3 + $4 }' /proc/stat; }
wait_quiet() {
  local waited=0 a b pct
  while :; do
    a=$(busy_all)
    sleep 1
    b=$(busy_all)
    pct=$(((b - a) * 100 / $(getconf CLK_TCK)))
    [ "$pct" -le "$max_foreign" ] && break
    [ $waited = 0 ] && log "machine busy (${pct}% of a CPU used by other processes); waiting up to ${quiet_timeout}s for it to calm down"
    waited=$((waited + 1))
    if [ $waited -ge "$quiet_timeout" ]; then
      log "still busy after ${quiet_timeout}s; going on (the run is marked)"
      return 1
    fi
  done
  [ $waited -gt 0 ] && log "quiet after ${waited}s"
  return 0
}

# measure TARGET WORKLOAD CONC REP ATTEMPT: one warm-up and one measured
# wrk run with the sampler around it; sets $line (the result record) and
# $interfered=1 when processes other than ours took more than
# $max_foreign % of a CPU on the servers' or the load generator's CPUs.
measure() {
  local t=$1 wl=$2 c=$3 rep=$4 attempt=$5 sp cpu0 cpu1 t0 t1 bench wcpu
  alive memcached "$memc_pid"
  alive nginx "$nginx_pid" "${wlist[@]}"
  alive memcgate "$gate_pid"
  alive h1const "$hfloor_pid"
  # Access logs grow by up to a GB a minute: keep only the current run's.
  [ "$access_log" = 1 ] && truncate -s 0 "$work/memcgate.log" "$work/nginx/access.log"
  [ "$warmup" -gt 0 ] && run_bg /dev/null wrk_base "$t" "$wl" "$c" "$warmup"
  rm -f "$work/ready"
  "$bt" sample -memc "127.0.0.1:$memc_port" -target "${tpids[$t]}" -rss "${rpids[$t]}" \
    -memcached "$memc_pid" -upstream-port "$memc_port" -server-cpus "$server_cpus,$memc_cpus" -load-cpus "$load_cpus" \
    -ready "$work/ready" >"$work/sample.out" 2>"$work/sample.err" &
  sp=$!
  pids+=("$sp")
  for _ in $(seq 100); do [ -e "$work/ready" ] && break; sleep 0.01; done
  children_cpu
  cpu0=$(<"$work/cpu.out") t0=$EPOCHREALTIME
  run_bg "$work/wrk.out" wrk_base "$t" "$wl" "$c" "$duration"
  t1=$EPOCHREALTIME
  children_cpu
  cpu1=$(<"$work/cpu.out")
  kill -TERM "$sp" 2>/dev/null || true
  wait "$sp" 2>/dev/null || true
  unset 'pids[-1]'
  bench=$(grep '^BENCH ' "$work/wrk.out" | sed 's/^BENCH //') || true
  [ -n "$bench" ] || { cat "$work/wrk.out" >&2; die "wrk gave no result for $t $wl $c"; }
  line="target=$t workload=$wl conc=$c rep=$rep attempt=$attempt value_bytes=$(value_bytes "$wl") $bench $(cat "$work/sample.out")"
  # wrk's CPU share, and what other processes took on either side.
  read -r wcpu srvf loadf < <(awk -v a="$cpu0" -v b="$cpu1" -v r0="$t0" -v r1="$t1" -v line="$line" 'BEGIN {
    m = split(line, f, " "); for (j = 1; j <= m; j++) { split(f[j], kv, "="); v[kv[1]] = kv[2] }
    wrk_us = (b - a) * 1e6; wall = v["wall_us"]
    wp = 0; sf = 0; lf = 0
    if (r1 > r0) wp = (b - a) / (r1 - r0) * 100
    if (wall > 0) { sf = v["srv_foreign_us"] / wall * 100; lf = (v["load_busy_us"] - wrk_us - v["sampler_cpu_us"]) / wall * 100 }
    if (lf < 0) lf = 0
    printf "%.1f %.1f %.1f\n", wp, sf, lf }')
  line+=" wrk_cpu_pct=$wcpu srv_foreign_pct=$srvf load_foreign_pct=$loadf"
  foreign=$(awk -v a="$srvf" -v b="$loadf" 'BEGIN { print (a > b) ? a : b }')
  interfered=$(awk -v f="$foreign" -v m="$max_foreign" 'BEGIN { print (f > m) ? 1 : 0 }')
}

runs=$work/runs.txt runs_big=$work/runs-big.txt ab_out=$work/ab.txt
: >"$runs"
: >"$runs_big"
: >"$ab_out"
# The plan: one "workload clients" pair a line, the small values at
# $concs, then the big ones at $big_concs (each in a file of its own).
plan=$(for wl in $workloads; do for c in $concs; do echo "$wl $c"; done; done
  for wl in $big_workloads; do for c in $big_concs; do echo "$wl $c"; done; done)
total=0 i=0
while read -r wl c; do
  total=$((total + reps * 2))
  [ "$wl" = get ] && total=$((total + reps * 2))
  [[ $wl == put-* ]] && total=$((total + reps))
done <<<"$plan"
wait_quiet || true
started=$(date +%s)
eta=$(((warmup + duration + 1) * total))
log "$total wrk runs of ${duration}s (+${warmup}s warm-up), about $((eta / 60)) min$([ "$ab_n" -gt 0 ] && echo ', then ab')"
while read -r wl c <&3; do
  wl_targets=("${targets[@]}")
  [ "$wl" = get ] && wl_targets+=("$floor" "$hfloor")
  [[ $wl == put-* ]] && wl_targets+=("$pfloor")
  out=$runs
  [[ $wl == *-* ]] && out=$runs_big
  for rep in $(seq "$reps"); do
    for t in "${wl_targets[@]}"; do
      i=$((i + 1))
      best= best_foreign=
      for attempt in $(seq $((retries + 1))); do
        measure "$t" "$wl" "$c" "$rep" "$attempt"
        if [ -z "$best" ] || awk -v a="$foreign" -v b="$best_foreign" 'BEGIN { exit !(a < b) }'; then
          best=$line best_foreign=$foreign
        fi
        [ "$interfered" = 0 ] && break
        [ "$attempt" -gt "$retries" ] && break
        log "run $i: other processes used ${foreign}% of a CPU; repeating it"
        wait_quiet || true
      done
      line="$best attempts=$attempt"
      echo "$line" >>"$out"
      awk -v i="$i" -v n="$total" -v line="$line" 'BEGIN {
        m = split(line, f, " "); for (j = 1; j <= m; j++) { split(f[j], kv, "="); v[kv[1]] = kv[2] }
        mbs = (v["requests"] - v["non2xx"]) * v["value_bytes"] / v["duration_us"]
        printf "[%d/%d] %-8s c=%-4d %-8s rep %d: %6.0f req/s %7.1f MB/s  p99 %7.2f ms  err %d non2xx %d  cpu %5.1f us/req  memc %4.1f us/req  rss %5.1f MB  own conns %d  wrk %s%%  foreign %s/%s%%\n",
          i, n, v["workload"], v["conc"], v["target"], v["rep"], v["rps"], mbs, v["p99_us"] / 1000, v["sock_err"], v["non2xx"],
          v["target_cpu_us"] / v["requests"], v["memc_cpu_us"] / v["requests"], v["rss_max_kb"] / 1024, v["own_max"], v["wrk_cpu_pct"],
          v["srv_foreign_pct"], v["load_foreign_pct"] }' >&2
    done
  done
done 3<<<"$plan"

# ---------------------------------------------------------------- ab runs
# GET of one key with keep-alive (-k, the seed's style), then with a new
# connection per request (how a PHP page calls), each with the floor;
# the gateway's CPU per request is read from /proc around each run.
ab_field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$2"; }
if [ "$ab_n" -gt 0 ]; then
  modes=ka
  [ "$ab_newconn" = 1 ] && modes+=" new"
  log "ab -n $ab_n, $ab_reps run(s) per point: $modes"
  wait_quiet || true
  for mode in $modes; do
    kflag=(-k) tool=ab
    [ "$mode" = new ] && kflag=() tool=ab-new
    for c in $concs; do
      n=$ab_n
      [ "$n" -lt $((c * 4)) ] && n=$((c * 4))
      for rep in $(seq "$ab_reps"); do
        for t in "${targets[@]}" "$floor"; do
          cnt0=$("$bt" counters -pids "${tpids[$t]}")
          run_bg "$work/ab.out" taskset -c "$load_cpus" ab "${kflag[@]}" -r -q -s 10 -c "$c" -n "$n" "${url[$t]}$key0"
          cnt1=$("$bt" counters -pids "${tpids[$t]}")
          awk -v tool="$tool" -v t="$t" -v c="$c" -v rep="$rep" \
            -v cpu="$(($(ab_field cpu_us "$cnt1") - $(ab_field cpu_us "$cnt0")))" -v cs="$(($(ab_field cs "$cnt1") - $(ab_field cs "$cnt0")))" '
            /^Complete requests:/ { complete = $3 }
            /^Failed requests:/ { failed = $3 }
            /^Non-2xx responses:/ { non2xx = $3 }
            /^Keep-Alive requests:/ { ka = $3 }
            /^Requests per second:/ { rps = $4 }
            /^  50%/ { p50 = $2 }
            /^  99%/ { p99 = $2 }
            END { if (rps == "") exit 1
                  printf "tool=%s target=%s conc=%d rep=%d complete=%d requests=%d rps=%s p50_ms=%s p99_ms=%s failed=%d non2xx=%d keepalive=%d target_cpu_us=%d target_cs=%d\n",
                    tool, t, c, rep, complete, complete, rps, p50, p99, failed, non2xx + 0, ka + 0, cpu, cs }' "$work/ab.out" >>"$ab_out" ||
            { cat "$work/ab.out" >&2; die "ab gave no result for $t c=$c"; }
          tail -1 "$ab_out" | sed 's/^/  /' >&2
        done
      done
    done
  done
fi

# ---------------------------------------------------------------- perf stat
# Where the CPU per request goes: system calls and context switches per
# request of each target, in wrk runs of their own after the measured
# ones (perf stat counts every system call, which costs a little).
perf_md=$work/perf.md
: >"$perf_md"
if [ "$use_perf" = 1 ]; then
  pplan=
  if [[ " $workloads " == *" get "* ]]; then
    pplan+="get ${concs%% *}"$'\n'
    [ "${concs##* }" != "${concs%% *}" ] && pplan+="get ${concs##* }"$'\n'
  fi
  for wl in $big_workloads; do [[ $wl == put-* ]] && pplan+="$wl ${big_concs##* }"$'\n'; done
  if [ -n "$pplan" ]; then
    log "perf stat: system calls and context switches per request"
    wait_quiet || true
    {
      echo "#### System calls and context switches per request (perf stat, a ${duration}s wrk run of their own per row)"
      echo
      echo "| workload | clients | target | requests | system calls/req | context switches/req |"
      echo "|---|---:|---|---:|---:|---:|"
    } >"$perf_md"
    while read -r wl c <&3; do
      [ -n "$wl" ] || continue
      p_targets=("${targets[@]}")
      [ "$wl" = get ] && p_targets+=("$floor" "$hfloor")
      for t in "${p_targets[@]}"; do
        [ "$warmup" -gt 0 ] && run_bg /dev/null wrk_base "$t" "$wl" "$c" "$warmup"
        perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "${tpids[$t]}" -o "$work/perf.stat" &
        pp=$!
        pids+=("$pp")
        sleep 0.2
        run_bg "$work/wrk.out" wrk_base "$t" "$wl" "$c" "$duration"
        kill -INT "$pp" 2>/dev/null || true
        wait "$pp" 2>/dev/null || true
        unset 'pids[-1]'
        n=$(sed -n 's/^BENCH .*\brequests=\([0-9]*\).*/\1/p' "$work/wrk.out")
        [ -n "$n" ] && [ "$n" -gt 0 ] || { cat "$work/wrk.out" >&2; die "wrk gave no result for perf stat of $t $wl $c"; }
        awk -F, -v wl="$wl" -v c="$c" -v t="$t" -v n="$n" '
          /raw_syscalls:sys_enter/ { sc = $1 } /context-switches/ { cs = $1 }
          END { printf "| %s | %d | %s | %d | %.2f | %.3f |\n", wl, c, t, n, sc / n, cs / n }' "$work/perf.stat" >>"$perf_md"
        tail -1 "$perf_md" | sed 's/^/  /' >&2
      done
    done 3<<<"$pplan"
    {
      echo
      echo "Counted over each target's processes (memcgate's, h1const's, or nginx's master and workers) while wrk ran, a little more than the run; memcached's own calls are not counted. The memcached round trips of a gateway are in its counts."
    } >>"$perf_md"
  fi
fi
elapsed=$(($(date +%s) - started))

# ---------------------------------------------------------------- report
# Two sections: the small values with ab (section.md, between the
# bench:begin/end markers of $doc) and the big values (section-big.md,
# between bench-big:begin/end), each written only when it ran.
memc_mod=$(dpkg-query -W -f '${Version}' libnginx-mod-http-memc 2>/dev/null || echo unknown)
conditions() { # title settings...
  echo "### $1 of $(date -u '+%Y-%m-%d %H:%M UTC')$([ "$quick" = 1 ] && echo ' (BENCH_QUICK smoke run)')"
  echo
  echo "- Machine: $ncpu CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "- Versions: $(go version | awk '{ print $3 }'), $(nginx -v 2>&1 | sed 's/.*: //') with libnginx-mod-http-memc $memc_mod, $(memcached -V), $(wrk -v 2>&1 | head -1 | awk '{ print "wrk " $2 }'), ab $(ab -V | head -1 | awk '{ print $5 }'), memcgate $gate_build"
  echo "- Settings: ${duration}s per run after ${warmup}s warm-up, $reps repeats per point interleaved memcgate/nginx, $2; servers on CPU $server_cpus (GOMAXPROCS=$server_n, worker_processes $server_n), memcached on CPU $memc_cpus (-t 1 -c 4096 -m 1024 -I 2m), wrk/ab on CPU $load_cpus (wrk -t 1, --timeout $wrk_timeout); nginx upstream keepalive $nginx_keepalive; access logs $([ "$access_log" = 1 ] && echo "on for both (memcgate JSON lines on stderr, nginx combined with buffer=64k flush=200ms, each to a file)" || echo "off for both")"
  echo "- memcached curr_connections with no gateway traffic (sampler only): $base_conns"
  echo "- Load average before the run: $load_before; wall time of all the runs (small, big and ab): $((elapsed / 60))m$((elapsed % 60))s"
  echo
}
sections=()
if [ -s "$runs" ] || [ -s "$ab_out" ]; then
  rflag=() ab_flag=()
  [ -s "$runs" ] && rflag=(-runs "$runs")
  [ -s "$ab_out" ] && ab_flag=(-ab "$ab_out")
  "$bt" report "${rflag[@]}" "${ab_flag[@]}" >"$work/tables.md"
  { conditions Run "clients: $concs; $nkeys keys of $keylen characters, $vallen-character values"
    cat "$work/tables.md"
    if [ -s "$perf_md" ]; then echo; cat "$perf_md"; fi; } >"$work/section.md"
  perf_md=/dev/null # shown once
  sections+=(bench:section.md)
fi
if [ -s "$runs_big" ]; then
  "$bt" report -big -runs "$runs_big" >"$work/tables-big.md"
  sets=$(for sz in $big_sizes; do printf '%s keys with %s-byte values, ' "${big_keys[$sz]}" "${big_bytes[$sz]}"; done)
  { conditions "Big-value run" "clients: $big_concs; keys of $keylen characters: ${sets%, }; wrk keeps bodies out of Lua (non-2xx are its statuses above 399)"
    cat "$work/tables-big.md"
    if [ -s "$perf_md" ]; then echo; cat "$perf_md"; fi; } >"$work/section-big.md"
  sections+=(bench-big:section-big.md)
fi

for sec in "${sections[@]}"; do echo; cat "$work/${sec#*:}"; done
if [ -n "${BENCH_RAW:-}" ]; then
  mkdir -p "$BENCH_RAW" && for f in "$runs" "$runs_big" "$ab_out" "$work/section.md" "$work/section-big.md"; do
    if [ -s "$f" ]; then cp "$f" "$BENCH_RAW/"; fi
  done
fi

if [ -n "$doc" ]; then
  [ -f "$doc" ] || printf '# Benchmarks\n' >"$doc"
  for sec in "${sections[@]}"; do
    m=${sec%%:*} file=$work/${sec#*:}
    if grep -q "<!-- $m:begin" "$doc" && grep -q "<!-- $m:end" "$doc"; then
      awk -v sec="$file" -v b="<!-- $m:begin" -v e="<!-- $m:end" '
        index($0, b) == 1 { print; while ((getline l < sec) > 0) print l; skip = 1; next }
        index($0, e) == 1 { skip = 0 }
        !skip' "$doc" >"$work/doc.md"
    else
      { cat "$doc"; echo; echo "<!-- $m:begin: generated by test/bench/bench.sh; edits inside are overwritten -->"
        cat "$file"; echo "<!-- $m:end -->"; } >"$work/doc.md"
    fi
    cp "$work/doc.md" "$doc"
  done
  if [ ${#sections[@]} -gt 0 ]; then log "results written to $doc"; fi
fi
