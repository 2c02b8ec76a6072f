<?php
// session.php: PHP sessions through a memcached session handler, for the
// session interop tests. The handler and its settings come from php -d
// options (session.save_handler, session.save_path, memcache.* or
// memcached.*).
// Input (stdin, JSON): {"op":"write", "sessions":{"id":{"name":value,...},...}}
//   or {"op":"read", "ids":[...]}.
// Output (JSON): for write, {"id":"the session as stored (session_encode)",...};
// for read, {"id":{"name":value,...} or null when session_start found nothing,...}.
error_reporting(E_ALL & ~E_DEPRECATED); // pecl/memcache 4.0.5.2 on PHP 8.2
ini_set('session.use_cookies', '0');
ini_set('session.use_strict_mode', '0');
ini_set('session.cache_limiter', '');
$in = json_decode(stream_get_contents(STDIN), true);
$out = [];
if ($in['op'] === 'write') {
    foreach ($in['sessions'] as $id => $data) {
        session_id((string)$id);
        if (!session_start()) { fwrite(STDERR, "session_start $id failed\n"); exit(1); }
        $_SESSION = $data;
        $out[$id] = session_encode();
        if (!session_write_close()) { fwrite(STDERR, "session_write_close $id failed\n"); exit(1); }
    }
} else {
    foreach ($in['ids'] as $id) {
        session_id((string)$id);
        if (!session_start()) { fwrite(STDERR, "session_start $id failed\n"); exit(1); }
        $out[$id] = $_SESSION ? $_SESSION : null;
        session_write_close();
    }
}
echo json_encode($out);
