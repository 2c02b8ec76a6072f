<?php
// persistent_get.php: drives memcgate_get_persistent() (memcgate_get.php)
// for the e2e tests (TestPHPPersistentClient), one call a line, all in one
// process, so that the calls share the kept connection as a php-fpm
// worker's pages do.
// Input (stdin): one JSON object a line: {"op": "get", "foreign", "fatal"
//   or "abandon", "key": "base64 key", "addr": "tcp://127.0.0.1:8080" or
//   "unix:///path", "timeout": seconds, "token": optional}.
// Output (stdout): one JSON line per input line: {"value": "base64 value"},
//   {"miss": true} or {"error": "the exception's message"}; for "abandon"
//   and "fatal", {"abandoned": true}.
// "abandon" ends the call as a page's fatal error or exit would, in the
// middle, without its finally block: SIGUSR1 (which the test sends while
// the call waits for its answer) makes the process exit, and a shutdown
// function, as PHP runs after exit, goes on with the next lines: the next
// "page" of this process. "fatal" ends it with a real fatal error, a
// memory limit the answer's body runs past, and goes on the same way.
// "foreign" is a get after other code of the same process opened the
// same persistent socket (the same address string), sent a request on it
// and read nothing of its answer, which has come.
require __DIR__ . '/memcgate_get.php';

function serve(): void
{
    while (($line = fgets(STDIN)) !== false) {
        $in = json_decode($line, true);
        if ($in['op'] === 'abandon') {
            pcntl_async_signals(true);
            pcntl_signal(SIGUSR1, function () {
                exit(0);
            });
            register_shutdown_function(function () {
                pcntl_signal(SIGUSR1, SIG_DFL);
                echo json_encode(['abandoned' => true]), "\n";
                serve();
            });
        }
        if ($in['op'] === 'fatal') {
            register_shutdown_function(function () {
                ini_set('memory_limit', '-1');
                echo json_encode(['abandoned' => true]), "\n";
                serve();
            });
            ini_set('display_errors', 'stderr');
            ini_set('memory_limit', (string) (memory_get_usage(true) + (4 << 20)));
        }
        if ($in['op'] === 'foreign') {
            $f = stream_socket_client($in['addr'], $errno, $errstr, 5.0, STREAM_CLIENT_CONNECT | STREAM_CLIENT_PERSISTENT);
            fwrite($f, "GET /foreign HTTP/1.1\r\nHost: localhost\r\n\r\n");
            $r = [$f];
            $w = $e = null;
            stream_select($r, $w, $e, 5);
        }
        try {
            $v = memcgate_get_persistent(base64_decode($in['key']), $in['addr'], (float) $in['timeout'], $in['token'] ?? null);
            $out = $v === null ? ['miss' => true] : ['value' => base64_encode($v)];
        } catch (RuntimeException | InvalidArgumentException $e) {
            $out = ['error' => $e->getMessage()];
        }
        echo json_encode($out), "\n";
    }
}

serve();
