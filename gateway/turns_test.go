package gateway

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/phpvalue"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// newTurnsStore returns a Store over one real memcached.
func newTurnsStore(t *testing.T) *upstream.Cluster {
	t.Helper()
	mc := memcachedtest.Start(t)
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, Timeout: 3 * time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// batchOf is a batch of one set of key to a value of n bytes of 'v'.
func batchOf(key string, n int) string {
	return `[{"op":"set","key":"` + key + `","value":"` + strings.Repeat("v", n) + `"}]`
}

// TestCPUTurns: the work on a request's bytes that costs many times
// reading them waits for a turn (cpuTurns) when it is on turnBytes or
// more: decoding a batch body, compressing a PUT's value with a PHP
// codec, decompressing a value a GET or multi-get reads. With every turn
// taken it answers 504 at the request's deadline (a multi-get, 504 for
// the key, and 503 for the answer, as for any deadline); with one free it is served. Smaller work, and large work
// that is cheap (a raw PUT, a value the codec does not compress), never
// waits.
func TestCPUTurns(t *testing.T) {
	c := newTurnsStore(t)
	zlib := Options{Codec: CodecPHP, PHP: PHPOptions{Compression: phpvalue.CompressZlib}}
	big := strings.Repeat("a", 512<<10) // inflates from a few hundred bytes
	tests := []struct {
		name         string
		opts         Options
		setup        string // a value PUT to key "big" first, turns free
		method, path string
		body         string
		busy         int    // the status with every turn taken
		inBody       string // what its answer's body holds
	}{
		{"batch of 1 KiB", Options{}, "", "POST", "/", batchOf("b1", 1<<10), 200, `"status":201`},
		{"batch just under turnBytes", Options{}, "", "POST", "/", batchOf("b15", turnBytes-64), 200, ""},
		{"batch of 20 KiB", Options{}, "", "POST", "/", batchOf("b20", 20<<10), 504, "deadline"},
		{"batch of 300 KiB", Options{}, "", "POST", "/", batchOf("b300", 300<<10), 504, "deadline"},
		{"raw PUT of 100 KiB", Options{}, "", "PUT", "/r100", strings.Repeat("x", 100<<10), 201, ""},
		{"php PUT of 1 KiB", zlib, "", "PUT", "/p1", strings.Repeat("x", 1<<10), 201, ""},
		{"php zlib PUT of 100 KiB", zlib, "", "PUT", "/pz100", strings.Repeat("x", 100<<10), 504, "deadline"},
		{"php FastLZ PUT of 100 KiB", Options{Codec: CodecPHP}, "", "PUT", "/pf100", strings.Repeat("x", 100<<10), 504, "deadline"},
		{"php uncompressed PUT of 100 KiB", Options{Codec: CodecPHP, PHP: PHPOptions{Compression: phpvalue.CompressNone}}, "", "PUT", "/pn100", strings.Repeat("x", 100<<10), 201, ""},
		{"pecl-memcache PUT of 100 KiB", Options{Codec: CodecPeclMemcache}, "", "PUT", "/m100", strings.Repeat("x", 100<<10), 504, "deadline"},
		{"GET of a compressed 512 KiB", zlib, big, "GET", "/big", "", 504, "deadline"},
		{"multi-get of a compressed 512 KiB", zlib, big, "GET", "/?key=big", "", 503, `"status":504`},
		{"GET of a compressed 4 KiB", zlib, strings.Repeat("a", 4<<10), "GET", "/big", "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			opts.MaxValueBytes, opts.RequestTimeout = 1<<20, 200*time.Millisecond
			h := NewHandler(c, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), opts)
			if tt.setup != "" {
				if w := do(h, "PUT", "/big", tt.setup); w.Code != 201 {
					t.Fatalf("setup PUT = %d %s", w.Code, w.Body)
				}
			}
			for range cap(h.h.turns) {
				h.h.turns <- struct{}{} // every turn taken
			}
			start := time.Now()
			w := do(h, tt.method, tt.path, tt.body)
			waited := time.Since(start)
			if w.Code != tt.busy || !strings.Contains(w.Body.String(), tt.inBody) {
				t.Errorf("with every turn taken = %d %.200s, want %d with %q", w.Code, w.Body, tt.busy, tt.inBody)
			}
			if tt.busy != 504 && tt.inBody != `"status":504` && waited > 100*time.Millisecond {
				t.Errorf("took %v with every turn taken; want no wait", waited)
			}
			<-h.h.turns // one free
			if w := do(h, tt.method, tt.path, tt.body); w.Code >= 300 || strings.Contains(w.Body.String(), `"status":504`) {
				t.Errorf("with a turn free = %d %.200s, want it served", w.Code, w.Body)
			}
			if n := len(h.h.turns); n != cap(h.h.turns)-1 {
				t.Errorf("%d turns held after the requests, want %d (the test's)", n, cap(h.h.turns)-1)
			}
		})
	}
}
