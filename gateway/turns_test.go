package gateway

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/phpvalue"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// newTurnsStore returns a Store over one real memcached, whose answers
// may take as long as a loaded machine makes them: the tests' deadlines
// are the requests'.
func newTurnsStore(t *testing.T) *upstream.Cluster {
	t.Helper()
	mc := memcachedtest.Start(t)
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, Timeout: time.Minute},
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
// taken it answers 504 at the request's deadline (a multi-get: 504 for
// the key, and 503 for the answer, as for any deadline), and holds no
// more of the budget while it waits than its body's buffer (a GET: not
// the value it would inflate to); with one free it is served. Smaller
// work, and large work that is cheap (a raw PUT, a value the codec does
// not compress), never waits: it is served with every turn taken, which
// only work that takes no turn can be, since the test holds them all
// until the answer and a wait ends only at the deadline, in a 504. The
// work that must wait gets a short deadline; the rest a long one, so
// that a loaded machine cannot make a 504 of the work under test.
func TestCPUTurns(t *testing.T) {
	const (
		busyTimeout   = 200 * time.Millisecond // the deadline of work that waits for a turn
		servedTimeout = 20 * time.Second       // of work that is served: longer than any stall
	)
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
			bg := budget.New(64 << 20)
			opts.MaxValueBytes, opts.RequestTimeout, opts.Budget = 1<<20, servedTimeout, bg
			h := NewHandler(c, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), opts)
			if tt.setup != "" {
				if w := do(h, "PUT", "/big", tt.setup); w.Code != 201 {
					t.Fatalf("setup PUT = %d %s", w.Code, w.Body)
				}
			}
			waits := tt.busy == 504 || tt.inBody == `"status":504`
			if waits {
				h.SetLimits(0, busyTimeout, false)
			}
			for range cap(h.h.turns) {
				h.h.turns <- struct{}{} // every turn taken, till the answer
			}
			done := make(chan *httptest.ResponseRecorder)
			go func() { done <- do(h, tt.method, tt.path, tt.body) }()
			if waits {
				time.Sleep(busyTimeout / 2)
				if held, most := bg.Used(), int64(2*len(tt.body)+64<<10); tt.busy == 504 && held > most {
					t.Errorf("%d bytes of the budget held while waiting for a turn, want at most %d (the body's buffer)", held, most)
				}
			}
			w := <-done
			if w.Code != tt.busy || !strings.Contains(w.Body.String(), tt.inBody) {
				t.Errorf("with every turn taken = %d %.200s, want %d with %q", w.Code, w.Body, tt.busy, tt.inBody)
			}
			h.SetLimits(0, servedTimeout, false)
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

// TestAsyncBatchRefusedBeforeDecoding: an asynchronous batch the queue has
// no room for, in its count of writes, is refused (503) before its body
// is decoded: a body that would fail to decode only at its end answers
// 503, not 400, and the refusal counts its writes. One that may fit is
// decoded as before.
func TestAsyncBatchRefusedBeforeDecoding(t *testing.T) {
	c := newTurnsStore(t)
	badEnd := func(keys []string) string { // sets of keys, then data after the JSON value
		var b strings.Builder
		b.WriteString(`{"ops":[`)
		for i, k := range keys {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(`{"op":"set","key":"` + k + `","value":"\u00e9 {[\"]}"}`)
		}
		b.WriteString(`]} x`)
		return b.String()
	}
	tests := []struct {
		name     string
		queued   int // single async PUTs queued first, of a queue of 3
		batch    int // sets in the batch
		want     int
		rejected float64 // memcgate_async_writes_rejected_total{reason="queue_full"}
	}{
		{"full queue", 3, 1, 503, 1},
		{"room for 1, batch of 2", 2, 2, 503, 2},
		{"room for 1, batch of 1", 2, 1, 400, 0},
		{"empty queue, batch of 3", 0, 3, 400, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			h := NewHandler(c, slog.New(slog.NewTextHandler(io.Discard, nil)), reg, Options{AsyncQueue: 3}) // not running: writes wait
			// Keys of workers of their own: a worker's share of so small
			// a queue is one write, and two keys of one worker would get
			// 503 key_share before the check this test is about.
			keys := keysOfDistinctWorkers(t, h.h.async, tt.queued+tt.batch)
			for _, k := range keys[:tt.queued] {
				if w := do(h, "PUT", "/"+k, "v", "Prefer", "respond-async"); w.Code != 202 {
					t.Fatalf("queueing = %d %s", w.Code, w.Body)
				}
			}
			w := do(h, "POST", "/", badEnd(keys[tt.queued:]), "Prefer", "respond-async")
			if w.Code != tt.want {
				t.Errorf("= %d %s, want %d", w.Code, w.Body, tt.want)
			}
			if got := testutil.ToFloat64(h.h.async.rejectFor["queue_full"]); got != tt.rejected {
				t.Errorf("queue_full rejections = %v, want %v", got, tt.rejected)
			}
		})
	}
}

// keysOfDistinctWorkers returns n keys whose asynchronous writes wait for
// n different workers of q.
func keysOfDistinctWorkers(t *testing.T, q *asyncQueue, n int) []string {
	t.Helper()
	var keys []string
	taken := map[int]bool{}
	for i := 0; len(keys) < n && i < 10000; i++ {
		k := "k" + strconv.Itoa(i)
		if _, sh, _ := q.place(k); !taken[sh] {
			taken[sh] = true
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("found %d keys of distinct workers, want %d", len(keys), n)
	}
	return keys
}

// TestOpsIn: opsIn counts the operations decodeBatch would find, whatever
// the strings hold.
func TestOpsIn(t *testing.T) {
	tests := []struct {
		body string
		want int
	}{
		{`[]`, 0},
		{`null`, 0},
		{`{"ops":[]}`, 0},
		{`[{"op":"get","key":"a"}]`, 1},
		{` [ {"op":"get"} , {"op":"get"} ] `, 2},
		{`{"ops":[{"op":"get"},{"op":"get"},{"op":"get"}]}`, 3},
		{`[{"op":"cas","key":"a","cas":{"x":[{},{}]}}]`, 1},
		{`{"ops":[{"op":"cas","cas":{"x":{}}},{"op":"get"}]}`, 2},
		{`[{"op":"set","value":"{[\"{\\\\\"}]"},{"key":"}}]]"}]`, 2},
		{`[{"op":"set","value":"\u00e9\u00e9"}] x`, 1},
		{`[{"op":"set","value":"unterminated`, 1},
		{`]]]{`, 0},
	}
	for _, tt := range tests {
		if got := opsIn([]byte(tt.body)); got != tt.want {
			t.Errorf("opsIn(%s) = %d, want %d", tt.body, got, tt.want)
		}
	}
}
