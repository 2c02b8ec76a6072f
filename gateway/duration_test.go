package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/test/gatewaytest"
)

// TestDurationCountsTheBody: a request's duration, in the access log
// (duration_ms) and memcgate_http_request_duration_seconds, counts from
// when its head was read, on every path: on the fast path a body read
// ahead of the handler, as it comes, is in it, as on Go's net/http,
// where the handler reads it. A PUT whose body comes a pause after its
// head lasts at least the pause.
func TestDurationCountsTheBody(t *testing.T) {
	const pause = 300 * time.Millisecond
	paths := []struct {
		name  string
		serve func(t *testing.T, h *Handler, headRead chan<- struct{}) string
	}{
		{"fast path, body read ahead", func(t *testing.T, h *Handler, headRead chan<- struct{}) string {
			quiet := log.New(io.Discard, "", 0)
			srv := &h1.Server{Handler: h, Detached: h.ServeDetached, Fallback: &http.Server{Handler: h, ErrorLog: quiet}, ErrorLog: quiet, NewContext: h.NewContext,
				BodyLimit: func(r *http.Request) int64 { // called once the head is read, before the body
					headRead <- struct{}{}
					return h.BodyLimit(r)
				}}
			return serveOn(t, srv.Serve, func() { srv.Close() })
		}},
		{"net/http", func(t *testing.T, h *Handler, headRead chan<- struct{}) string {
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				headRead <- struct{}{}
				h.ServeHTTP(w, r)
			})}
			return serveOn(t, srv.Serve, func() { srv.Close() })
		}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			var access gatewaytest.SyncBuffer
			reg := prometheus.NewRegistry()
			h := NewHandler(newFake(), slog.New(slog.NewTextHandler(io.Discard, nil)), reg, Options{AccessLog: true, AccessLogJSON: &access})
			headRead := make(chan struct{}, 1)
			c, err := net.Dial("tcp", p.serve(t, h, headRead))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "PUT /k HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n01234")
			select {
			case <-headRead:
			case <-time.After(10 * time.Second):
				t.Fatal("the head is not read")
			}
			end := time.Now().Add(pause)
			for now := time.Now(); !now.After(end); now = time.Now() {
				time.Sleep(end.Sub(now) + time.Millisecond)
			}
			io.WriteString(c, "56789")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				t.Fatalf("PUT = %s, want it stored", resp.Status)
			}
			var line struct {
				Status     int     `json:"status"`
				DurationMS float64 `json:"duration_ms"`
			}
			waitFor(t, "the access log line", func() bool { return access.String() != "" })
			if err := json.Unmarshal([]byte(access.String()), &line); err != nil {
				t.Fatalf("access log %q: %v", access.String(), err)
			}
			if min := float64(pause / time.Millisecond); line.DurationMS < min {
				t.Errorf("access log duration_ms = %v, want at least %v: the body's pause counted", line.DurationMS, min)
			}
			if sum := durationSum(t, reg, "PUT"); sum < pause.Seconds() {
				t.Errorf("memcgate_http_request_duration_seconds_sum{method=PUT} = %v, want at least %v", sum, pause.Seconds())
			}
		})
	}
}

// serveOn runs serve on a new loopback listener until the test ends,
// with stop, and returns its address.
func serveOn(t *testing.T, serve func(net.Listener) error, stop func()) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go serve(ln)
	t.Cleanup(stop)
	return ln.Addr().String()
}

// durationSum is the sum of memcgate_http_request_duration_seconds for
// method.
func durationSum(t *testing.T, reg *prometheus.Registry, method string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "memcgate_http_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && l.GetValue() == method {
					return m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	t.Fatalf("no memcgate_http_request_duration_seconds{method=%q}", method)
	return 0
}
