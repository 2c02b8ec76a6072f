package gateway

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// panickyWriter is an access log writer that panics on each write while
// armed, as a broken log destination or a bug in the line's formatting
// would, on whatever goroutine ends the request.
type panickyWriter struct {
	armed  atomic.Bool
	lines  atomic.Int64
	panics atomic.Int64
}

func (w *panickyWriter) Write(b []byte) (int, error) {
	if w.armed.Load() {
		w.panics.Add(1)
		panic("planted: access log write")
	}
	w.lines.Add(1)
	return len(b), nil
}

// TestPanicEndingDetachedRequest: a panic while a detached request ends
// (its access log line written on memcached's reply reader, or for a
// large value on the goroutine that writes it) is stopped there: the
// client gets the response it was sent, whole, on a connection that
// serves its next request; the request's MaxRequests slot and its bytes
// of the budget are given back; the panic is counted in
// memcgate_panics_total{where="detached_end"}; and other clients, on
// connections open before and opened after, are served. Without the
// stop, the panic ended the process.
func TestPanicEndingDetachedRequest(t *testing.T) {
	tests := []struct {
		name string
		size int
	}{
		{"on the reply reader", 400},
		{"large, on its own goroutine", 2 * largeValue}, // held in the budget while written
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			logw := &panickyWriter{}
			b := budget.New(64 << 20)
			addr, _ := startStack(t, func(o *Options) {
				o.MaxRequests = 1 // a slot not given back refuses every request after it
				o.AccessLog, o.AccessLogJSON = true, logw
				o.Budget = b
				o.Panics = panicguard.New(slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
			})
			value := strings.Repeat("v", tt.size)
			a, other := dialKeepAlive(t, addr), dialKeepAlive(t, addr)
			if st, _ := a.do(t, "PUT", "/k", value); st/100 != 2 {
				t.Fatalf("PUT /k = %d", st)
			}
			if st, body := a.do(t, "GET", "/k", ""); st != http.StatusOK || body != value {
				t.Fatalf("GET /k = %d, %d bytes", st, len(body))
			}
			logw.armed.Store(true)
			st, body := a.do(t, "GET", "/k", "")
			logw.armed.Store(false)
			if st != http.StatusOK || body != value {
				t.Errorf("GET /k whose access log line panicked = %d, %d bytes; want 200 and the value", st, len(body))
			}
			if n := logw.panics.Load(); n != 1 {
				t.Fatalf("the access log panicked %d times, want 1", n)
			}
			if n := panicsTotal(t, reg, "detached_end"); n != 1 {
				t.Errorf(`memcgate_panics_total{where="detached_end"} = %v, want 1`, n)
			}
			if u := b.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the request ended, want 0", u)
			}
			for _, c := range []*keepAlive{a, other, dialKeepAlive(t, addr)} {
				if st, body := c.do(t, "GET", "/k", ""); st != http.StatusOK || body != value {
					t.Errorf("GET /k after the panic = %d, %d bytes; want 200 and the value", st, len(body))
				}
			}
		})
	}
}

// keepAlive is a client connection that sends one request at a time.
type keepAlive struct {
	c  net.Conn
	br *bufio.Reader
}

func dialKeepAlive(t *testing.T, addr string) *keepAlive {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &keepAlive{c: c, br: bufio.NewReader(c)}
}

// do sends a request with body (none if empty) and returns its
// response's status and body.
func (k *keepAlive) do(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	k.c.SetDeadline(time.Now().Add(5 * time.Second))
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\n", method, path)
	if method == "PUT" {
		req += fmt.Sprintf("Content-Length: %d\r\n", len(body))
	}
	if _, err := io.WriteString(k.c, req+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, path, err)
	}
	return resp.StatusCode, string(b)
}

// panicsTotal is memcgate_panics_total{where} on reg.
func panicsTotal(t *testing.T, reg *prometheus.Registry, where string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "memcgate_panics_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "where" && l.GetValue() == where {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
