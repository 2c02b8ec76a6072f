<?php
// A page of test/bench/php.sh: reads one random preloaded key through an
// HTTP gateway on a new curl handle, so a new connection, as a PHP page
// that calls a local gateway does. The front nginx passes the settings as
// FastCGI parameters: BENCH_URL (the URL before the key), BENCH_UNIX (a
// Unix socket to connect to instead, or empty), BENCH_KEYS (how many keys
// were preloaded), BENCH_PREFIX (key i is the hex SHA-384 of the prefix and
// i) and BENCH_VALUE_LEN (the length every value has); BENCH_CLOSE=1 sends
// "Connection: close", so the server closes first, as the stream page's
// request has it (curl otherwise asks for keep-alive and closes at
// curl_close). A miss, an error or a value of another length answers 502,
// which ab counts as non-2xx.
$key = hash('sha384', $_SERVER['BENCH_PREFIX'] . mt_rand(0, (int) $_SERVER['BENCH_KEYS'] - 1));
$ch = curl_init($_SERVER['BENCH_URL'] . $key);
$opts = [CURLOPT_RETURNTRANSFER => true, CURLOPT_TIMEOUT_MS => 10000];
if ($_SERVER['BENCH_CLOSE'] === '1') {
    $opts[CURLOPT_HTTPHEADER] = ['Connection: close'];
}
if ($_SERVER['BENCH_UNIX'] !== '') {
    $opts[CURLOPT_UNIX_SOCKET_PATH] = $_SERVER['BENCH_UNIX'];
}
curl_setopt_array($ch, $opts);
$value = curl_exec($ch);
$code = curl_getinfo($ch, CURLINFO_RESPONSE_CODE);
curl_close($ch);
if ($code !== 200 || !is_string($value) || strlen($value) !== (int) $_SERVER['BENCH_VALUE_LEN']) {
    http_response_code(502);
    exit;
}
echo $value;
