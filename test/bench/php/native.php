<?php
// A page of test/bench/php.sh: reads one random preloaded key from
// memcached with php-memcached, the reference the gateways are measured
// against. BENCH_PERSISTENT=1 keeps the connection in the FastCGI worker
// between requests (new Memcached('bench')); otherwise every page connects
// and closes, as in the seed benchmark. The other parameters are
// curl.php's, with BENCH_MEMCACHED (host:port) instead of a URL.
$key = hash('sha384', $_SERVER['BENCH_PREFIX'] . mt_rand(0, (int) $_SERVER['BENCH_KEYS'] - 1));
$m = $_SERVER['BENCH_PERSISTENT'] === '1' ? new Memcached('bench') : new Memcached();
if (!$m->getServerList()) {
    [$host, $port] = explode(':', $_SERVER['BENCH_MEMCACHED']);
    $m->addServer($host, (int) $port);
}
$value = $m->get($key);
if (!is_string($value) || strlen($value) !== (int) $_SERVER['BENCH_VALUE_LEN']) {
    http_response_code(502);
    exit;
}
echo $value;
