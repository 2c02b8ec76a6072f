package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestBodyTimeoutAnswered408: a request whose body stops short of its
// Content-Length is answered 408, with a body that says why and
// Connection: close, once MEMCGATE_READ_TIMEOUT has passed, alike on the
// fast path and on Go's net/http (FAST_PATH=false). The request shows in
// the access log and in memcgate_http_requests_total as any answered
// one, and not in memcgate_http_connections_closed_total: a handler saw
// it. The test waits on the answer and on the counts, never on a sleep.
func TestBodyTimeoutAnswered408(t *testing.T) {
	mc := memcachedtest.Start(t)
	answers := map[string]string{}
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
				"MEMCGATE_READ_HEADER_TIMEOUT": "500ms",
				"MEMCGATE_READ_TIMEOUT":        "500ms",
			}
			for k, v := range tc.env {
				env[k] = v
			}
			g := startGateway(t, env)
			c, err := net.Dial("tcp", g.DataAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(c, "PUT /stalled-body HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\n0123456789", g.DataAddr)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("a body stopped at 10 of 100 bytes: %v; want a 408", err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("reading the 408's body: %v", err)
			}
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "MEMCGATE_READ_TIMEOUT") {
				t.Fatalf("a body stopped at 10 of 100 bytes: %d %q; want 408 saying why", resp.StatusCode, body)
			}
			if !resp.Close {
				t.Errorf("408 without Connection: close (header %v)", resp.Header)
			}
			answers[tc.name] = fmt.Sprintf("%d %q %s", resp.StatusCode, body, resp.Header.Get("Content-Type"))
			// The gateway closes its side after the answer: the client's
			// close ends any lingering at once.
			c.(*net.TCPConn).CloseWrite()
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Errorf("waiting for the gateway to close after the 408: %v", err)
			}

			// The access log line is written after the answer, and the
			// counts are scraped: wait for them.
			logged := func() bool {
				for _, l := range strings.Split(g.Logs(), "\n") {
					if strings.Contains(l, `"msg":"request"`) && strings.Contains(l, `"method":"PUT"`) && strings.Contains(l, `"status":408`) {
						return true
					}
				}
				return false
			}
			for deadline := time.Now().Add(20 * time.Second); !logged(); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no access log line for the 408:\n%s", g.Logs())
				}
			}
			var got, closed float64
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				got = metric(t, g, "memcgate_http_requests_total", `{code="408",method="PUT"}`)
				if got == 1 || time.Now().After(deadline) {
					break
				}
			}
			if got != 1 {
				t.Errorf(`memcgate_http_requests_total{code="408",method="PUT"} = %v, want 1`, got)
			}
			closed = metric(t, g, "memcgate_http_connections_closed_total", `{listener="data",reason="header_timeout"}`)
			if closed > 0 {
				t.Errorf(`memcgate_http_connections_closed_total{listener="data",reason="header_timeout"} = %v, want 0: the request was answered`, closed)
			}
		})
	}
	if a, b := answers["fast_path"], answers["net_http"]; a != "" && b != "" && a != b {
		t.Errorf("the fast path answers %s, net/http %s; want them alike", a, b)
	}
}
