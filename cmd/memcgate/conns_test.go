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
	tr := newConnTracker()
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
# HELP memcgate_http_accept_errors_total Accept failures on the data listener's fast path that it waited out and retried, mostly a lack of file descriptors (EMFILE): more client connections than the open-file limit allows.
# TYPE memcgate_http_accept_errors_total counter
memcgate_http_accept_errors_total 0
# HELP memcgate_http_connections Client connections open on the data listener, by state: reading (a request, or a new connection's first bytes, not all here yet), idle (between requests), active (being served).
# TYPE memcgate_http_connections gauge
memcgate_http_connections{state="active"} 1
memcgate_http_connections{state="idle"} 1
memcgate_http_connections{state="reading"} 1
# HELP memcgate_http_connections_accepted_total Client connections accepted on the data listener.
# TYPE memcgate_http_connections_accepted_total counter
memcgate_http_connections_accepted_total 4
`
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = testutil.GatherAndCompare(reg, strings.NewReader(want)); err == nil {
			return
		}
	}
	t.Fatal(err)
}
