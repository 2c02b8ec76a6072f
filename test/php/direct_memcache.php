<?php
// direct_memcache.php: the "other PHP code" of a migration that still uses
// the older Memcache extension (pecl/memcache), talking to memcached
// directly, for the interop tests.
// Input (stdin, JSON): {"servers":[["host",port,weight],...],
//   "strategy":"consistent"|"standard", "hash":"crc32"|"fnv", "prefix":"",
//   "op":"write"|"read", "items":{"key":"base64 value",...} or "keys":[...]}
// Output (JSON): for read, {"key":"base64 value or null",...}; for write, {"ok":N}.
// pecl/memcache 4.0.5.2 on PHP 8.2 reports a dynamic property on addServer
// as E_DEPRECATED; that is its own business, not this test's.
error_reporting(E_ALL & ~E_DEPRECATED);
$in = json_decode(stream_get_contents(STDIN), true);
ini_set('memcache.hash_strategy', $in['strategy']);
ini_set('memcache.hash_function', $in['hash']);
if (($in['prefix'] ?? '') !== '') {
    ini_set('memcache.prefix_static_key', $in['prefix']);
}
$m = new Memcache();
// A timeout of 10 s, not the default 1: pecl/memcache marks a server that
// times out failed and sends its keys to the next one, which on a machine
// busy with the whole test suite looks like a placement error.
foreach ($in['servers'] as [$host, $port, $weight]) {
    $m->addServer($host, $port, false, $weight, 10);
}
if ($in['op'] === 'write') {
    $ok = 0;
    foreach ($in['items'] as $k => $v) {
        // Default flags: pecl/memcache compresses from 20000 bytes.
        if ($m->set((string)$k, base64_decode($v))) {
            $ok++;
        } else {
            fwrite(STDERR, "set $k failed\n");
        }
    }
    echo json_encode(['ok' => $ok]);
    exit(0);
}
// One get per key: a multi-key get returns its keys with
// memcache.prefix_static_key prepended.
$out = [];
foreach ($in['keys'] as $k) {
    $v = $m->get((string)$k);
    $out[$k] = $v === false ? null : base64_encode((string)$v);
}
echo json_encode($out);
