<?php
// direct.php: the "other PHP code" of a migration, talking to memcached
// directly with the Memcached extension, for the interop tests.
// Input (stdin, JSON): {"servers":[["host",port,weight],...], "mode":"ketama"|"modula",
//   "prefix":"", "op":"write"|"read", "items":{"key":"base64 value",...} or "keys":[...]}
// Output (JSON): for read, {"key":"base64 value or null",...}; for write, {"ok":N}.
$in = json_decode(stream_get_contents(STDIN), true);
$m = new Memcached();
if ($in['mode'] === 'ketama') {
    $m->setOption(Memcached::OPT_LIBKETAMA_COMPATIBLE, true);
}
if (($in['prefix'] ?? '') !== '') {
    $m->setOption(Memcached::OPT_PREFIX_KEY, $in['prefix']);
}
// Raw strings: no serializer or compression surprises for this test.
$m->setOption(Memcached::OPT_COMPRESSION, false);
$m->addServers($in['servers']);
if ($in['op'] === 'write') {
    $ok = 0;
    foreach ($in['items'] as $k => $v) {
        if ($m->set((string)$k, base64_decode($v), 0)) {
            $ok++;
        } else {
            fwrite(STDERR, "set $k: " . $m->getResultMessage() . "\n");
        }
    }
    echo json_encode(['ok' => $ok]);
    exit(0);
}
$out = [];
foreach (array_chunk($in['keys'], 100) as $chunk) {
    $got = $m->getMulti($chunk);
    foreach ($chunk as $k) {
        $out[$k] = (is_array($got) && array_key_exists($k, $got)) ? base64_encode((string)$got[$k]) : null;
    }
}
echo json_encode($out);
