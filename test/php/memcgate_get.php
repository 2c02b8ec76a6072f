<?php
// memcgate_get.php: one GET from memcgate with PHP's own streams, no curl:
// memcgate_get on a new connection per call, memcgate_get_persistent on a
// connection a php-fpm worker keeps across its pages. docs/php.md prints
// these functions for users to copy; test/bench/php.sh's stream pages
// require this file, so the code measured is the code shipped; test/e2e
// (TestPHPStreamClient, TestPHPPersistentClient) runs them against a real
// gateway.

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
    if ($token !== null && !preg_match('~^[\x21-\x7e]+\z~', $token)) {
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

/**
 * Reads $key from memcgate as memcgate_get does, on a connection kept open
 * across calls and across the pages a php-fpm worker serves: one per
 * worker and $addr (PHP's STREAM_CLIENT_PERSISTENT; the token travels in
 * each request, not with the connection). Returns and throws as memcgate_get.
 *
 * Every answer, a 404 or an error status included, is read exactly to its
 * Content-Length, so the next call starts at the next answer. The kept
 * socket is closed, and the next call connects again, after an answer
 * with "Connection: close" and after anything that leaves it not exactly
 * between two answers: an error, a timeout, an answer cut short or longer
 * than its Content-Length, one with two Content-Lengths, an interim (1xx)
 * answer, bytes waiting before the request is sent (another answer, or
 * the close), or a page that ended in the middle of a call
 * (a fatal error, exit, a time limit), which the next call tells by the
 * mark the socket keeps (its chunk size: 8190 while an answer is owed,
 * 8191 between answers). A kept socket the gateway closed meanwhile (its
 * MEMCGATE_IDLE_TIMEOUT, a restart, a drain, its connection cap) is
 * replaced with a new connection and the GET sent again, once, if no byte
 * of the answer came; never after a timeout or part of an answer.
 */
function memcgate_get_persistent(string $key, string $addr = 'tcp://127.0.0.1:8080', float $timeout = 1.0, ?string $token = null): ?string
{
    if ($token !== null && !preg_match('~^[\x21-\x7e]+\z~', $token)) {
        throw new InvalidArgumentException('memcgate token: printable ASCII with no space, as memcgate requires');
    }
    $auth = $token === null ? '' : "Authorization: Bearer $token\r\n";
    $req = 'GET /' . rawurlencode($key) . " HTTP/1.1\r\nHost: localhost\r\n{$auth}\r\n";
    for ($retried = false; ; $retried = true) {
        $s = @stream_socket_client($addr, $errno, $errstr, $timeout, STREAM_CLIENT_CONNECT | STREAM_CLIENT_PERSISTENT);
        if ($s === false) {
            throw new RuntimeException("memcgate $addr: cannot connect: $errstr ($errno)");
        }
        $mark = stream_set_chunk_size($s, 8190); // an answer is owed from here on
        $r = [$s];
        $w = $e = null;
        if (($mark !== 8191 && $mark !== 8192) || stream_get_meta_data($s)['unread_bytes'] > 0 || @stream_select($r, $w, $e, 0) !== 0) {
            // Kept, but not between two answers: a page ended in the middle
            // of a call, or bytes (or the close) wait that no request of
            // this call asked for (other code's, on a socket it opened with
            // the same address). Never read from it: connect again.
            @stream_socket_shutdown($s, STREAM_SHUT_RDWR);
            fclose($s);
            $s = @stream_socket_client($addr, $errno, $errstr, $timeout, STREAM_CLIENT_CONNECT | STREAM_CLIENT_PERSISTENT);
            if ($s === false) {
                throw new RuntimeException("memcgate $addr: cannot connect: $errstr ($errno)");
            }
            $mark = stream_set_chunk_size($s, 8190);
        }
        $kept = $mark === 8191; // a new connection's chunk size is PHP's 8192
        $keep = false;          // the answer was read whole and the gateway keeps the connection
        try {
            stream_set_timeout($s, (int) $timeout, (int) (fmod($timeout, 1.0) * 1e6));
            if (@fwrite($s, $req) !== strlen($req)) {
                if ($kept && !$retried) {
                    continue; // the gateway closed it: send again on a new one
                }
                throw new RuntimeException("memcgate $addr: the request could not be sent");
            }
            $buf = '';
            while (($end = strpos($buf, "\r\n\r\n")) === false) {
                $more = @fread($s, 8192);
                if ($more === false || $more === '') {
                    $timedOut = stream_get_meta_data($s)['timed_out'];
                    if ($buf === '' && !$timedOut && $kept && !$retried) {
                        continue 2; // closed with nothing of the answer: send again on a new one
                    }
                    $why = $timedOut ? 'timed out' : 'closed';
                    throw new RuntimeException("memcgate $addr: connection $why before the answer's head");
                }
                $buf .= $more;
                if (strlen($buf) > 65536) {
                    throw new RuntimeException("memcgate $addr: the answer's head is over 64 KB");
                }
            }
            if (!preg_match('~^HTTP/1\.([01]) ([1-5][0-9][0-9])[ \r]~', $buf, $m)) {
                throw new RuntimeException("memcgate $addr: not an HTTP/1 answer");
            }
            $status = (int) $m[2];
            $head = substr($buf, 0, $end + 2); // each header line ends in \r\n
            $at = stripos($head, "\r\ncontent-length:");
            if ($at === false || $status < 200 || stripos($head, "\r\ntransfer-encoding:") !== false) {
                // A refusal before any handler (431: a head too large) may
                // run to the close; its status says more than its framing.
                // An interim answer (1xx) has another after it, never read.
                $why = $status === 200 ? 'the answer has no Content-Length' : "status $status: " . substr($buf, $end + 4, 200);
                throw new RuntimeException("memcgate $addr: $why");
            }
            $at += 17;
            if (stripos($head, "\r\ncontent-length:", $at) !== false) {
                throw new RuntimeException("memcgate $addr: the answer has two Content-Lengths");
            }
            $len = trim(substr($head, $at, strpos($head, "\r\n", $at) - $at));
            if (!ctype_digit($len)) {
                throw new RuntimeException("memcgate $addr: bad Content-Length '$len'");
            }
            $len = (int) $len;
            if ($status !== 200 && $status !== 404 && $len > 65536) {
                throw new RuntimeException("memcgate $addr: status $status with a body of $len bytes");
            }
            $body = (string) substr($buf, $end + 4);
            if (strlen($body) < $len) {
                $body .= stream_get_contents($s, $len - strlen($body));
            }
            if (strlen($body) > $len || stream_get_meta_data($s)['unread_bytes'] > 0) {
                throw new RuntimeException("memcgate $addr: more bytes than the Content-Length of $len");
            }
            if (strlen($body) < $len) {
                $why = stream_get_meta_data($s)['timed_out'] ? 'timed out' : 'closed';
                throw new RuntimeException("memcgate $addr: connection $why after " . strlen($body) . " of $len body bytes");
            }
            // Kept unless the gateway closes it: "Connection: close", or
            // HTTP/1.0 without "Connection: keep-alive".
            $conn = preg_match('~\r\nconnection:([^\r]*)~i', $head, $c) ? strtolower($c[1]) : '';
            $keep = $m[1] === '1' ? !preg_match('~(^|[ \t,])close([ \t,]|$)~', $conn) : (bool) preg_match('~(^|[ \t,])keep-alive([ \t,]|$)~', $conn);
            if ($status === 404) {
                return null;
            }
            if ($status !== 200) {
                throw new RuntimeException("memcgate $addr: status $status: " . substr($body, 0, 200));
            }
            return $body;
        } finally {
            if ($keep) {
                stream_set_chunk_size($s, 8191); // between two answers
            } else {
                @stream_socket_shutdown($s, STREAM_SHUT_RDWR);
                fclose($s);
            }
        }
    }
}
