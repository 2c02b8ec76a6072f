package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestConnectionsClosedCounted: every connection the gateway closes before
// a handler sees its request (a request the server answers itself, 400 or
// 431; a head or a new connection's first bytes not there within the
// header timeout; nothing within the idle timeout) shows in
// memcgate_http_connections_closed_total by listener and reason, on the
// fast path, on net/http serving alone (FAST_PATH=false, TLS), and on the
// admin listener; a served request and a client closing its connection are not
// counted. None of them reach the access log or the request metrics.
func TestConnectionsClosedCounted(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	mc := memcachedtest.Start(t)
	_, certFile, keyFile := writeCert(t)
	for _, tc := range []struct {
		name string
		tls  bool
		env  map[string]string
	}{
		{name: "fast_path", env: map[string]string{}},
		{name: "net_http", env: map[string]string{"MEMCGATE_FAST_PATH": "false"}},
		{name: "tls", tls: true, env: map[string]string{"MEMCGATE_TLS_CERT_FILE": certFile, "MEMCGATE_TLS_KEY_FILE": keyFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{
				"MEMCGATE_SERVERS":             mc.Addr,
				"MEMCGATE_READ_HEADER_TIMEOUT": "300ms",
				"MEMCGATE_IDLE_TIMEOUT":        "300ms",
			}
			for k, v := range tc.env {
				env[k] = v
			}
			scheme := "http"
			if tc.tls {
				scheme = "https"
			}
			g := startGatewayScheme(t, scheme, env)
			// dialRaw connects over TCP; dial over TLS too on the
			// data listener of the tls case.
			dialRaw := func(addr string) net.Conn {
				t.Helper()
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			dial := func(addr string) net.Conn {
				t.Helper()
				c := dialRaw(addr)
				if !tc.tls || addr != g.DataAddr {
					return c
				}
				tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				return tc
			}
			// answer sends req and reads the status of its answer.
			answer := func(c net.Conn, req string) int {
				t.Helper()
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("%.40q: %v", req, err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			// closed waits until the server closes c.
			closed := func(c net.Conn) {
				t.Helper()
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.Copy(io.Discard, c); err != nil {
					t.Fatalf("waiting for the server to close: %v", err)
				}
			}

			bad := []string{
				"GET /a HTTP/1.1\r\nHost: a\r\nNo colon here\r\n\r\n",
				"GET /a HTTP/1.1\r\nHost: a\r\nX-Long: " + strings.Repeat("x", 40<<10) + "\r\n\r\n",
			}
			for _, req := range bad {
				c := dial(g.DataAddr)
				if code := answer(c, req); code != 400 && code != 431 {
					t.Errorf("%.40q = %d, want 400 or 431", req, code)
				}
			}
			closed(dialRaw(g.DataAddr)) // silent (no TLS handshake either): the header timeout
			idle := dial(g.DataAddr)
			if code := answer(idle, "GET /absent HTTP/1.1\r\nHost: a\r\n\r\n"); code != 404 {
				t.Errorf("GET /absent = %d, want 404", code)
			}
			closed(idle) // the idle timeout
			partial := dial(g.DataAddr)
			io.WriteString(partial, "GET /absent HTTP/1.1\r\nHo")
			closed(partial) // the header timeout, mid-head
			gone := dial(g.DataAddr)
			answer(gone, "GET /absent HTTP/1.1\r\nHost: a\r\n\r\n")
			gone.Close() // the client's doing: not counted

			if code := answer(dial(g.AdminAddr), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nNo colon here\r\n\r\n"); code != 400 {
				t.Errorf("a bad request to the admin listener = %d, want 400", code)
			}

			want := map[string]float64{
				`listener="data",reason="bad_request"`:     2,
				`listener="data",reason="header_timeout"`:  2,
				`listener="data",reason="idle_timeout"`:    1,
				`listener="admin",reason="bad_request"`:    1,
				`listener="admin",reason="header_timeout"`: 0,
				`listener="admin",reason="idle_timeout"`:   0,
			}
			// The server counts a connection once it has closed it,
			// after the client may see the close: wait for the counts.
			// A scrape that fails (the machine is busy) is tried again.
			var got map[string]float64
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				var err error
				got, err = closedCounts(g)
				if err != nil {
					t.Log(err)
				}
				if fmt.Sprint(got) == fmt.Sprint(want) || time.Now().After(deadline) {
					break
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("memcgate_http_connections_closed_total = %v, want %v", got, want)
			}
		})
	}
}

var closedSample = regexp.MustCompile(`(?m)^memcgate_http_connections_closed_total\{(.*)\} (\S+)$`)

// closedCounts scrapes memcgate_http_connections_closed_total's series.
func closedCounts(g *gateway) (map[string]float64, error) {
	text, err := g.Metrics(context.Background())
	if err != nil {
		return nil, err
	}
	counts := map[string]float64{}
	for _, m := range closedSample.FindAllStringSubmatch(text, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, err
		}
		counts[m[1]] = v
	}
	return counts, nil
}
