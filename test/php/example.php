<?php
// example.php: how legacy PHP talks to memcgate over HTTP instead of holding
// memcached connections. Run: MEMCGATE_URL=http://127.0.0.1:8080 php example.php
// or, over the gateway's Unix socket (MEMCGATE_LISTEN_SOCKET),
// MEMCGATE_UNIX_SOCKET=/run/memcgate/memcgate.sock php example.php
// Exits non-zero if the gateway does not behave as documented.

$socket = getenv('MEMCGATE_UNIX_SOCKET') ?: '';
// Over a Unix socket the URL's host is only the Host header.
$base = rtrim(getenv('MEMCGATE_URL') ?: ($socket !== '' ? 'http://localhost' : 'http://127.0.0.1:8080'), '/');

// One curl handle, reused: PHP keeps the keepalive connection to the gateway.
$ch = curl_init();
if ($socket !== '') {
    curl_setopt($ch, CURLOPT_UNIX_SOCKET_PATH, $socket);
}

function mc(string $method, string $key, ?string $value = null, array $query = []): array {
    global $ch, $base;
    // Keys go in the path; rawurlencode keeps '/' and any byte safe.
    $url = $base . '/' . implode('/', array_map('rawurlencode', explode('/', $key)));
    if ($query) {
        $url .= '?' . http_build_query($query);
    }
    curl_setopt_array($ch, [
        CURLOPT_URL => $url,
        CURLOPT_CUSTOMREQUEST => $method,
        CURLOPT_RETURNTRANSFER => true,
        CURLOPT_NOBODY => $method === 'HEAD',
        CURLOPT_POSTFIELDS => $value,
        CURLOPT_HTTPHEADER => ['Expect:'], // no 100-continue round trip
        CURLOPT_TIMEOUT_MS => 2000,
    ]);
    $body = curl_exec($ch);
    if ($body === false) {
        throw new RuntimeException(curl_error($ch));
    }
    return [curl_getinfo($ch, CURLINFO_RESPONSE_CODE), $body];
}

function check(string $what, bool $ok): void {
    echo ($ok ? 'ok   ' : 'FAIL ') . $what . "\n";
    if (!$ok) {
        exit(1);
    }
}

// The seed benchmark's shape: 96-character key, 400-character value.
$key = substr(str_repeat(bin2hex(random_bytes(48)), 1), 0, 96);
$value = str_repeat('x', 400);

[$code] = mc('PUT', $key, $value, ['exptime' => 300]);
check("PUT 96-char key, 400-byte value -> 201", $code === 201);

[$code, $body] = mc('GET', $key);
check("GET -> 200 with the same 400 bytes", $code === 200 && $body === $value);

// file_get_contents works too, for code that has no curl (over TCP: PHP's
// http:// stream cannot use a Unix socket).
if ($socket === '') {
    $ctx = stream_context_create(['http' => ['ignore_errors' => true]]);
    $body = file_get_contents("$base/$key", false, $ctx);
    check("file_get_contents -> same value", $body === $value);
}

[$code] = mc('DELETE', $key);
check("DELETE -> 204", $code === 204);

[$code] = mc('GET', $key);
check("GET after DELETE -> 404 (a miss)", $code === 404);

[$code] = mc('PUT', 'php/counter', '41');
[$code, $body] = mc('POST', 'php/counter', null, ['op' => 'incr', 'delta' => 1]);
check("incr -> 200 with 42", $code === 200 && $body === '42');

[$code, $body] = mc('GET', str_repeat('k', 251));
check("251-byte key -> 400", $code === 400);

echo "all ok\n";
