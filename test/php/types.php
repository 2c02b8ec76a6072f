<?php
// types.php: php-memcached on one server writes a value of every type, or
// reads back strings the gateway wrote, for the value-codec interop test.
// argv: host port write|read; read takes {"key": sha1,...} on stdin and
// prints {"key": "ok" | what PHP got}.
[$_, $host, $port, $op] = $argv;
$m = new Memcached();
$m->setOption(Memcached::OPT_LIBKETAMA_COMPATIBLE, true);
$m->addServer($host, (int)$port);
if ($op === 'write') {
    $m->set('t_string', 'héllo wörld');
    $m->set('t_int', 42);
    $m->set('t_negint', -7);
    $m->set('t_float', 1.5);
    $m->set('t_true', true);
    $m->set('t_false', false);
    $m->set('t_array', ['a' => 1, 'b' => [2, 3]]);
    $m->set('t_big', str_repeat('compressible text ', 600)); // 10.8 KB: php-memcached compresses it
    $m->setOption(Memcached::OPT_COMPRESSION_TYPE, Memcached::COMPRESSION_ZLIB);
    $m->set('t_big_zlib', str_repeat('zlib text ', 1000));
    $m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_JSON);
    $m->set('t_json', ['x' => 'y']);
    echo "ok\n";
    exit(0);
}
$want = json_decode(stream_get_contents(STDIN), true);
$out = [];
foreach ($want as $k => $sha) {
    $v = $m->get($k);
    $out[$k] = (is_string($v) && sha1($v) === $sha) ? 'ok' : (gettype($v) . ':' . (is_string($v) ? strlen($v) : var_export($v, true)));
}
echo json_encode($out);
