<?php
// A page of test/bench/php.sh: reads one random preloaded key through an
// HTTP gateway with file_get_contents() on PHP's http:// stream wrapper, a
// new connection per page (TCP only: the wrapper cannot use a Unix socket).
// The parameters are curl.php's; a miss or any error makes
// file_get_contents return false, which answers 502.
$key = hash('sha384', $_SERVER['BENCH_PREFIX'] . mt_rand(0, (int) $_SERVER['BENCH_KEYS'] - 1));
$ctx = stream_context_create(['http' => ['timeout' => 10.0]]);
$value = @file_get_contents($_SERVER['BENCH_URL'] . $key, false, $ctx);
if (!is_string($value) || strlen($value) !== (int) $_SERVER['BENCH_VALUE_LEN']) {
    http_response_code(502);
    exit;
}
echo $value;
