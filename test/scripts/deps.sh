#!/usr/bin/env bash
# deps.sh PROFILE: installs, with apt-get, the Debian packages a make target
# needs when they are missing. PROFILE is "run" (memcached, and curl, which
# the examples make run prints use) or "test" (memcached, curl, which
# test/deploy runs those examples with, php-cli with the curl, memcached and memcache extensions,
# php-fpm for the kept-connection test, nginx with the memc module and
# haproxy for the interop and load-balancer tests, prometheus for promtool, which checks the shipped alert rules, and
# chromium, the headless browser test/status loads the status page in).
# It fails, never skips, when something cannot be installed.
set -euo pipefail
profile=${1:-test}
need=()
command -v memcached >/dev/null 2>&1 || need+=(memcached)
command -v curl >/dev/null 2>&1 || need+=(curl)
if [ "$profile" = test ]; then
  command -v php >/dev/null 2>&1 || need+=(php-cli)
  # php -m read whole, then searched: piped into grep -q, which exits at
  # its match, php gets SIGPIPE writing the modules after it, and pipefail
  # would take a module present for one missing (and run apt-get).
  mods=$(php -m 2>/dev/null || true)
  grep -qx curl <<<"$mods" || need+=(php-curl)
  grep -qx memcached <<<"$mods" || need+=(php-memcached)
  grep -qx memcache <<<"$mods" || need+=(php-memcache)
  command -v nginx >/dev/null 2>&1 || need+=(nginx)
  [ -e /usr/lib/nginx/modules/ngx_http_memc_module.so ] || need+=(libnginx-mod-http-memc)
  compgen -G "/usr/sbin/php-fpm*" >/dev/null || need+=(php-fpm)
  command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
fi
[ ${#need[@]} -eq 0 ] && exit 0
echo "deps: installing ${need[*]}" >&2
if [ "$(id -u)" != 0 ]; then
  SUDO=sudo
  command -v sudo >/dev/null 2>&1 || { echo "deps: need root to apt-get install ${need[*]}" >&2; exit 1; }
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian may start the packaged memcached, nginx and php-fpm services; our tests and
# make run use their own ports and processes, so they are left as they are.
for cmd in memcached curl; do command -v "$cmd" >/dev/null || { echo "deps: $cmd still missing" >&2; exit 1; }; done
