<?php
// A page of test/bench/php.sh: reads one random preloaded key through an
// HTTP gateway with memcgate_get() (test/php/memcgate_get.php, the
// function docs/php.md gives users): PHP's own stream socket, a new
// connection per page, no curl; with BENCH_PERSISTENT=1,
// memcgate_get_persistent(), on the connection the php-fpm worker keeps
// from page to page. BENCH_ADDR is the gateway's address
// (tcp://host:port or unix:///path) and BENCH_PATH what goes before the key
// in the path (empty for memcgate, "key/" or "const/" for nginx, whose
// locations decode the %2F); the other parameters are curl.php's.
require __DIR__ . '/memcgate_get.php';
$key = hash('sha384', $_SERVER['BENCH_PREFIX'] . mt_rand(0, (int) $_SERVER['BENCH_KEYS'] - 1));
try {
    $value = $_SERVER['BENCH_PERSISTENT'] === '1'
        ? memcgate_get_persistent($_SERVER['BENCH_PATH'] . $key, $_SERVER['BENCH_ADDR'], 10.0)
        : memcgate_get($_SERVER['BENCH_PATH'] . $key, $_SERVER['BENCH_ADDR'], 10.0);
} catch (RuntimeException $e) {
    $value = null;
}
if (!is_string($value) || strlen($value) !== (int) $_SERVER['BENCH_VALUE_LEN']) {
    http_response_code(502);
    exit;
}
echo $value;
