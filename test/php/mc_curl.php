<?php
// mc_curl.php: the curl functions docs/php.md prints for PHP pages that
// call memcgate (from "$ch = curl_init();" on, unchanged), which
// TestPHPCurlFunctions runs against a real gateway.

$ch = curl_init();
function mc_get(string $key): ?string {
    global $ch;
    // One handle serves every call: each sets what the last one may have
    // left (a PUT's method and body, a batch's headers).
    curl_setopt_array($ch, [CURLOPT_URL => 'http://127.0.0.1:8080/' . rawurlencode($key),
        CURLOPT_HTTPGET => true, CURLOPT_CUSTOMREQUEST => null, CURLOPT_HTTPHEADER => [],
        CURLOPT_RETURNTRANSFER => true, CURLOPT_TIMEOUT_MS => 500]);
    $body = curl_exec($ch);
    return curl_getinfo($ch, CURLINFO_RESPONSE_CODE) === 200 ? $body : null;   // 404 = miss
}
function mc_set(string $key, string $value, int $ttl = 0): bool {
    global $ch;
    curl_setopt_array($ch, [CURLOPT_URL => "http://127.0.0.1:8080/" . rawurlencode($key) . "?exptime=$ttl",
        CURLOPT_CUSTOMREQUEST => 'PUT', CURLOPT_POSTFIELDS => $value, CURLOPT_HTTPHEADER => ['Expect:'],
        CURLOPT_RETURNTRANSFER => true, CURLOPT_TIMEOUT_MS => 500]);
    curl_exec($ch);
    return curl_getinfo($ch, CURLINFO_RESPONSE_CODE) === 201;
}
