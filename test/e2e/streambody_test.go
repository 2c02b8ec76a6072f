package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestBigPutReadTimeout: a PUT of a value in chunks, whose body the
// handler streams to memcached as it comes rather than reading it ahead,
// is bounded by MEMCGATE_READ_TIMEOUT counted from the start of the
// request, as the docs promise, on the fast path as on Go's net/http
// (FAST_PATH=false):
//
//   - a client trickling its body gets 408 saying why, nothing is stored,
//     and on the fast path its connection lingers after the answer: the
//     client can go on sending and reads the answer and a clean close,
//     not a reset;
//   - a client whose head takes longer than the read timeout is closed
//     at the read timeout, unanswered as a late head is, even with a
//     longer header timeout set: the read timeout counts the head too,
//     and nothing is stored, with a Content-Length and with a chunked
//     body (which the fast path hands over to net/http).
//
// The test waits on answers; the only waits on the clock are the slow
// client's own.
func TestBigPutReadTimeout(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	const readTimeout = time.Second
	mc := memcachedtest.Start(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{name: "fast_path", env: map[string]string{}},
		{name: "net_http", env: map[string]string{"MEMCGATE_FAST_PATH": "false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{
				"MEMCGATE_SERVERS":             mc.Addr,
				"MEMCGATE_READ_HEADER_TIMEOUT": "10s",
				"MEMCGATE_READ_TIMEOUT":        readTimeout.String(),
				"MEMCGATE_BIG_VALUE_MAX_BYTES": strconv.Itoa(8 << 20),
			}
			for k, v := range tc.env {
				env[k] = v
			}
			g := startGateway(t, env)

			t.Run("trickle", func(t *testing.T) {
				const size = 4 << 20
				c, br := dialRaw(t, g.DataAddr)
				c.SetDeadline(time.Now().Add(30 * time.Second))
				fmt.Fprintf(c, "PUT /trickled-%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", tc.name, g.DataAddr, size)
				if _, err := c.Write(bytes.Repeat([]byte("a"), 64<<10)); err != nil {
					t.Fatal(err)
				}
				// The client sends a little at a time, never all of it, until
				// it has read the answer.
				stop, stopped := make(chan struct{}), make(chan struct{})
				go func() {
					defer close(stopped)
					tick := time.NewTicker(20 * time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-stop:
							return
						case <-tick.C:
							c.Write(bytes.Repeat([]byte("a"), 1<<10))
						}
					}
				}()
				resp, err := http.ReadResponse(br, nil)
				close(stop)
				<-stopped
				if err != nil {
					t.Fatalf("a trickling body: %v; want a 408", err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "MEMCGATE_READ_TIMEOUT") || !resp.Close {
					t.Fatalf("a trickling body: %d %q, %v, Connection: close %v; want 408 saying why, closing", resp.StatusCode, body, err, resp.Close)
				}
				// The client goes on sending a while, then stops. On the fast
				// path the gateway lingers: every write goes through, and the
				// connection then closes cleanly. (net/http lingers 500 ms.)
				var werr error
				for range 5 {
					time.Sleep(20 * time.Millisecond) // the client's pace
					if _, err := c.Write(bytes.Repeat([]byte("a"), 1<<10)); err != nil && werr == nil {
						werr = err
					}
				}
				c.(*net.TCPConn).CloseWrite()
				_, rerr := io.Copy(io.Discard, br)
				if tc.name == "fast_path" && (werr != nil || rerr != nil) {
					t.Errorf("after the 408: writing %v, reading %v; want the gateway to linger and close cleanly", werr, rerr)
				}
				if r := g.do("GET", "/trickled-"+tc.name, nil); r.status != http.StatusNotFound {
					t.Errorf("GET after the 408 = %d, want 404: nothing stored", r.status)
				}
			})

			// Both framings: a chunked body's connection the fast path
			// hands over to net/http once it has read the head.
			for _, chunked := range []bool{false, true} {
				t.Run(fmt.Sprintf("slow head/chunked=%v", chunked), func(t *testing.T) {
					const size = 2 << 20
					key := fmt.Sprintf("/slowhead-%s-%v", tc.name, chunked)
					c, br := dialRaw(t, g.DataAddr)
					// Past the read timeout, short of the header timeout.
					c.SetDeadline(time.Now().Add(8 * time.Second))
					start := time.Now()
					fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: %s\r\n", key, g.DataAddr)
					// The head ends well after the read timeout, counted from
					// when the connection was opened.
					time.Sleep(time.Until(start.Add(5 * readTimeout / 2)))
					go func() { // fails once the gateway closes
						body := bytes.Repeat([]byte("s"), size)
						if chunked {
							fmt.Fprintf(c, "Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", size, body)
							return
						}
						fmt.Fprintf(c, "Content-Length: %d\r\n\r\n", size)
						c.Write(body)
					}()
					resp, err := http.ReadResponse(br, nil)
					if err == nil {
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						t.Fatalf("a head that took longer than the read timeout: %d %q; want the connection closed at the read timeout", resp.StatusCode, body)
					}
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						t.Fatalf("a head that took longer than the read timeout: still open after %s (%v); want it closed at the read timeout, long before the 10 s header timeout", time.Since(start).Round(time.Millisecond), err)
					}
					if r := g.do("GET", key, nil); r.status != http.StatusNotFound {
						t.Errorf("GET after the 408 = %d, want 404: nothing stored", r.status)
					}
				})
			}
		})
	}
}
