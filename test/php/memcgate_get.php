<?php
// memcgate_get.php: one GET from memcgate with PHP's own streams, no curl.
// docs/php.md prints this function for users to copy; test/bench/php.sh's
// stream pages require this file, so the code measured is the code shipped;
// test/e2e (TestPHPStreamClient) runs it against a real gateway.

/**
 * Reads $key from memcgate on a new connection and closes it.
 *
 * $addr is 'tcp://127.0.0.1:8080' or, over memcgate's Unix socket
 * (MEMCGATE_LISTEN_SOCKET), 'unix:///run/memcgate/memcgate.sock'.
 * $timeout (seconds) bounds the connect and each wait for the answer's
 * next bytes, not the whole call. $token, when memcgate has
 * MEMCGATE_AUTH_TOKENS, is sent as "Authorization: Bearer <token>".
 *
 * Returns the value, byte for byte, or null when the key is missing (404).
 * Throws RuntimeException on anything else: no connection, a timeout,
 * another status (its first 200 bytes in the message), an answer that
 * ends before its Content-Length or runs past it, or one without a
 * Content-Length (chunked: memcgate's GET never sends one).
 *
 * It speaks HTTP/1.1 with "Connection: close", so the gateway closes the
 * connection after the answer; no keep-alive, no redirects, no TLS.
 */
function memcgate_get(string $key, string $addr = 'tcp://127.0.0.1:8080', float $timeout = 1.0, ?string $token = null): ?string
{
    if ($token !== null && !preg_match('~^[\x21-\x7e]+$~', $token)) {
        throw new InvalidArgumentException('memcgate token: printable ASCII with no space, as memcgate requires');
    }
    $s = @stream_socket_client($addr, $errno, $errstr, $timeout);
    if ($s === false) {
        throw new RuntimeException("memcgate $addr: cannot connect: $errstr ($errno)");
    }
    try {
        stream_set_timeout($s, (int) $timeout, (int) (fmod($timeout, 1.0) * 1e6));
        $auth = $token === null ? '' : "Authorization: Bearer $token\r\n";
        $req = 'GET /' . rawurlencode($key) . " HTTP/1.1\r\nHost: localhost\r\n{$auth}Connection: close\r\n\r\n";
        if (@fwrite($s, $req) !== strlen($req)) {
            throw new RuntimeException("memcgate $addr: the request could not be sent");
        }
        // The head: read until its blank line (one read for a small value).
        $buf = '';
        while (($end = strpos($buf, "\r\n\r\n")) === false) {
            $more = @fread($s, 8192);
            if ($more === false || $more === '') {
                $why = stream_get_meta_data($s)['timed_out'] ? 'timed out' : 'closed';
                throw new RuntimeException("memcgate $addr: connection $why before the answer's head");
            }
            $buf .= $more;
            if (strlen($buf) > 65536) {
                throw new RuntimeException("memcgate $addr: the answer's head is over 64 KB");
            }
        }
        if (!preg_match('~^HTTP/1\.[01] ([1-5][0-9][0-9])[ \r]~', $buf, $m)) {
            throw new RuntimeException("memcgate $addr: not an HTTP/1 answer");
        }
        $status = (int) $m[1];
        if ($status === 404) {
            return null;
        }
        if ($status !== 200) {
            throw new RuntimeException("memcgate $addr: status $status: " . substr($buf, $end + 4, 200));
        }
        $head = substr($buf, 0, $end + 2); // each header line ends in \r\n
        $at = stripos($head, "\r\ncontent-length:");
        if ($at === false || stripos($head, "\r\ntransfer-encoding:") !== false) {
            throw new RuntimeException("memcgate $addr: the answer has no Content-Length");
        }
        $at += 17;
        $len = trim(substr($head, $at, strpos($head, "\r\n", $at) - $at));
        if (!ctype_digit($len)) {
            throw new RuntimeException("memcgate $addr: bad Content-Length '$len'");
        }
        $len = (int) $len;
        $body = (string) substr($buf, $end + 4);
        if (strlen($body) < $len) {
            $body .= stream_get_contents($s, $len - strlen($body));
        }
        if (strlen($body) > $len) {
            throw new RuntimeException("memcgate $addr: more bytes than the Content-Length of $len");
        }
        if (strlen($body) < $len) {
            $why = stream_get_meta_data($s)['timed_out'] ? 'timed out' : 'closed';
            throw new RuntimeException("memcgate $addr: connection $why after " . strlen($body) . " of $len body bytes");
        }
        return $body;
    } finally {
        fclose($s);
    }
}
