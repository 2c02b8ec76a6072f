<?php
// stream_get.php: drives memcgate_get() (memcgate_get.php) for the e2e
// tests (TestPHPStreamClient).
// Input (stdin, JSON): {"addr": "tcp://127.0.0.1:8080" or "unix:///path",
//   "timeout": seconds, "keys": ["base64 key", ...], "token": optional}
// Output (JSON): one entry per key, in order: {"value": "base64 value"},
//   {"miss": true}, or {"error": "the exception's message"}.
require __DIR__ . '/memcgate_get.php';

$in = json_decode(stream_get_contents(STDIN), true);
$out = [];
foreach ($in['keys'] as $k) {
    try {
        $v = memcgate_get(base64_decode($k), $in['addr'], (float) $in['timeout'], $in['token'] ?? null);
        $out[] = $v === null ? ['miss' => true] : ['value' => base64_encode($v)];
    } catch (RuntimeException | InvalidArgumentException $e) {
        $out[] = ['error' => $e->getMessage()];
    }
}
echo json_encode($out);
