package gateway

import (
	"bufio"
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/upstream/op"
)

// declineThenPanic declines every asynchronous call, so serveDetached
// falls back to the blocking Do in place, which panics (as panicStore's
// does on the routed path, where the observer answers 500).
type declineThenPanic struct{ panicStore }

func (declineThenPanic) DoAsync(context.Context, op.Op, func(op.Result)) bool { return false }

func startGatewayH1(t *testing.T, s Store, opts Options) (*h1.Server, *Handler, string) {
	t.Helper()
	log1 := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := NewHandler(s, log1, prometheus.NewRegistry(), opts)
	quiet := log.New(io.Discard, "", 0)
	srv := &h1.Server{Handler: h, Detached: h.ServeDetached, Fallback: &http.Server{Handler: h, ErrorLog: quiet}, ErrorLog: quiet, NewContext: h.NewContext}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return srv, h, ln.Addr().String()
}

func rawGet(t *testing.T, addr, path string) (*http.Response, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(3 * time.Second))
	io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// TestDetachedPanic: a panic while serving a detached request (here the
// Store's Get, in place after the Store declined GetAsync) is answered
// with 500 and ends the request as on the routed path: the MaxRequests
// slot, the in-flight gauge and the h1 connection are let go. (Found in
// review: all three leaked, and Shutdown never finished.)
func TestDetachedPanic(t *testing.T) {
	for _, noDetach := range []bool{true, false} {
		name := "routed"
		if !noDetach {
			name = "detached"
		}
		t.Run(name, func(t *testing.T) {
			s := declineThenPanic{panicStore{newFake()}}
			opts := Options{MaxRequests: 1}
			if !noDetach {
				opts.Async = s
			}
			srv, h, addr := startGatewayH1(t, s, opts)
			resp, err := rawGet(t, addr, "/k")
			if err != nil || resp.StatusCode != http.StatusInternalServerError {
				t.Errorf("GET whose Store panics = %v, %v; want 500", resp, err)
			}
			time.Sleep(20 * time.Millisecond)
			if g := testutil.ToFloat64(h.h.obs.inFlight); g != 0 {
				t.Errorf("memcgate_http_in_flight_requests = %v after the request ended, want 0", g)
			}
			if n := h.h.lim.lim.inFlight.Load(); n != 0 {
				t.Errorf("limiter count = %d after the request ended, want 0", n)
			}
			resp, err = rawGet(t, addr, "/k2")
			if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
				t.Errorf("second GET = %s: the MaxRequests slot of the first leaked", resp.Status)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown = %v: a connection never ended", err)
			}
		})
	}
}
