package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// startStack serves a Handler on h1 over a real memcached with pipelined
// connections and detached responses, set up as cmd/memcgate sets them
// up, with the handler's Options changed by mod (if not nil), and
// returns the server's address and the cluster.
func startStack(tb testing.TB, mod func(*Options)) (string, *upstream.Cluster) {
	tb.Helper()
	return startStackOn(tb, []*memcachedtest.Server{memcachedtest.Start(tb)}, nil, mod)
}

// startStackOn is startStack over the memcached servers nodes, with the
// cluster's Options changed by upMod (if not nil).
func startStackOn(tb testing.TB, nodes []*memcachedtest.Server, upMod func(*upstream.Options), mod func(*Options)) (string, *upstream.Cluster) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	uo := upstream.Options{PipelineConns: 2, BatchGets: true, Timeout: time.Second}
	for _, m := range nodes {
		uo.Servers = append(uo.Servers, upstream.Server{Host: "127.0.0.1", Port: m.Port})
	}
	if upMod != nil {
		upMod(&uo)
	}
	c, err := upstream.New(uo, lg, reg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	opts := Options{Async: c}
	if mod != nil {
		mod(&opts)
	}
	h := NewHandler(c, lg, reg, opts)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- h.Run(ctx) }()
	tb.Cleanup(func() { stop(); <-ran })
	quiet := log.New(io.Discard, "", 0)
	std := &http.Server{Handler: h, ErrorLog: quiet, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	srv := &h1.Server{
		Handler: h, Detached: h.ServeDetached, BodyLimit: h.BodyLimit, NewContext: h.NewContext,
		ReadHeaderTimeout: std.ReadHeaderTimeout, ReadTimeout: std.ReadTimeout, WriteTimeout: std.WriteTimeout, IdleTimeout: std.IdleTimeout,
		Fallback: std, ErrorLog: quiet,
	}
	// The handler's byte budget and body buffers are the server's too,
	// as cmd/memcgate shares them.
	if opts.Budget != nil {
		srv.Budget = opts.Budget
	}
	if bs, ok := opts.Buffers.(h1.Buffers); ok && bs != nil {
		srv.Buffers = bs
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), c
}

// stackClient is a keep-alive client that allocates nothing per request.
type stackClient struct {
	c  net.Conn
	br *bufio.Reader
}

func newStackClient(tb testing.TB, addr string) *stackClient {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return &stackClient{c: c, br: bufio.NewReaderSize(c, 8<<10)}
}

// get sends req and reads its response, which must be 200 with a
// Content-Length.
func (c *stackClient) get(tb testing.TB, req []byte) {
	if _, err := c.c.Write(req); err != nil {
		tb.Fatal(err)
	}
	n := -1
	for first := true; ; first = false {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			tb.Fatal(err)
		}
		if first && !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
			tb.Fatalf("status line %q", line)
		}
		if len(line) == 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	if _, err := c.br.Discard(n); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkStackGet is a keep-alive GET hit through the whole gateway, as
// wrk sends it: h1, the handler's detached path, the pipelined memcached
// client and a real memcached, with a 96-character key and a 400-byte
// value. allocs/op and B/op are the whole process's per request (the
// client here allocates none); ns/op is a round trip, client included.
func BenchmarkStackGet(b *testing.B) {
	addr, c := startStack(b, nil)
	if res := c.Do(b.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: benchKey, Value: []byte(strings.Repeat("v", 400))}}); res.Err != nil {
		b.Fatal(res.Err)
	}
	req := []byte("GET /" + benchKey + " HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n")
	b.Run("serial", func(b *testing.B) {
		cl := newStackClient(b, addr)
		cl.get(b, req) // the connection's first request is not the one measured
		b.ReportAllocs()
		for b.Loop() {
			cl.get(b, req)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			cl := newStackClient(b, addr)
			for pb.Next() {
				cl.get(b, req)
			}
		})
	})
}
