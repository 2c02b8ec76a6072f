package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
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

// TestExpectHeadsTakeNoHandover: clients that send the head of an
// "Expect: 100-continue" PUT (as curl -T and PHP's CURLOPT_PUT do for
// every upload) and never its body, more of them than net/http's share
// of the connection cap (a thirty-second of it, at least 64), do not
// make the gateway refuse another client's such PUT: the fast path
// answers 100 Continue itself, and the waiting heads hold no net/http
// goroutine. Handed to net/http, 64 such heads made every upload get
// 503 for the read timeout.
func TestExpectHeadsTakeNoHandover(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_MAX_CLIENT_CONNS": "200"})
	const held = 72
	for i := range held {
		c, _ := dialRaw(t, g.DataAddr)
		if _, err := io.WriteString(c, "PUT /held/"+strconv.Itoa(i)+" HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	c, br := dialRaw(t, g.DataAddr)
	// A client that waits for 100 Continue before it sends the body;
	// the heads above were sent before it, on connections of their own.
	io.WriteString(c, "PUT /exp/k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("beside %d held Expect heads: %v %v, want 100 Continue", held, resp, err)
	}
	io.WriteString(c, "hello")
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT: %v %v, want 201", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	io.WriteString(c, "GET /exp/k HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "hello" {
		t.Fatalf("GET after the PUT: %d %q", resp.StatusCode, body)
	}
}

// TestIdleLongHeadsTakeNoHandover: keep-alive clients that each sent one
// request with a head over 4 KiB (which the fast path hands to net/http)
// and stayed idle, more of them than net/http's share of the connection
// cap (a thirty-second of it, at least 64), do not make the gateway
// refuse another client's chunked PUT: the one idle the longest is closed
// to make room. Before, they held the share for MEMCGATE_IDLE_TIMEOUT
// (120 s), and every chunked upload and long head got 503.
func TestIdleLongHeadsTakeNoHandover(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_MAX_CLIENT_CONNS": "200"})
	longGet := "GET /lh/k HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", 5000) + "\r\n\r\n"
	// ask sends req on a new connection and reads its answer, again on a
	// new one after a 503 with Retry-After: net/http marks a connection
	// idle just after its answer is written, which the client may read
	// before.
	ask := func(req string) (*http.Response, *bufio.Reader) {
		t.Helper()
		for try := 0; ; try++ {
			c, br := dialRaw(t, g.DataAddr)
			io.WriteString(c, req)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || try == 50 {
				return resp, br
			}
			c.Close()
			time.Sleep(20 * time.Millisecond)
		}
	}
	const idle = 72
	for i := range idle {
		if resp, _ := ask(longGet); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("long GET %d: %s, want 404", i, resp.Status)
		}
	}
	resp, _ := ask("PUT /lh/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("chunked PUT beside %d idle connections handed to net/http: %s, want 201", idle, resp.Status)
	}
}

// TestDribblingUploadsTakeNoHandover: clients dribbling chunked uploads
// (a head, one byte of body, then nothing: net/http serves them, reading
// the body) on as many connections as net/http's share of the connection
// cap allows (a thirty-second of it, at least 64) do not make the gateway
// refuse another client's chunked PUT once they have moved less than
// 1 KiB/s for over a second: the slowest is closed to make room (one,
// counted in memcgate_http_connections_reclaimed_total). A fast upload
// held open beside them is not the one closed, and completes.
// Before, the dribblers held the share for MEMCGATE_READ_TIMEOUT (30 s),
// renewable, and every chunked upload and long head got 503.
func TestDribblingUploadsTakeNoHandover(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_MAX_CLIENT_CONNS": "200"})
	const share = 64 // handed over at MEMCGATE_MAX_CLIENT_CONNS=200
	chunkedHead := func(key string) string {
		return "PUT /dr/" + key + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	}
	fast, fastBr := dialRaw(t, g.DataAddr)
	fastBody := strings.Repeat("f", 256<<10)
	if _, err := io.WriteString(fast, chunkedHead("fast")+strconv.FormatInt(int64(len(fastBody)), 16)+"\r\n"+fastBody+"\r\n"); err != nil {
		t.Fatal(err)
	}
	dribblers := make([]net.Conn, share-1)
	for i := range dribblers {
		dribblers[i], _ = dialRaw(t, g.DataAddr)
		if _, err := io.WriteString(dribblers[i], chunkedHead("d"+strconv.Itoa(i))+"1\r\na\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	// Every connection of the share is net/http's, each reading its
	// body (active), before the dribblers have been below 1 KiB/s for
	// a second; until then no handover is over the share, and nothing
	// is closed for room.
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, g, `memcgate_http_connections{state="active"}`) < share {
		if time.Now().After(deadline) {
			t.Fatalf("%v connections active, want the %d uploads", metricValue(t, g, `memcgate_http_connections{state="active"}`), share)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond)
	c, br := dialRaw(t, g.DataAddr)
	io.WriteString(c, chunkedHead("new")+"5\r\nhello\r\n0\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("chunked PUT beside %d dribbled uploads: %v %v, want 201", share-1, resp, err)
	}
	if _, err := io.WriteString(fast, "0\r\n\r\n"); err != nil {
		t.Fatalf("finishing the fast upload: %v", err)
	}
	resp, err := http.ReadResponse(fastBr, nil)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("the fast upload beside the dribblers: %v %v, want 201", resp, err)
	}
	closed := 0
	for _, c := range dribblers {
		c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	if closed != 1 {
		t.Errorf("%d dribbled uploads closed, want 1 (one for the PUT served)", closed)
	}
	if n := metricValue(t, g, "memcgate_http_connections_reclaimed_total"); n != 1 {
		t.Errorf("memcgate_http_connections_reclaimed_total %v, want 1", n)
	}
}
