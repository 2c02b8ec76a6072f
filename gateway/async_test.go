package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestAsyncSlowNodeKeepsToItsLane: a node that answers slowly, but well
// within the timeout (so it stays up), holds up and fills only its own
// lane. Its writes pile up until they hold their share of the queue and
// are refused with node_share; the other nodes' writes, sent while it
// happens, are all accepted and applied promptly. With the workers shared
// by every node, the slow node's writes took them all, and the healthy
// nodes' writes waited seconds behind them, then were refused.
func TestAsyncSlowNodeKeepsToItsLane(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	px := faultproxy.NewTCP(mcs[2].Addr)
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	_, portStr, _ := net.SplitHostPort(px.Addr())
	pxPort, _ := strconv.Atoi(portStr)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{
		Servers: []upstream.Server{{Host: "127.0.0.1", Port: mcs[0].Port}, {Host: "127.0.0.1", Port: mcs[1].Port}, {Host: "127.0.0.1", Port: pxPort}},
		Timeout: 500 * time.Millisecond,
		Health:  upstream.HealthOptions{Interval: 200 * time.Millisecond, Timeout: time.Second},
	}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ran })
	for deadline := time.Now().Add(5 * time.Second); !c.Ready(); {
		if time.Now().After(deadline) {
			t.Fatal("cluster not ready in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	const queue = 120
	h := NewHandler(c, log, reg, Options{Owners: c, AsyncWorkers: 9, AsyncQueue: queue})
	hctx, hstop := context.WithCancel(context.Background())
	hran := make(chan error)
	go func() { hran <- h.Run(hctx) }()
	drained := false
	drain := func() {
		if !drained {
			drained = true
			hstop()
			<-hran
		}
	}
	t.Cleanup(drain)

	// keysOf returns n keys whose home is node i (the proxied one is 2).
	keysOf := func(i, n int, prefix string) []string {
		var keys []string
		for k := 0; len(keys) < n; k++ {
			key := fmt.Sprint(prefix, k)
			if home, nodes := c.Owner(key); nodes != 3 {
				t.Fatalf("Owner(%q) says %d nodes, want 3", key, nodes)
			} else if home == i {
				keys = append(keys, key)
			}
		}
		return keys
	}
	put := func(key, value string) *httptest.ResponseRecorder { return asyncDo(h, "PUT", "/"+key, value) }
	get := func(key string) (string, error) {
		r := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: key}})
		return string(r.Item.Value), r.Err
	}

	px.SetLatency(100 * time.Millisecond) // 200 ms a round trip, under the 500 ms timeout
	slow := keysOf(2, queue, "slow")      // as many as the whole queue
	accepted := map[string]string{}
	for i, key := range slow {
		v := "s" + strconv.Itoa(i)
		switch w := put(key, v); w.Code {
		case http.StatusAccepted:
			accepted[key] = v
		case http.StatusServiceUnavailable:
			if !strings.Contains(w.Body.String(), "this key's memcached node") {
				t.Errorf("503 for a write of the slow node says %s; want it to name the node's share", w.Body)
			}
		default:
			t.Fatalf("async PUT %s = %d %s", key, w.Code, w.Body)
		}
	}
	applied := int(testutil.ToFloat64(h.h.async.applied)) // each made room for one more
	if n, want := len(accepted), int(shareOf(queue, 3)); n < want || n > want+applied {
		t.Errorf("slow node: %d writes accepted, want its share of the queue, %d, plus the %d applied meanwhile at most", n, want, applied)
	}
	if got := testutil.ToFloat64(h.h.async.rejectFor["node_share"]); got == 0 {
		t.Errorf(`rejected{reason="node_share"} = 0 with the slow node's writes past its share`)
	}

	// The healthy nodes' writes, while the slow node's pile up: every one
	// accepted, and readable soon after.
	const prompt = 2 * time.Second // half the slow node's backlog, 60 × 200 ms / 3 workers = 4 s
	for round := range 3 {
		for node := range 2 {
			for _, key := range keysOf(node, 20, fmt.Sprint("fast", round, "-")) {
				v := "f" + key
				start := time.Now()
				if w := put(key, v); w.Code != http.StatusAccepted {
					t.Fatalf("async PUT %s of a healthy node = %d %s, want 202", key, w.Code, w.Body)
				}
				for {
					got, err := get(key)
					if err == nil && got == v {
						break
					}
					if err != nil && !errors.Is(err, upstream.ErrNotFound) {
						t.Fatalf("Get(%q): %v", key, err)
					}
					if time.Since(start) > prompt {
						t.Fatalf("async write of %s (node %d) not applied after %v, while node 2 is slow", key, node, prompt)
					}
					time.Sleep(time.Millisecond)
				}
			}
		}
	}
	if got := testutil.ToFloat64(h.h.async.rejectFor["queue_full"]) + testutil.ToFloat64(h.h.async.rejectFor["key_share"]); got != 0 {
		t.Errorf("%v writes refused for queue_full or key_share, want 0", got)
	}
	for _, n := range c.Nodes() {
		if !n.Up {
			t.Errorf("node %s went down; the test wants it slow and up", n.Node)
		}
	}

	// Nothing accepted is forgotten: drained, every accepted write of the
	// slow node is in memcached.
	px.SetLatency(0)
	drain()
	for key, v := range accepted {
		if got, err := get(key); err != nil || got != v {
			t.Errorf("Get(%q) after drain = %q, %v; want %q", key, got, err, v)
		}
	}
}

// ownersFunc is an Owners made of a function.
type ownersFunc func(key string) (i, n int)

func (f ownersFunc) Owner(key string) (int, int) { return f(key) }

// byPrefix places "n<i>…" keys on node i of n.
func byPrefix(n int) Owners {
	return ownersFunc(func(key string) (int, int) { return int(key[1] - '0'), n })
}

// TestAsyncPlace: n nodes share the shards out in n parts; a node's
// writes wait only in its part.
func TestAsyncPlace(t *testing.T) {
	tests := []struct {
		name    string
		owners  Owners
		workers int
		key     string
		lane    int
		lo, hi  int // the shards of the key's lane, hi excluded
	}{
		{"no owners: one lane", nil, 8, "n2x", 0, 0, 8},
		{"node 0 of 3", byPrefix(3), 9, "n0x", 0, 0, 3},
		{"node 2 of 3", byPrefix(3), 9, "n2x", 2, 6, 9},
		{"node 1 of 3, uneven", byPrefix(3), 8, "n1x", 1, 2, 5},
		{"more nodes than workers share", byPrefix(8), 4, "n7x", 3, 3, 4},
		{"an owner out of range: lane 0 of 1", ownersFunc(func(string) (int, int) { return 5, 3 }), 8, "k", 0, 0, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			h := NewHandler(newFake(), log, prometheus.NewRegistry(), Options{Owners: tt.owners, AsyncWorkers: tt.workers})
			for k := range 50 {
				key := tt.key + strconv.Itoa(k)
				ln, sh, _ := h.h.async.place(key)
				if ln != tt.lane || sh < tt.lo || sh >= tt.hi {
					t.Fatalf("place(%q) = lane %d, shard %d; want lane %d, a shard in [%d, %d)", key, ln, sh, tt.lane, tt.lo, tt.hi)
				}
			}
		})
	}
}

// TestAsyncBatchPlacesKeyOnce: a batch's writes of one key wait in one
// lane and shard even when the server list changes under the batch
// (here, every Owner call answers another list): two lanes would apply
// them in either order.
func TestAsyncBatchPlacesKeyOnce(t *testing.T) {
	calls := 0
	changing := ownersFunc(func(string) (int, int) {
		calls++
		return calls % 2, 2 // node 1 of 2, then node 0, ...
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := NewHandler(newFake(), log, prometheus.NewRegistry(), Options{Owners: changing, AsyncWorkers: 8}) // not running: writes wait
	if w := asyncDo(h, "POST", "/", `[{"op":"set","key":"k","value":"1"},{"op":"set","key":"k","value":"2"}]`); w.Code != 202 {
		t.Fatalf("async batch = %d %s", w.Code, w.Body)
	}
	holding := 0
	for _, sh := range h.h.async.shards {
		if n := len(sh.jobs); n > 0 {
			holding++
			if n != 2 || sh.jobs[0].lane != sh.jobs[1].lane {
				t.Errorf("a shard holds %d of the key's writes, lanes %v; want both, in one lane", n, sh.jobs)
			}
		}
	}
	if holding != 1 {
		t.Errorf("%d shards hold the key's writes, want 1", holding)
	}
}

// TestAsyncNodeShare: the writes waiting for one node take at most its
// share of the queue (half with 3 nodes), in writes and in bytes, and are
// refused past it with node_share; the other nodes' writes are accepted.
func TestAsyncNodeShare(t *testing.T) {
	tests := []struct {
		name    string
		queue   int
		bytes   int64
		hot     []int // sizes of the writes to node 2
		wantHot []int
		other   int // size of a write to the other nodes
		workers int
	}{
		{name: "writes", queue: 160, bytes: 1 << 20, hot: ones(81), wantHot: append(codes(202, 80), 503), other: 1, workers: 48}, // a worker's keys may hold 20
		{name: "bytes", queue: 64, bytes: 1000, hot: []int{300, 200, 1}, wantHot: []int{202, 202, 503}, other: 200, workers: 3},  // one worker a node
		{name: "one write past the share fits an empty node", queue: 64, bytes: 1000, hot: []int{900, 1}, wantHot: []int{202, 503}, other: 50, workers: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			h := NewHandler(newFake(), log, prometheus.NewRegistry(), Options{Owners: byPrefix(3), AsyncQueue: tt.queue, AsyncQueueBytes: tt.bytes, AsyncWorkers: tt.workers}) // not running: writes wait
			put := func(key string, size int) *httptest.ResponseRecorder {
				return asyncDo(h, "PUT", "/"+key, strings.Repeat("v", size))
			}
			for i, size := range tt.hot {
				w := put("n2-"+strconv.Itoa(i), size)
				if w.Code != tt.wantHot[i] {
					t.Errorf("async PUT %d of node 2 = %d %s, want %d", i, w.Code, w.Body, tt.wantHot[i])
				}
				if w.Code == 503 && !strings.Contains(w.Body.String(), "this key's memcached node") {
					t.Errorf("503 says %q; want it to name the node's share", w.Body)
				}
			}
			if got := testutil.ToFloat64(h.h.async.rejectFor["node_share"]); got != 1 {
				t.Errorf(`rejected{reason="node_share"} = %v, want 1`, got)
			}
			for _, key := range []string{"n0-a", "n1-a"} {
				if w := put(key, tt.other); w.Code != 202 {
					t.Errorf("async PUT of %s, another node's key, = %d %s", key, w.Code, w.Body)
				}
			}
		})
	}
}

// ones is n writes of one byte.
func ones(n int) []int { return codes(1, n) }

// codes is n times c.
func codes(c, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = c
	}
	return out
}

func TestAsyncFailReason(t *testing.T) {
	tests := []struct {
		name string
		v    op.Verb
		err  error
		want string
	}{
		{"no node", op.Set, upstream.ErrNoNodes, "node_down"},
		{"slow node past its share", op.Set, &upstream.BusyError{Node: "n:1", Share: 5000}, "busy"},
		{"deadline", op.Delete, context.DeadlineExceeded, "timeout"},
		{"connection", op.Set, &upstream.NodeError{Node: "n:1", Op: "set", Err: io.EOF}, "connection"},
		{"refused", op.Set, upstream.ErrTooLarge, "refused"},
		{"out of memory", op.Set, fmt.Errorf("%w: set n:1", upstream.ErrNoMemory), "refused"},
		{"an error line", op.Set, fmt.Errorf("%w: set n:1: SERVER_ERROR busy", upstream.ErrServer), "error"},
	}
	for _, tt := range tests {
		if got := asyncFailReason(tt.v, tt.err); got != tt.want {
			t.Errorf("%s: asyncFailReason = %q, want %q", tt.name, got, tt.want)
		}
		if !slices.Contains(asyncFailReasons, tt.want) {
			t.Errorf("%s: %q is not among asyncFailReasons", tt.name, tt.want)
		}
	}
}

// asyncDo sends h one request with Prefer: respond-async.
func asyncDo(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Prefer", "respond-async")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestAsyncTimeoutFollowsSetLimits: a request timeout changed live (a
// reload of MEMCGATE_REQUEST_TIMEOUT) bounds the asynchronous writes
// applied after it too (their wait for a slow node's turn, the codec), not
// only the requests.
func TestAsyncTimeoutFollowsSetLimits(t *testing.T) {
	mc := memcachedtest.Start(t)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := NewHandler(c, log, reg, Options{RequestTimeout: time.Minute})
	h.SetLimits(0, 3*time.Second, false)
	if got := time.Duration(h.h.async.timeout.Load()); got != 3*time.Second {
		t.Errorf("asynchronous writes' deadline after SetLimits = %v, want 3s", got)
	}
	h.SetLimits(0, 0, false) // 0: unchanged
	if got := time.Duration(h.h.async.timeout.Load()); got != 3*time.Second {
		t.Errorf("asynchronous writes' deadline after SetLimits(0) = %v, want 3s kept", got)
	}
}

// TestAsyncDeleteOfAbsentKeyApplied: an asynchronous DELETE of a key
// memcached does not hold leaves the key absent, as asked: it counts as
// applied, not as a failure, which the log warned about and
// MemcgateAsyncWritesFailing alerted on for every invalidation of a key
// already gone. A write memcached refuses (an add of a key it holds)
// still counts as refused.
func TestAsyncDeleteOfAbsentKeyApplied(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := newUDPRig(t, mc, 0)
	g.async(t, "DELETE", "/never-written", "")
	g.async(t, "POST", "/", `{"ops":[{"op":"delete","key":"gone"},{"op":"set","key":"held","value":"v"},{"op":"add","key":"held","value":"w"}]}`)
	g.drain()
	if got := g.counter(t, "memcgate_async_writes_failed_total"); got != 1 {
		t.Errorf("failed = %v, want 1 (the add of a key memcached holds): deletes of absent keys leave them absent", got)
	}
	if got := g.counter(t, "memcgate_async_writes_applied_total"); got != 3 {
		t.Errorf("applied = %v, want 3", got)
	}
}

// TestAsyncWorkersOnDemand: the queue's workers are goroutines only while
// their shards have writes: none run once Run starts, an asynchronous
// write starts its shard's, which applies it and ends after waiting its
// idle time with nothing more, and a later write starts one again.
// A worker for every shard started by Run would wait, 512 of them by
// default, with no write coming.
func TestAsyncWorkersOnDemand(t *testing.T) {
	const workers = 64
	mc := memcachedtest.Start(t)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := NewHandler(c, log, reg, Options{AsyncWorkers: workers})
	q := h.h.async
	q.idle = 200 * time.Millisecond
	working := func() (n int) {
		for _, sh := range q.shards {
			sh.mu.Lock()
			if sh.working {
				n++
			}
			sh.mu.Unlock()
		}
		return n
	}
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()
	for open := 0; open < workers; { // until Run has opened every shard
		open = 0
		for _, sh := range q.shards {
			sh.mu.Lock()
			if sh.open {
				open++
			}
			sh.mu.Unlock()
		}
		runtime.Gosched()
	}
	if n, g := working(), runtime.NumGoroutine()-before; n != 0 || g >= workers {
		t.Fatalf("once Run runs, with no write: %d workers, %d more goroutines; want none, and fewer than %d", n, g, workers)
	}
	for i, v := range []string{"first", "second"} {
		if w := asyncDo(h, "PUT", "/od", v); w.Code != http.StatusAccepted {
			t.Fatalf("async PUT %q = %d %q, want 202", v, w.Code, w.Body)
		}
		if n := working(); n != 1 {
			t.Errorf("after async write %d: %d workers, want 1", i+1, n)
		}
		deadline := time.Now().Add(10 * time.Second)
		for working() != 0 || do(h, "GET", "/od", "").Body.String() != v {
			if time.Now().After(deadline) {
				t.Fatalf("after async write %d: %d workers and GET %q 10s later; want none and %q", i+1, working(), do(h, "GET", "/od", "").Body, v)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestAsyncWorkersRetireUnderPushes: writes pushed while their shard's
// worker ends (an idle time of a millisecond, so that workers end and
// start again all through) are all applied while Run runs, each key's
// last write last: no write is left in a shard without a worker. An attack on the workers
// started on demand; it held (docs/benchmarks.md).
func TestAsyncWorkersRetireUnderPushes(t *testing.T) {
	const workers, writers, writes = 8, 8, 400
	mc := memcachedtest.Start(t)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := NewHandler(c, log, reg, Options{AsyncWorkers: workers})
	q := h.h.async
	q.idle = time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- h.Run(ctx) }()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range writes {
				key := "/r" + strconv.Itoa(w) + "-" + strconv.Itoa(i%10)
				if rw := asyncDo(h, "PUT", key, strconv.Itoa(i)); rw.Code != http.StatusAccepted {
					t.Errorf("async PUT %s = %d %q, want 202", key, rw.Code, rw.Body)
					return
				}
				// About the idle time, so that pushes meet workers
				// as they end.
				time.Sleep(time.Duration(800+(i*37+w*101)%400) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	// Applied while Run runs, not by its drain: a write left in a shard
	// whose worker ended waits for the next push to that shard.
	for deadline := time.Now().Add(10 * time.Second); q.queued.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes still queued 10 s after the last 202", q.queued.Load())
		}
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run() = %v", err)
	}
	if n, b := q.queued.Load(), q.bytes.Load(); n != 0 || b != 0 {
		t.Errorf("after Run: %d writes, %d bytes queued, want none", n, b)
	}
	for _, sh := range q.shards {
		if len(sh.jobs) != 0 {
			t.Errorf("a shard holds %d jobs after Run", len(sh.jobs))
		}
	}
	mcc := memcache.New(mc.Addr)
	for w := range writers {
		for k := range 10 {
			key := "r" + strconv.Itoa(w) + "-" + strconv.Itoa(k)
			last := writes - 10 + k
			if it, err := mcc.Get(key); err != nil || string(it.Value) != strconv.Itoa(last) {
				t.Errorf("%s: %v, want its last write %d", key, err, last)
			}
		}
	}
	var applied float64
	if mfs, err := reg.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "memcgate_async_writes_applied_total" {
				applied = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
	}
	if applied != writers*writes {
		t.Errorf("applied %v, want %d", applied, writers*writes)
	}
}

// TestAsyncAcceptedWhileRunDrains: a write whose enqueue passed the
// shutdown check before Run began to drain, and pushes only after (a
// handler still running when the data server was closed at the shutdown
// timeout), is applied before Run returns: its 202 is kept. The enqueue
// is held between the check and the push by the lock of its key's
// WriteOrder shard, which it takes in between.
func TestAsyncAcceptedWhileRunDrains(t *testing.T) {
	mc := memcachedtest.Start(t)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := NewHandler(c, log, reg, Options{AsyncWorkers: 4})
	q := h.h.async
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- h.Run(ctx) }()

	_, osh := q.order.where("late")
	osh.mu.Lock()
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- asyncDo(h, "PUT", "/late", "kept") }()
	for q.queued.Load() == 0 { // past the shutdown check, at the lock
		time.Sleep(time.Millisecond)
	}
	cancel()
	returned := false
	select {
	case err := <-ran: // it drained without the write
		returned = true
		if err != nil {
			t.Errorf("Run() = %v", err)
		}
	case <-time.After(200 * time.Millisecond):
	}
	osh.mu.Unlock()
	if w := <-answered; w.Code != http.StatusAccepted {
		t.Fatalf("async PUT = %d %q, want 202", w.Code, w.Body)
	}
	if !returned {
		if err := <-ran; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}
	if got := counterValue(t, reg, "memcgate_async_writes_applied_total"); got != 1 {
		t.Errorf("once Run returned: applied = %v, want 1 (the write answered 202)", got)
	}
	if w := do(h, "GET", "/late", ""); w.Code != http.StatusOK || w.Body.String() != "kept" {
		t.Errorf("GET /late = %d %q, want 200 \"kept\"", w.Code, w.Body)
	}
}
