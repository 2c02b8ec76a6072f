package main

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestConnTracker checks memcgate_http_connections and _accepted_total on
// the net/http path (FAST_PATH=false): a silent new connection, an idle
// one, an active one, and a closed one that is counted only as accepted.
func TestConnTracker(t *testing.T) {
	release := make(chan struct{})
	tr := newConnTracker(0)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			<-release
		}
	}))
	srv.Config.ConnState = tr.hook
	srv.Start()
	defer srv.Close()
	defer close(release)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(tr)

	dial := func() net.Conn {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	get := func(c net.Conn, path string) {
		c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: a\r\n\r\n"))
	}
	dial() // silent
	idle := dial()
	get(idle, "/")
	if _, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil {
		t.Fatal(err)
	}
	get(dial(), "/block")
	closed := dial()
	get(closed, "/")
	http.ReadResponse(bufio.NewReader(closed), nil)
	closed.Close()

	want := `
# HELP memcgate_http_accept_errors_total Accept failures on the data listener that the server waited out and retried, mostly a lack of file descriptors (EMFILE): more client connections than the open-file limit allows.
# TYPE memcgate_http_accept_errors_total counter
memcgate_http_accept_errors_total 0
# HELP memcgate_http_bad_requests_total Requests answered 400 and their connections closed before any handler, so in no access log line or request metric: heads the fast path cannot read, and framing a proxy in front may read differently (Content-Length with Transfer-Encoding, Transfer-Encoding on HTTP/1.0 or not ending in chunked, a folded header line). The fast path's share of memcgate_http_connections_closed_total{listener="data",reason="bad_request"}.
# TYPE memcgate_http_bad_requests_total counter
memcgate_http_bad_requests_total 0
# HELP memcgate_http_bodies_waiting_for_room Request bodies waiting, their connections parked, for room in MEMCGATE_MAX_BUFFERED_BYTES to be read (fast path; at most MEMCGATE_REQUEST_TIMEOUT each, then 503). Counted among the reading connections too.
# TYPE memcgate_http_bodies_waiting_for_room gauge
memcgate_http_bodies_waiting_for_room 0
# HELP memcgate_http_connections Client connections open on the data listener, by state: reading (a request, or a new connection's first bytes, not all here yet), idle (between requests), active (being served).
# TYPE memcgate_http_connections gauge
memcgate_http_connections{state="active"} 1
memcgate_http_connections{state="idle"} 1
memcgate_http_connections{state="reading"} 1
# HELP memcgate_http_connections_accepted_total Client connections accepted on the data listener.
# TYPE memcgate_http_connections_accepted_total counter
memcgate_http_connections_accepted_total 4
# HELP memcgate_http_connections_closed_total Client connections the server closed before any handler saw a request on them, so in no access log line or request metric, by listener and reason: bad_request (a request answered 400, 431, 501 or 417 by the server itself: a head it cannot read or over MEMCGATE_MAX_HEADER_BYTES, framing a proxy in front may read differently), header_timeout (a request head, or a new connection's first bytes, not all there within MEMCGATE_READ_HEADER_TIMEOUT), idle_timeout (no request within MEMCGATE_IDLE_TIMEOUT of the last).
# TYPE memcgate_http_connections_closed_total counter
memcgate_http_connections_closed_total{listener="admin",reason="bad_request"} 0
memcgate_http_connections_closed_total{listener="admin",reason="header_timeout"} 0
memcgate_http_connections_closed_total{listener="admin",reason="idle_timeout"} 0
memcgate_http_connections_closed_total{listener="data",reason="bad_request"} 0
memcgate_http_connections_closed_total{listener="data",reason="header_timeout"} 0
memcgate_http_connections_closed_total{listener="data",reason="idle_timeout"} 0
# HELP memcgate_http_connections_max The cap on client connections open at once over the data listeners (MEMCGATE_MAX_CLIENT_CONNS; 0: none).
# TYPE memcgate_http_connections_max gauge
memcgate_http_connections_max 0
# HELP memcgate_http_connections_reclaimed_total Client connections closed to make room for a new one at the MEMCGATE_MAX_CLIENT_CONNS cap (idle ones, or ones that sent no complete request head nor finished a TLS handshake yet), or for a request the fast path hands to net/http at its share of the cap (idle ones net/http serves, or with none idle the slowest below 1 KiB/s).
# TYPE memcgate_http_connections_reclaimed_total counter
memcgate_http_connections_reclaimed_total 0
# HELP memcgate_http_connections_refused_total New client connections closed at the MEMCGATE_MAX_CLIENT_CONNS cap with no idle or silent one to make room (answered 503 on the fast path).
# TYPE memcgate_http_connections_refused_total counter
memcgate_http_connections_refused_total 0
# HELP memcgate_http_handovers_refused_total Requests the fast path hands to Go's net/http (chunked bodies, heads over 4 KiB) answered 503 instead, because a thirty-second of the connection cap were net/http's already, none idle or below 1 KiB/s.
# TYPE memcgate_http_handovers_refused_total counter
memcgate_http_handovers_refused_total 0
`
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = testutil.GatherAndCompare(reg, strings.NewReader(want)); err == nil {
			return
		}
	}
	t.Fatal(err)
}
