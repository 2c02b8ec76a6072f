package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
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
			g := panicguard.New(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
			logw := &panickyWriter{}
			b := budget.New(64 << 20)
			addr, _ := startStack(t, func(o *Options) {
				o.MaxRequests = 1 // a slot not given back refuses every request after it
				o.AccessLog, o.AccessLogJSON = true, logw
				o.Budget = b
				o.Panics = g
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
			if n := g.Stopped("detached_end"); n != 1 {
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

// panicOnce is a Store that panics on the first write of key, and on
// the first multi-key read of getKey, as a bug on the way to memcached
// would, and runs every other operation on its Store.
type panicOnce struct {
	Store
	key, getKey     string
	fired, getFired atomic.Bool
}

func (p *panicOnce) Do(ctx context.Context, o op.Op) op.Result {
	if o.Verb.Writes() && o.Item.Key == p.key && p.fired.CompareAndSwap(false, true) {
		panic("planted: Do")
	}
	return p.Store.Do(ctx, o)
}

func (p *panicOnce) GetMulti(ctx context.Context, keys []string, limit int, room op.Room) (map[string]op.Item, map[string]error) {
	if slices.Contains(keys, p.getKey) && p.getFired.CompareAndSwap(false, true) {
		panic("planted: GetMulti")
	}
	return p.Store.GetMulti(ctx, keys, limit, room)
}

// realStore is a cluster over a real memcached, with its registry.
func realStore(t *testing.T) (*upstream.Cluster, *prometheus.Registry) {
	t.Helper()
	mc := memcachedtest.Start(t)
	reg := prometheus.NewRegistry()
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}}, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, reg
}

// TestPanicInBatch: a batch's operations run on goroutines of their own,
// the reads of keys it does not write together as one multi-key read and
// each other key's operations in order; a panic there answers that
// goroutine's operations not yet done 500, the others as they went, and
// gives back the goroutine's turn (batchOps); it is counted in
// memcgate_panics_total{where="batch"}. Without the stop, the panic
// ended the process.
func TestPanicInBatch(t *testing.T) {
	c, reg := realStore(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g := panicguard.New(log, reg)
	h := NewHandler(&panicOnce{Store: c, key: "k", getKey: "m"}, log, reg, Options{Panics: g})
	tests := []struct {
		name string
		body string
		want []int
	}{
		{"per key", `{"ops":[{"op":"set","key":"a","value":"1"},{"op":"set","key":"k","value":"1"},{"op":"get","key":"k"}]}`, []int{201, 500, 500}},
		{"multi-key read", `{"ops":[{"op":"get","key":"a"},{"op":"get","key":"m"},{"op":"set","key":"b","value":"2"}]}`, []int{500, 500, 201}},
		{"after both", `{"ops":[{"op":"set","key":"k","value":"2"},{"op":"get","key":"k"},{"op":"get","key":"a"},{"op":"get","key":"m"}]}`, []int{201, 200, 200, 404}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(h, "POST", "/", tt.body)
			if w.Code != http.StatusOK {
				t.Fatalf("batch = %d %q, want 200", w.Code, w.Body.String())
			}
			res := decodeResults(t, w.Body.String())
			if len(res) != len(tt.want) {
				t.Fatalf("batch gave %d results, want %d", len(res), len(tt.want))
			}
			for j, r := range res {
				if r.Status != tt.want[j] {
					t.Errorf("op %d (%s) status = %d %q, want %d", j, r.Key, r.Status, r.Error, tt.want[j])
				}
			}
			if n := g.Stopped("batch"); n != float64(min(i+1, 2)) {
				t.Errorf(`memcgate_panics_total{where="batch"} = %v, want %d`, n, min(i+1, 2))
			}
			if n := len(h.h.batchOps); n != 0 {
				t.Errorf("%d batch turns held after the batch, want 0", n)
			}
		})
	}
}

// TestPanicApplyingAsyncWrite: an asynchronous write whose application
// panics on its worker counts as failed (reason error) and in
// memcgate_panics_total{where="async_write"}, gives back its place in
// the queue and its bytes of the budget, and its worker applies the
// writes after it. Without the stop, the panic ended the process.
func TestPanicApplyingAsyncWrite(t *testing.T) {
	c, reg := realStore(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g := panicguard.New(log, reg)
	b := budget.New(64 << 20)
	h := NewHandler(&panicOnce{Store: c, key: "k"}, log, reg, Options{AsyncWorkers: 1, Budget: b, Panics: g})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- h.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ran })
	for _, v := range []string{"first", "second"} {
		if w := asyncDo(h, "PUT", "/k", v); w.Code != http.StatusAccepted {
			t.Fatalf("PUT /k with Prefer: respond-async = %d, want 202", w.Code)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for h.h.async.queued.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := h.h.async.queued.Load(); n != 0 {
		t.Fatalf("%d writes still queued: the worker died", n)
	}
	if res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: "k"}}); res.Err != nil || string(res.Item.Value) != "second" {
		t.Errorf("k after the writes = %q, %v; want the second write's value", res.Item.Value, res.Err)
	}
	if n := testutil.ToFloat64(h.h.async.failed["error"]); n != 1 {
		t.Errorf(`memcgate_async_writes_failed_total{reason="error"} = %v, want 1`, n)
	}
	if n := g.Stopped("async_write"); n != 1 {
		t.Errorf(`memcgate_panics_total{where="async_write"} = %v, want 1`, n)
	}
	if u, q := b.Used(), h.h.async.bytes.Load(); u != 0 || q != 0 {
		t.Errorf("after the writes: budget holds %d bytes, the queue %d; want 0", u, q)
	}
}

// TestPanicAfterAnswerBegan: a handler that panics once its answer has
// begun cannot be answered 500; finishing the answer instead would pass
// its part off as the whole (a chunked body would get its last chunk, and
// the client would read a short value as complete). The connection is cut
// mid-answer, by h1 and by net/http alike, and the panic is counted.
func TestPanicAfterAnswerBegan(t *testing.T) {
	quiet := stdlog.New(io.Discard, "", 0)
	serve := map[string]func(h http.Handler, ln net.Listener) func(){
		"h1": func(h http.Handler, ln net.Listener) func() {
			srv := &h1.Server{Handler: h, Fallback: &http.Server{Handler: h, ErrorLog: quiet}, ErrorLog: quiet}
			go srv.Serve(ln)
			return func() { srv.Close() }
		},
		"net/http": func(h http.Handler, ln net.Listener) func() {
			srv := &http.Server{Handler: h, ErrorLog: quiet}
			go srv.Serve(ln)
			return func() { srv.Close() }
		},
	}
	for name, start := range serve {
		t.Run(name, func(t *testing.T) {
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			o := newObserver(logger, logger, prometheus.NewRegistry(), false, nil)
			h := o.middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/whole" {
					io.WriteString(w, "whole")
					return
				}
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, "part of a value")
				if err := http.NewResponseController(w).Flush(); err != nil {
					t.Errorf("flush: %v", err)
				}
				panic("boom")
			}))
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer start(h, ln)()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, "GET /part HTTP/1.1\r\nHost: x\r\n\r\nGET /whole HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("reading the head: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			if err == nil {
				t.Fatalf("the answer begun before the panic was finished: %d %q read whole, want the connection cut", resp.StatusCode, body)
			}
			if next, err := http.ReadResponse(br, nil); err == nil {
				t.Errorf("the connection served the next request (%d) after a cut answer", next.StatusCode)
			}
			if got := o.panics.Load(); got != 1 {
				t.Errorf("panics counted = %d, want 1", got)
			}
		})
	}
}
