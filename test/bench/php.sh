#!/usr/bin/env bash
# php.sh: the seed benchmark's workload (`make bench-php`). PHP pages under
# nginx + php-fpm read one random key per page: through memcgate (TCP and
# its Unix socket) and through nginx + HttpMemcModule with a new curl
# connection per page, from a constant-body nginx location (the floor of an
# HTTP hop), and directly with php-memcached, connecting per page as the
# seed did (the reference, 100 %) and with a persistent connection. The
# -stream variants make the same HTTP calls with PHP's own stream socket
# (memcgate_get() of test/php/memcgate_get.php) instead of curl, a new
# connection per page; the -stream-persist ones with
# memcgate_get_persistent(), on a connection each php-fpm worker keeps; the
# -fgc ones with file_get_contents(); every HTTP server gets each client. ab
# without keep-alive loads the pages; everything shares the machine's
# CPUs, as on a PHP host, so req/s measures CPU per page. docs/benchmarks.md
# explains the method and holds the last run.
#
# Settings (environment):
#   BENCH_QUICK=1             smoke run (64 and 2048 clients, 1 repeat, 3000 requests)
#   BENCH_PHP_CONCURRENCY="64 128 256 512 1024 2048"
#   BENCH_PHP_N=10000         requests per measured run (at least 4 × clients)
#   BENCH_PHP_REPS=3          repeats per point, the variants interleaved
#   BENCH_PHP_VARIANTS="native native-persistent memcgate memcgate-unix nginx-memc nginx-const
#                       memcgate-stream memcgate-unix-stream nginx-memc-stream nginx-const-stream
#                       memcgate-stream-persist memcgate-unix-stream-persist nginx-memc-stream-persist"
#                             (also: memcgate-fgc nginx-memc-fgc nginx-const-fgc, and
#                             memcgate-close memcgate-unix-close nginx-memc-close: curl
#                             sending "Connection: close")
#   BENCH_PHP_CHILDREN=16     php-fpm static children
#   BENCH_PHP_GATEWAY_PROCS=  nginx worker_processes and memcgate GOMAXPROCS
#                             (default: unset, so memcgate's default and nginx's auto)
#   BENCH_PHP_PERF=1          after the runs, count system calls and context switches
#                             per page of each gateway with perf stat (0: skip)
#   BENCH_DOC=docs/benchmarks.md  where the results go (default: none for BENCH_QUICK
#                             or when any BENCH_PHP_ setting above is given)
#   BENCH_KEEP=1              keep the scratch directory (logs, raw results)
#   BENCH_PORTS=45000-45999   pick the servers' loopback ports in this range
#                             (default: free ports in 20000-31999)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
  d_conc="64 2048" d_n=3000 d_reps=1 d_doc=
else
  d_conc="64 128 256 512 1024 2048" d_n=10000 d_reps=3 d_doc=docs/benchmarks.md
fi
concs=${BENCH_PHP_CONCURRENCY:-$d_conc}
nreq=${BENCH_PHP_N:-$d_n}
reps=${BENCH_PHP_REPS:-$d_reps}
variants=${BENCH_PHP_VARIANTS:-native native-persistent memcgate memcgate-unix nginx-memc nginx-const memcgate-stream memcgate-unix-stream nginx-memc-stream nginx-const-stream memcgate-stream-persist memcgate-unix-stream-persist nginx-memc-stream-persist}
children=${BENCH_PHP_CHILDREN:-16}
gw_procs=${BENCH_PHP_GATEWAY_PROCS:-}
use_perf=${BENCH_PHP_PERF:-1}
# A subset of the variants or client counts does not replace the full
# table unless BENCH_DOC says so.
[ -n "${BENCH_PHP_VARIANTS:-}${BENCH_PHP_CONCURRENCY:-}${BENCH_PHP_N:-}${BENCH_PHP_REPS:-}" ] && d_doc=
doc=${BENCH_DOC-$d_doc}
nkeys=10000 vallen=400 prefix=memcgate-bench-

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# log, die, install_missing, $work and its trap, free_port, wait_port, run_bg
. "$here/lib.sh"

# ---------------------------------------------------------------- packages
fpm_bin() { compgen -G '/usr/sbin/php-fpm*' | sort -V | tail -1; }
install_missing memcached:memcached nginx:nginx libnginx-mod-http-memc:/usr/lib/nginx/modules/ngx_http_memc_module.so \
  apache2-utils:ab curl:curl procps:pgrep php-cli:php php-fpm:'/usr/sbin/php-fpm*' linux-perf:perf
install_missing php-curl:php:curl php-memcached:php:memcached # php -m needs php-cli first
fpm=$(fpm_bin)
[ -n "$fpm" ] || die "php-fpm is still missing"
[ "$use_perf" = 1 ] && ! command -v perf >/dev/null 2>&1 && { log "no perf: system calls per page are not counted"; use_perf=0; }
command -v go >/dev/null 2>&1 || die "go is required (to build bin/memcgate and the bench helper)"
[ -x bin/memcgate ] || die "bin/memcgate is missing; run 'make bench-php' (it builds it) or 'make build'"

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge 8192 ] || die "ulimit -n is $(ulimit -n); need at least 8192 for 2048 clients"
# php-fpm's children and nginx's workers run as nobody when we are root:
# they read the pages and connect to the sockets in here.
chmod 755 "$work"

log "building the bench helper"
go build -o "$work/benchtool" ./test/bench/cmd/benchtool
bt=$work/benchtool
cp bin/memcgate "$work/memcgate"
gate_build="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
[ -n "$(git status --porcelain -- '*.go' go.mod go.sum 2>/dev/null)" ] && gate_build+="+uncommitted changes"
gate_build+=" (binary sha256 $(sha256sum "$work/memcgate" | cut -c1-12))"
unix_ok=0
"$work/memcgate" -help 2>/dev/null | grep -q LISTEN_SOCKET && unix_ok=1
if [ $unix_ok = 0 ] && [[ " $variants " == *" memcgate-unix"* ]]; then
  log "this memcgate has no MEMCGATE_LISTEN_SOCKET: no memcgate-unix runs"
  variants=$(tr ' ' '\n' <<<"$variants" | grep -v '^memcgate-unix' | paste -sd' ' -)
fi

# ---------------------------------------------------------------- memcached
memc_port=$(free_port)
user_opt=() fpm_user=
if [ "$(id -u)" = 0 ]; then
  user_opt=(-u nobody)
  fpm_user="user = nobody
group = $(id -gn nobody)"
fi
memcached -l 127.0.0.1 -p "$memc_port" -U 0 -m 256 -c 4096 -t 1 -b 4096 "${user_opt[@]}" >"$work/memcached.log" 2>&1 &
memc_pid=$!
pids+=("$memc_pid")
wait_port "$memc_port" "$memc_pid" memcached
"$bt" preload -addr "127.0.0.1:$memc_port" -n $nkeys -keylen 96 -vallen $vallen -derive "$prefix" \
  -keys "$work/keys.txt" -value "$work/value.txt" >&2

# ---------------------------------------------------------------- gateways
gw_env=()
[ -n "$gw_procs" ] && gw_env=(GOMAXPROCS="$gw_procs")
nginx_port=$(free_port)
mkdir -p "$work/memc/tmp" "$work/front/tmp" "$work/pages"
sed -e "s|@PREFIX@|$work/memc|g" -e "s|@HTTP_PORT@|$nginx_port|g" -e "s|@MEMC_PORT@|$memc_port|g" \
  -e "s|@WORKERS@|${gw_procs:-auto}|g" -e "s|@WORKER_CONNECTIONS@|16384|g" -e "s|@NOFILE@|$(ulimit -n)|g" \
  -e "s|@KEEPALIVE@|1024|g" -e "s|@KEEPALIVE_REQUESTS@|1000000|g" -e "s|@BACKLOG@|4096|g" \
  -e "s|@ACCESS_LOG@|off|g" -e "s|@CONST_BODY@|$(<"$work/value.txt")|g" \
  "$here/nginx.conf.in" >"$work/memc/nginx.conf"
nginx -t -q -p "$work/memc" -e "$work/memc/error.log" -c "$work/memc/nginx.conf" || die "nginx -t failed (memc)"
nginx -p "$work/memc" -e "$work/memc/error.log" -c "$work/memc/nginx.conf" >"$work/memc/stdout.log" 2>&1 &
nginx_pid=$!
pids+=("$nginx_pid")
wait_port "$nginx_port" "$nginx_pid" "nginx (memc)"
nginx_workers=$(child_pids "$nginx_pid" "nginx workers")

gate_port=$(free_port) admin_port=$(free_port)
gate_sock=$work/memcgate.sock
sock_env=()
[ $unix_ok = 1 ] && sock_env=(MEMCGATE_LISTEN_SOCKET="$gate_sock" MEMCGATE_LISTEN_SOCKET_MODE=0666)
# MEMCGATE_FIT_PROCS as the PHP guide deploys a gateway beside PHP
# (docs/php.md); MEMCGATE_FIT_PROCS=false in the environment measures without.
env "${gw_env[@]}" "${sock_env[@]}" MEMCGATE_FIT_PROCS="${MEMCGATE_FIT_PROCS:-true}" MEMCGATE_SERVERS="127.0.0.1:$memc_port" MEMCGATE_ACCESS_LOG=false \
  MEMCGATE_LISTEN_ADDR="127.0.0.1:$gate_port" MEMCGATE_ADMIN_ADDR="127.0.0.1:$admin_port" \
  MEMCGATE_DRAIN_DELAY=0s MEMCGATE_LOG_LEVEL=warn "$work/memcgate" >"$work/memcgate.log" 2>&1 &
gate_pid=$!
pids+=("$gate_pid")
wait_port "$gate_port" "$gate_pid" memcgate

# ---------------------------------------------------------------- php-fpm and the front nginx
cp "$here/php/curl.php" "$here/php/native.php" "$here/php/stream.php" "$here/php/fgc.php" test/php/memcgate_get.php "$work/pages/"
sed -e "s|@PREFIX@|$work|g" -e "s|@CHILDREN@|$children|g" "$here/php/php-fpm.conf.in" |
  awk -v u="$fpm_user" '/^@USER@$/ { print u; next } { print }' >"$work/php-fpm.conf"
"$fpm" -y "$work/php-fpm.conf" -F >"$work/fpm.stdout" 2>&1 & # the packaged php.ini and extensions
fpm_pid=$!
pids+=("$fpm_pid")
for _ in $(seq 100); do [ -S "$work/fpm.sock" ] && break; kill -0 "$fpm_pid" 2>/dev/null || die "php-fpm exited (see $work/fpm.log)"; sleep 0.05; done

declare -A vurl vunix vaddr vpath vclose vscript vpersist vpids
for v in $variants; do
  vscript[$v]=curl.php vurl[$v]= vunix[$v]= vaddr[$v]= vpath[$v]= vclose[$v]=0 vpersist[$v]=0
  case $v in
  native) vscript[$v]=native.php vpids[$v]= ;;
  native-persistent) vscript[$v]=native.php vpersist[$v]=1 vpids[$v]= ;;
  memcgate) vurl[$v]="http://127.0.0.1:$gate_port/" vpids[$v]=$gate_pid ;;
  memcgate-unix) vurl[$v]="http://localhost/" vunix[$v]=$gate_sock vpids[$v]=$gate_pid ;;
  nginx-memc) vurl[$v]="http://127.0.0.1:$nginx_port/key/" vpids[$v]="$nginx_pid,$nginx_workers" ;;
  nginx-const) vurl[$v]="http://127.0.0.1:$nginx_port/const/" vpids[$v]="$nginx_pid,$nginx_workers" ;;
  memcgate-close) vurl[$v]="http://127.0.0.1:$gate_port/" vclose[$v]=1 vpids[$v]=$gate_pid ;;
  memcgate-unix-close) vurl[$v]="http://localhost/" vunix[$v]=$gate_sock vclose[$v]=1 vpids[$v]=$gate_pid ;;
  nginx-memc-close) vurl[$v]="http://127.0.0.1:$nginx_port/key/" vclose[$v]=1 vpids[$v]="$nginx_pid,$nginx_workers" ;;
  memcgate-stream) vscript[$v]=stream.php vaddr[$v]="tcp://127.0.0.1:$gate_port" vpids[$v]=$gate_pid ;;
  memcgate-unix-stream) vscript[$v]=stream.php vaddr[$v]="unix://$gate_sock" vpids[$v]=$gate_pid ;;
  nginx-memc-stream) vscript[$v]=stream.php vaddr[$v]="tcp://127.0.0.1:$nginx_port" vpath[$v]=key/ vpids[$v]="$nginx_pid,$nginx_workers" ;;
  nginx-const-stream) vscript[$v]=stream.php vaddr[$v]="tcp://127.0.0.1:$nginx_port" vpath[$v]=const/ vpids[$v]="$nginx_pid,$nginx_workers" ;;
  memcgate-stream-persist) vscript[$v]=stream.php vaddr[$v]="tcp://127.0.0.1:$gate_port" vpersist[$v]=1 vpids[$v]=$gate_pid ;;
  memcgate-unix-stream-persist) vscript[$v]=stream.php vaddr[$v]="unix://$gate_sock" vpersist[$v]=1 vpids[$v]=$gate_pid ;;
  nginx-memc-stream-persist) vscript[$v]=stream.php vaddr[$v]="tcp://127.0.0.1:$nginx_port" vpath[$v]=key/ vpersist[$v]=1 vpids[$v]="$nginx_pid,$nginx_workers" ;;
  memcgate-fgc) vscript[$v]=fgc.php vurl[$v]="http://127.0.0.1:$gate_port/" vpids[$v]=$gate_pid ;;
  nginx-memc-fgc) vscript[$v]=fgc.php vurl[$v]="http://127.0.0.1:$nginx_port/key/" vpids[$v]="$nginx_pid,$nginx_workers" ;;
  nginx-const-fgc) vscript[$v]=fgc.php vurl[$v]="http://127.0.0.1:$nginx_port/const/" vpids[$v]="$nginx_pid,$nginx_workers" ;;
  *) die "unknown variant $v" ;;
  esac
done
locations=
for v in $variants; do
  locations+="        location = /$v {
            fastcgi_pass unix:$work/fpm.sock;
            fastcgi_param SCRIPT_FILENAME $work/pages/${vscript[$v]};
            fastcgi_param REQUEST_METHOD \$request_method;
            fastcgi_param BENCH_URL \"${vurl[$v]}\";
            fastcgi_param BENCH_UNIX \"${vunix[$v]}\";
            fastcgi_param BENCH_ADDR \"${vaddr[$v]}\";
            fastcgi_param BENCH_PATH \"${vpath[$v]}\";
            fastcgi_param BENCH_CLOSE ${vclose[$v]};
            fastcgi_param BENCH_MEMCACHED 127.0.0.1:$memc_port;
            fastcgi_param BENCH_PERSISTENT ${vpersist[$v]};
            fastcgi_param BENCH_KEYS $nkeys;
            fastcgi_param BENCH_PREFIX $prefix;
            fastcgi_param BENCH_VALUE_LEN $vallen;
        }
"
done
front_port=$(free_port)
sed -e "s|@PREFIX@|$work/front|g" -e "s|@PORT@|$front_port|g" -e "s|@NOFILE@|$(ulimit -n)|g" "$here/php/nginx-front.conf.in" |
  awk -v loc="$locations" '/^@VARIANTS@$/ { printf "%s", loc; next } { print }' >"$work/front/nginx.conf"
nginx -t -q -p "$work/front" -e "$work/front/error.log" -c "$work/front/nginx.conf" || die "nginx -t failed (front)"
nginx -p "$work/front" -e "$work/front/error.log" -c "$work/front/nginx.conf" >"$work/front/stdout.log" 2>&1 &
front_pid=$!
pids+=("$front_pid")
wait_port "$front_port" "$front_pid" "nginx (front)"
# The page's own processes, for their CPU per page: php-fpm's master and
# its static children (pm.max_requests = 0: they live through the runs),
# the front nginx's master and workers.
fpm_pids="$fpm_pid,$(pgrep -P "$fpm_pid" | paste -sd, -)"
front_pids="$front_pid,$(child_pids "$front_pid" "front nginx workers")"

# ---------------------------------------------------------------- sanity
for v in $variants; do
  body=$(curl -s -w '\n%{http_code}' "http://127.0.0.1:$front_port/$v")
  code=${body##*$'\n'} body=${body%$'\n'*}
  [ "$code" = 200 ] && [ ${#body} = $vallen ] || die "$v: the page answered $code with ${#body} bytes (logs in $work)"
done
log "memcached :$memc_port, memcgate :$gate_port$([ $unix_ok = 1 ] && echo " and $gate_sock"), nginx+memc :$nginx_port, front nginx :$front_port, php-fpm $children children; variants: $variants"

# ---------------------------------------------------------------- runs
runs=$work/php.txt
: >"$runs"
counters() { "$bt" counters -pids "$1"; } # cpu_us cs busy_us
field() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
ab_page() { # variant conc n out
  run_bg "$4" ab -r -q -s 30 -c "$2" -n "$3" "http://127.0.0.1:$front_port/$1"
}
started=$(date +%s)
total=$(($(wc -w <<<"$concs") * reps * $(wc -w <<<"$variants"))) i=0
log "$total ab runs of $nreq requests (+ a warm-up each)"
for c in $concs; do
  n=$nreq
  [ "$n" -lt $((c * 4)) ] && n=$((c * 4))
  for rep in $(seq "$reps"); do
    for v in $variants; do
      i=$((i + 1))
      ab_page "$v" "$c" "$((c > 500 ? c * 2 : 1000))" /dev/null
      gp=${vpids[$v]:-$memc_pid}
      a=$(counters "$gp") m0=$(counters "$memc_pid") p0=$(counters "$fpm_pids") f0=$(counters "$front_pids")
      t0=$EPOCHREALTIME
      ab_page "$v" "$c" "$n" "$work/ab.out"
      t1=$EPOCHREALTIME
      b=$(counters "$gp") m1=$(counters "$memc_pid") p1=$(counters "$fpm_pids") f1=$(counters "$front_pids")
      rec=$(awk -v v="$v" -v c="$c" -v rep="$rep" '
        /^Complete requests:/ { complete = $3 }
        /^Failed requests:/ { failed = $3 }
        /^Non-2xx responses:/ { non2xx = $3 }
        /^Requests per second:/ { rps = $4 }
        /^  50%/ { p50 = $2 }
        /^  99%/ { p99 = $2 }
        END { if (rps == "") exit 1
              printf "variant=%s conc=%d rep=%d requests=%d rps=%s p50_ms=%s p99_ms=%s failed=%d non2xx=%d",
                v, c, rep, complete, rps, p50, p99, failed, non2xx + 0 }' "$work/ab.out") ||
        { cat "$work/ab.out" >&2; die "ab gave no result for $v c=$c"; }
      gw_cpu=0 gw_cs=0
      if [ -n "${vpids[$v]}" ]; then
        gw_cpu=$(($(field cpu_us "$b") - $(field cpu_us "$a"))) gw_cs=$(($(field cs "$b") - $(field cs "$a")))
      fi
      rec+=" gw_cpu_us=$gw_cpu gw_cs=$gw_cs memc_cpu_us=$(($(field cpu_us "$m1") - $(field cpu_us "$m0")))"
      rec+=" php_cpu_us=$(($(field cpu_us "$p1") - $(field cpu_us "$p0"))) front_cpu_us=$(($(field cpu_us "$f1") - $(field cpu_us "$f0")))"
      rec+=" busy_us=$(($(field busy_us "$b") - $(field busy_us "$a"))) wall_us=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b - a) * 1e6 }')"
      echo "$rec" >>"$runs"
      awk -v i="$i" -v n="$total" -v line="$rec" 'BEGIN {
        m = split(line, f, " "); for (j = 1; j <= m; j++) { split(f[j], kv, "="); v[kv[1]] = kv[2] }
        printf "[%d/%d] c=%-4d %-20s rep %d: %6.0f req/s  p99 %5d ms  failed %d non2xx %d  gateway %6.1f us/page %5.2f cs/page  php-fpm %6.1f  machine %6.1f us/page\n",
          i, n, v["conc"], v["variant"], v["rep"], v["rps"], v["p99_ms"], v["failed"], v["non2xx"],
          v["gw_cpu_us"] / v["requests"], v["gw_cs"] / v["requests"], v["php_cpu_us"] / v["requests"], v["busy_us"] / v["requests"] }' >&2
    done
  done
done

# System calls and context switches per page of each gateway, in runs of
# their own (perf stat counts every system call, which costs a little).
perf_out=$work/perf.txt
: >"$perf_out"
if [ "$use_perf" = 1 ]; then
  pc=256
  [[ " $concs " == *" $pc "* ]] || pc=${concs%% *}
  log "perf stat: system calls and context switches per page, $pc clients"
  for v in $variants; do
    [ -n "${vpids[$v]}" ] || continue
    ab_page "$v" "$pc" 1000 /dev/null
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "${vpids[$v]}" -o "$work/perf.stat" &
    pp=$!
    pids+=("$pp")
    sleep 0.2
    ab_page "$v" "$pc" "$nreq" "$work/ab.out"
    kill -INT "$pp" 2>/dev/null || true
    wait "$pp" 2>/dev/null || true
    unset 'pids[-1]'
    awk -F, -v v="$v" -v c="$pc" -v n="$(awk '/^Complete requests:/ { print $3 }' "$work/ab.out")" '
      /raw_syscalls:sys_enter/ { sc = $1 } /context-switches/ { cs = $1 }
      END { printf "variant=%s conc=%d requests=%d syscalls=%d cs=%d\n", v, c, n, sc, cs }' "$work/perf.stat" >>"$perf_out"
    tail -1 "$perf_out" | sed 's/^/  /' >&2
  done
fi
elapsed=$(($(date +%s) - started))

# ---------------------------------------------------------------- report
perf_flag=()
[ -s "$perf_out" ] && perf_flag=(-perf "$perf_out")
"$bt" phpreport -runs "$runs" "${perf_flag[@]}" >"$work/tables.md"
{
  echo "### PHP run of $(date -u '+%Y-%m-%d %H:%M UTC')$([ "$quick" = 1 ] && echo ' (BENCH_QUICK smoke run)')"
  echo
  echo "- Machine: $(nproc --all) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "- Versions: $(go version | awk '{ print $3 }'), $("$fpm" -v | head -1 | awk '{ print "php-fpm " $2 }'), php-memcached $(php -r 'echo phpversion("memcached");'), libcurl $(php -r 'echo curl_version()["version"];'), $(nginx -v 2>&1 | sed 's/.*: //'), $(memcached -V), ab $(ab -V | head -1 | awk '{ print $5 }'), memcgate $gate_build"
  echo "- Settings: $nreq requests per run (at least 4 × clients) after a warm-up, $reps repeats per point with the variants interleaved, clients: $concs; php-fpm static $children children; nothing pinned; memcgate GOMAXPROCS ${gw_procs:-default} and FIT_PROCS ${MEMCGATE_FIT_PROCS:-true}, nginx worker_processes ${gw_procs:-auto}; $nkeys keys of 96 characters, $vallen-character values"
  echo "- Load average before the run: $load_before; wall time of the runs: $((elapsed / 60))m$((elapsed % 60))s"
  echo
  cat "$work/tables.md"
} >"$work/section.md"
echo
cat "$work/section.md"

if [ -n "$doc" ]; then
  grep -q '<!-- bench-php:begin' "$doc" && grep -q '<!-- bench-php:end' "$doc" || die "$doc has no bench-php:begin/end markers"
  awk -v sec="$work/section.md" '
    /<!-- bench-php:begin/ { print; while ((getline l < sec) > 0) print l; skip = 1; next }
    /<!-- bench-php:end/ { skip = 0 }
    !skip' "$doc" >"$work/doc.md"
  cp "$work/doc.md" "$doc"
  log "results written to $doc"
fi
