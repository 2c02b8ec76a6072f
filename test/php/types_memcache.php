<?php
// types_memcache.php: pecl/memcache's Memcache class on one server writes
// a value of every type, or reads back strings the gateway wrote, for the
// pecl-memcache codec's interop test.
// argv: host port write|read; read takes {"key": [sha1, flags],...} on
// stdin and prints {"key": "ok" | what PHP got}.
error_reporting(E_ALL & ~E_DEPRECATED); // pecl/memcache 4.0.5.2 on PHP 8.2
[$_, $host, $port, $op] = $argv;
$m = new Memcache();
$m->addServer($host, (int)$port);
if ($op === 'write') {
    $m->set('m_string', 'héllo wörld');
    $m->set('m_int', 42);
    $m->set('m_negint', -7);
    $m->set('m_float', 1.5);
    $m->set('m_true', true);
    $m->set('m_false', false);
    $m->set('m_null', null);
    $m->set('m_array', ['a' => 1, 'b' => [2, 3]]);
    $m->set('m_flagged', 'x', 0x50000);
    $m->set('m_compressed', str_repeat('compressible text ', 600), MEMCACHE_COMPRESSED);
    $m->set('m_big', str_repeat('over the threshold ', 1200)); // 22.8 KB: compressed by memcache.compress_threshold
    $m->set('m_array_compressed', range(1, 2000), MEMCACHE_COMPRESSED);
    $m->setCompressThreshold(100, 0.2);
    $m->set('m_low_threshold', str_repeat('setCompressThreshold ', 50));
    echo "ok\n";
    exit(0);
}
$want = json_decode(stream_get_contents(STDIN), true);
$out = [];
foreach ($want as $k => [$sha, $uf]) {
    $flags = 0;
    $v = $m->get($k, $flags);
    $ok = is_string($v) && sha1($v) === $sha && ($flags >> 16) === $uf;
    $out[$k] = $ok ? 'ok' : (gettype($v) . ':' . (is_string($v) ? strlen($v) : var_export($v, true)) . ' flags ' . $flags);
}
echo json_encode($out);
