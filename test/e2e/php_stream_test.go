package e2e

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// streamResult is one answer of test/php/stream_get.php: a value, a miss
// or memcgate_get's exception message.
type streamResult struct {
	Value     *string `json:"value"` // base64
	Miss      bool    `json:"miss"`
	Error     string  `json:"error"`
	Abandoned bool    `json:"abandoned"` // persistent_get.php's "abandon": the call was cut off
}

// streamGet runs memcgate_get (test/php/memcgate_get.php) in the real php
// for each key, against addr (tcp://… or unix://…).
func streamGet(t *testing.T, php, addr string, timeout float64, keys ...string) []streamResult {
	t.Helper()
	return streamGetToken(t, php, addr, timeout, nil, keys...)
}

// streamGetToken is streamGet passing memcgate_get a token, or none if
// token is nil.
func streamGetToken(t *testing.T, php, addr string, timeout float64, token *string, keys ...string) []streamResult {
	t.Helper()
	enc := make([]string, len(keys))
	for i, k := range keys {
		enc[i] = base64.StdEncoding.EncodeToString([]byte(k))
	}
	in, _ := json.Marshal(map[string]any{"addr": addr, "timeout": timeout, "keys": enc, "token": token})
	cmd := exec.Command(php, "../php/stream_get.php")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("php stream_get.php %s: %v\n%s%s", addr, err, out, stderr.String())
	}
	var res []streamResult
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(keys) {
		t.Fatalf("php stream_get.php %s: %v, %d answers for %d keys: %s\n%s", addr, err, len(res), len(keys), out, stderr.String())
	}
	return res
}

// value decodes a result's value; ok is false for a miss or an error.
func (r streamResult) value(t *testing.T) (string, bool) {
	t.Helper()
	if r.Value == nil {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(*r.Value)
	if err != nil {
		t.Fatalf("bad base64 from php: %v", err)
	}
	return string(b), true
}

// TestPHPStreamClient runs the stream client that docs/php.md gives PHP
// users (memcgate_get) in the real php against a real gateway, over TCP
// and over its Unix socket: hits of awkward values and keys, a miss, a
// refused key, a value of 1 MiB, a refused connection and a gateway
// stopped with SIGSTOP (the timeout).
func TestPHPStreamClient(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	php := gatewaytest.PHP(t)
	sock := filepath.Join(t.TempDir(), "memcgate.sock")
	g := startOneNodeGateway(t, map[string]string{
		"MEMCGATE_LISTEN_SOCKET":   sock,
		"MEMCGATE_MAX_VALUE_BYTES": strconv.Itoa(1<<20 + 1000),
	}, "-I", "2m")

	big := make([]byte, 1<<20) // 1 MiB, every byte value, CRLFs and NULs included
	for i := range big {
		big[i] = byte(i * 7)
	}
	values := []struct{ name, key, value string }{
		{"seed-sized", strings.Repeat("k", 96), strings.Repeat("v", 400)},
		{"NUL and CRLF bytes", "bin", "a\x00b\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n\x00\xff"},
		{"empty", "empty", ""},
		{"key needing percent-encoding", "café/日本?x=1#y%2F&+", "pct"},
		{"1 MiB", "big", string(big)},
	}
	for _, v := range values {
		// pathEscape keeps '/', which PHP's rawurlencode encodes: the
		// gateway reads both as the same key.
		if r := g.do("PUT", "/"+pathEscape(v.key), []byte(v.value)); r.status != 201 {
			t.Fatalf("PUT %s: %d %s", v.name, r.status, r.body)
		}
	}

	for _, addr := range []string{"tcp://" + g.DataAddr, "unix://" + sock} {
		t.Run(strings.SplitN(addr, ":", 2)[0], func(t *testing.T) {
			keys := []string{}
			for _, v := range values {
				keys = append(keys, v.key)
			}
			keys = append(keys, "missing", "bad key")
			res := streamGet(t, php, addr, 5, keys...)
			for i, v := range values {
				got, ok := res[i].value(t)
				if !ok || got != v.value {
					t.Errorf("%s: got %d bytes (ok %v, miss %v, error %q), want the %d bytes stored",
						v.name, len(got), ok, res[i].Miss, res[i].Error, len(v.value))
				}
			}
			if r := res[len(values)]; !r.Miss || r.Value != nil || r.Error != "" {
				t.Errorf("missing key: %+v, want a miss (null)", r)
			}
			if r := res[len(values)+1]; r.Error == "" || !strings.Contains(r.Error, "status 400: key has byte 0x20") {
				t.Errorf("key with a space: %+v, want an exception with the gateway's 400 and its reason", r)
			}
		})
	}

	t.Run("refused", func(t *testing.T) {
		dead := memcachedtest.DeadPort(t)
		res := streamGet(t, php, fmt.Sprintf("tcp://127.0.0.1:%d", dead), 5, "k")
		if !strings.Contains(res[0].Error, "cannot connect: Connection refused") {
			t.Errorf("dead TCP port: %+v, want 'cannot connect: Connection refused'", res[0])
		}
		res = streamGet(t, php, "unix://"+filepath.Join(t.TempDir(), "none.sock"), 5, "k")
		if !strings.Contains(res[0].Error, "cannot connect: No such file or directory") {
			t.Errorf("no socket file: %+v, want 'cannot connect: No such file or directory'", res[0])
		}
	})

	t.Run("stopped gateway", func(t *testing.T) {
		// Stopped, the gateway still has its listening socket: the kernel
		// completes the connection and nothing answers.
		g.Signal(syscall.SIGSTOP)
		defer g.Signal(syscall.SIGCONT)
		memcachedtest.WaitStopped(t, "memcgate", g.Pid())
		for _, addr := range []string{"tcp://" + g.DataAddr, "unix://" + sock} {
			res := streamGet(t, php, addr, 0.3, "bin")
			if !strings.Contains(res[0].Error, "connection timed out before the answer's head") {
				t.Errorf("%s, gateway stopped: %+v, want a timeout", addr, res[0])
			}
		}
	})
}

// TestPHPStreamClientToken: memcgate_get's token opens a gateway with
// MEMCGATE_AUTH_TOKENS; without one the 401 is an exception, and a token
// that would break the request's head is refused before anything is sent.
func TestPHPStreamClientToken(t *testing.T) {
	t.Parallel()
	php := gatewaytest.PHP(t)
	g := startOneNodeGateway(t, map[string]string{
		"MEMCGATE_AUTH_TOKENS": "read:php-pages-token-0001",
	})
	addr := "tcp://" + g.DataAddr
	good, bad, nl := "php-pages-token-0001", "php-pages-token-0001\r\nX-Injected: 1", "php-pages-token-0001\n"
	for _, c := range []struct {
		name  string
		token *string
		want  string // "" for a miss
	}{
		{"no token", nil, "status 401"},
		{"token", &good, ""},
		{"token breaking the head", &bad, "printable ASCII with no space"},
		{"token with a newline at its end", &nl, "printable ASCII with no space"},
	} {
		r := streamGetToken(t, php, addr, 5, c.token, "missing")[0]
		if c.want == "" && (!r.Miss || r.Error != "") {
			t.Errorf("%s: %+v, want a miss", c.name, r)
		}
		if c.want != "" && !strings.Contains(r.Error, c.want) {
			t.Errorf("%s: %+v, want an exception with %q", c.name, r, c.want)
		}
	}
}

// TestPHPStreamClientAnswers gives memcgate_get answers no correct gateway
// sends, from a raw socket, and checks that each is an exception naming
// what is wrong (or, for the odd but valid ones, the value); and that the
// request it sends is the one docs/php.md shows.
func TestPHPStreamClientAnswers(t *testing.T) {
	t.Parallel()
	php := gatewaytest.PHP(t)
	cases := []struct {
		name, answer string
		want         string // the value, or with err the exception's text
		err          bool
	}{
		{"valid", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", "abc", false},
		{"lower-case header, HTTP/1.0", "HTTP/1.0 200 OK\r\ncontent-length:3\r\nX: y\r\n\r\nabc", "abc", false},
		{"body in pieces", "HTTP/1.1 200 OK\r\nContent-Length: 20000\r\n\r\n" + strings.Repeat("z", 20000), strings.Repeat("z", 20000), false},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "connection closed after 3 of 10 body bytes", true},
		{"short body in the head's read", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "connection closed after 0 of 10 body bytes", true},
		{"longer than Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc", "more bytes than the Content-Length of 2", true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "no Content-Length", true},
		{"chunked and a length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", "no Content-Length", true},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\nabc", "bad Content-Length '-3'", true},
		{"another status", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\nno node up\r\n", "status 503: no node up", true},
		{"not HTTP", "SERVER_ERROR out of memory\r\n\r\n", "not an HTTP/1 answer", true},
		{"closed at once", "", "connection closed before the answer's head", true},
		{"head cut short", "HTTP/1.1 200 OK\r\nContent-Len", "connection closed before the answer's head", true},
		{"head over 64 KB", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 70000) + "\r\n\r\n", "the answer's head is over 64 KB", true},
	}
	const key = "a b/ü"
	const wantReq = "GET /a%20b%2F%C3%BC HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			got := make(chan string, 1)
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					got <- err.Error()
					return
				}
				defer conn.Close()
				r := bufio.NewReader(conn)
				var req strings.Builder
				for !strings.HasSuffix(req.String(), "\r\n\r\n") {
					line, err := r.ReadString('\n')
					req.WriteString(line)
					if err != nil {
						break
					}
				}
				got <- req.String()
				conn.Write([]byte(c.answer))
			}()
			res := streamGet(t, php, "tcp://"+ln.Addr().String(), 5, key)[0]
			if req := <-got; req != wantReq {
				t.Errorf("request %q, want %q", req, wantReq)
			}
			v, ok := res.value(t)
			switch {
			case c.err && (ok || !strings.Contains(res.Error, c.want)):
				t.Errorf("got %+v, want an exception with %q", res, c.want)
			case !c.err && (!ok || v != c.want):
				t.Errorf("got %+v, want the value %q", res, c.want)
			}
		})
	}
}

// TestPHPStreamClientDocumented: docs/php.md prints memcgate_get for users
// to copy; it must be the function the tests above run, comment and all.
func TestPHPStreamClientDocumented(t *testing.T) {
	src, err := os.ReadFile("../php/memcgate_get.php")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/php.md")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(src, []byte("/**"))
	if i < 0 {
		t.Fatal("memcgate_get.php has no /** comment before the function")
	}
	fn := bytes.TrimRight(src[i:], "\n")
	if !bytes.Contains(doc, append(append([]byte("```php\n"), fn...), "\n```\n"...)) {
		t.Error("docs/php.md does not print test/php/memcgate_get.php's functions (from the first /** comment to the end) as a php code block, unchanged")
	}
}

// startOneNodeGateway starts a memcached with args and a gateway in front
// of it alone, with env besides MEMCGATE_SERVERS.
func startOneNodeGateway(t *testing.T, env map[string]string, args ...string) *gateway {
	t.Helper()
	mc := memcachedtest.Start(t, args...)
	all := map[string]string{"MEMCGATE_SERVERS": mc.Addr}
	maps.Copy(all, env)
	return startGateway(t, all)
}
