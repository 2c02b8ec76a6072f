package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
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

// TestQuietConnectionsGiveWay: on the listeners Go's net/http serves
// alone (TLS, FAST_PATH=false), connections that fill
// MEMCGATE_MAX_CLIENT_CONNS without sending a request (silent, or a TLS
// handshake begun and left) give way to a new client, as on the fast
// path: the one accepted first is closed to make room
// (memcgate_http_connections_reclaimed_total), and the new client is
// served, rather than closed unserved for as long as they stay, a header
// timeout each, again and again for an attacker who reopens them.
func TestQuietConnectionsGiveWay(t *testing.T) {
	mc := memcachedtest.Start(t)
	_, certFile, keyFile := writeCert(t)
	const max = 4
	for _, tc := range []struct {
		name string
		tls  bool
		env  map[string]string
	}{
		{name: "tls", tls: true, env: map[string]string{"MEMCGATE_TLS_CERT_FILE": certFile, "MEMCGATE_TLS_KEY_FILE": keyFile}},
		{name: "net_http", env: map[string]string{"MEMCGATE_FAST_PATH": "false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Its own gateway beside the other case's, on the shared
			// memcached: it mostly waits for the kernel to accept the
			// silent connections.
			t.Parallel()
			env := map[string]string{
				"MEMCGATE_SERVERS":          mc.Addr,
				"MEMCGATE_MAX_CLIENT_CONNS": strconv.Itoa(max),
				// Quiet connections would hold their places for a minute.
				"MEMCGATE_READ_HEADER_TIMEOUT": "60s",
			}
			for k, v := range tc.env {
				env[k] = v
			}
			scheme := "http"
			if tc.tls {
				scheme = "https"
			}
			g := startGatewayScheme(t, scheme, env)
			quiet := make([]net.Conn, max)
			for i := range quiet {
				c, err := net.Dial("tcp", g.DataAddr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				if i%2 == 1 && tc.tls {
					// The start of a TLS record, the handshake never done.
					c.Write([]byte{0x16, 0x03, 0x01, 0x00})
				} else if i%2 == 1 {
					io.WriteString(c, "GET / HTTP/1.1\r\nHo")
				}
				quiet[i] = c
			}
			// A silent connection is accepted once the kernel resends its
			// SYN-ACK (TCP_DEFER_ACCEPT): wait until all are.
			waitMetric(t, g, `memcgate_http_connections{state="reading"}`, max)

			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
			resp, err := client.Get(g.URL + "/absent")
			if err != nil {
				t.Fatalf("a client over %d quiet connections at the cap of %d was not served: %v", max, max, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("GET /absent = %d, want 404", resp.StatusCode)
			}
			waitMetric(t, g, "memcgate_http_connections_reclaimed_total", 1)
			// The one accepted first made room (silent ones are accepted
			// later than the others, so which one it is is not known
			// here): its close came before the count.
			closed := make(chan bool, max)
			for _, c := range quiet {
				go func() {
					c.SetReadDeadline(time.Now().Add(2 * time.Second))
					_, err := io.Copy(io.Discard, c)
					closed <- err == nil
				}()
			}
			n := 0
			for range quiet {
				if <-closed {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d quiet connections closed for room, want 1", n)
			}
			waitMetric(t, g, "memcgate_http_connections_refused_total", 0)
		})
	}
}

// waitMetric waits until the sample of the admin listener's /metrics
// named series (name and labels, exactly as exposed) is want.
func waitMetric(t *testing.T, g *gateway, series string, want float64) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	var got string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		text, err := g.Metrics(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no %s in /metrics", series)
		}
		if got = m[1]; got == strconv.FormatFloat(want, 'g', -1, 64) {
			return
		}
	}
	t.Fatalf("%s = %s, want %v", series, got, want)
}

// TestHTTP1Only: the gateway speaks HTTP/1.x alone (decisions/0038).
// Over TLS, ALPN offers http/1.1 alone (the admin listener's TLS is
// made alike): a client offering h2 too gets http/1.1 (Go's client then
// speaks HTTP/1.1), one offering h2 alone fails its handshake. HTTP/2
// with prior knowledge, over TLS or not, on the fast path or not, is
// answered 505 with why, and its connection closed.
func TestHTTP1Only(t *testing.T) {
	mc := memcachedtest.Start(t)
	_, certFile, keyFile := writeCert(t)
	for _, tc := range []struct {
		name string
		tls  bool
		env  map[string]string
	}{
		{name: "tls", tls: true, env: map[string]string{"MEMCGATE_TLS_CERT_FILE": certFile, "MEMCGATE_TLS_KEY_FILE": keyFile}},
		{name: "fast_path", env: map[string]string{}},
		{name: "net_http", env: map[string]string{"MEMCGATE_FAST_PATH": "false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"MEMCGATE_SERVERS": mc.Addr}
			for k, v := range tc.env {
				env[k] = v
			}
			scheme := "http"
			if tc.tls {
				scheme = "https"
			}
			g := startGatewayScheme(t, scheme, env)
			if tc.tls {
				c, err := tls.Dial("tcp", g.DataAddr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}})
				if err != nil {
					t.Fatal(err)
				}
				if p := c.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
					t.Errorf("ALPN gave %q to a client offering h2 and http/1.1, want http/1.1", p)
				}
				c.Close()
				c, err = tls.Dial("tcp", g.DataAddr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
				if err == nil {
					t.Errorf("a client offering h2 alone got through its handshake (ALPN %q)", c.ConnectionState().NegotiatedProtocol)
					c.Close()
				}
				client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
					TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}}
				resp, err := client.Get(g.URL + "/absent")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.ProtoMajor != 1 || resp.StatusCode != http.StatusNotFound {
					t.Errorf("GET /absent from Go's client ready for HTTP/2 = %s %d, want HTTP/1.1 404", resp.Proto, resp.StatusCode)
				}
			}

			// HTTP/2 with prior knowledge: the preface and an empty
			// SETTINGS frame.
			c, err := net.Dial("tcp", g.DataAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.tls {
				tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c = tc
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("HTTP/2 prior knowledge: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusHTTPVersionNotSupported || !strings.Contains(string(body), "HTTP/2 is not served") {
				t.Errorf("HTTP/2 prior knowledge = %d %q, want 505 saying HTTP/2 is not served", resp.StatusCode, body)
			}
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Errorf("the connection was not closed after the 505: %v", err)
			}
		})
	}
}
