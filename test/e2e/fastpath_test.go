package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestFastPathHandsOverMidConnection runs one keepalive connection through
// the binary: simple requests (served by gateway/h1), then a chunked PUT
// with a GET pipelined behind it (outside h1's subset: the connection goes
// to net/http with the bytes already read), an Expect: 100-continue PUT,
// and simple requests again on the same connection. Every answer must be
// right on both sides of the handover, and the same with
// MEMCGATE_FAST_PATH=false.
func TestFastPathHandsOverMidConnection(t *testing.T) {
	mc := memcachedtest.Start(t)
	type want struct {
		status int
		body   string
	}
	steps := []struct {
		name  string
		write string
		want  []want // final responses to read, in order
	}{
		{"simple PUT", "PUT /hk/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst", []want{{201, ""}}},
		{"simple GET", "GET /hk/a HTTP/1.1\r\nHost: x\r\n\r\n", []want{{200, "first"}}},
		{"chunked PUT with a GET pipelined behind it",
			"PUT /hk/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nchu\r\n4\r\nnked\r\n0\r\n\r\n" +
				"GET /hk/b HTTP/1.1\r\nHost: x\r\n\r\n", []want{{201, ""}, {200, "chunked"}}},
		{"expect head", "PUT /hk/c HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 6\r\n\r\n", []want{{100, ""}}},
		{"expect body", "contin", []want{{201, ""}}},
		{"simple GET after both", "GET /hk/c HTTP/1.1\r\nHost: x\r\n\r\n", []want{{200, "contin"}}},
		{"simple GET of the first key", "GET /hk/a HTTP/1.1\r\nHost: x\r\n\r\n", []want{{200, "first"}}},
	}
	for _, fast := range []string{"true", "false"} {
		t.Run("FAST_PATH="+fast, func(t *testing.T) {
			g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_FAST_PATH": fast})
			c, br := dialRaw(t, g.DataAddr)
			for _, s := range steps {
				if _, err := io.WriteString(c, s.write); err != nil {
					t.Fatalf("%s: write: %v", s.name, err)
				}
				for _, w := range s.want {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("%s: reading the answer: %v", s.name, err)
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != w.status || string(body) != w.body {
						t.Fatalf("%s: %d %q %v, want %d %q", s.name, resp.StatusCode, body, err, w.status, w.body)
					}
				}
			}
		})
	}
}

// dialRaw opens a keepalive connection for raw HTTP/1.1, closed when the
// test ends, with a 10 s deadline on everything.
func dialRaw(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}
