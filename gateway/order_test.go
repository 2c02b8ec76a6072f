package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestSyncWriteFollowsAsync: a synchronous write of a key sent after an
// asynchronous write of it was accepted (202) is applied after it, so
// that the key ends with the synchronous write's value, whatever path
// serves the synchronous write: the routed REST path, the detached fast
// path (h1), a batch, a value in chunks, and a route writing beside the
// REST API through WriteOrder.Ordered (as the HttpMemc endpoints do). The
// asynchronous write waits behind filler writes on the queue's one
// worker, so that without the wait the synchronous write lands first in
// nearly every round.
func TestSyncWriteFollowsAsync(t *testing.T) {
	order := NewWriteOrder()
	var ordered Doer
	g := newBigRig(t, func(o *Options, c *upstream.Cluster) {
		o.AsyncWorkers = 1
		o.Async = c // detached responses where served by h1
		o.WriteOrder = order
		ordered = order.Ordered(c)
		o.Routes = []Route{{
			// A set as /memc?cmd=set does it: through the store
			// Ordered wraps, beside the REST API.
			Owns:    func(p string) bool { return p == "/set-beside" },
			MaxBody: 1 << 10,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				v, _ := io.ReadAll(r.Body)
				res := ordered.Do(r.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: r.URL.Query().Get("key"), Value: v}})
				if res.Err != nil {
					http.Error(w, res.Err.Error(), http.StatusGatewayTimeout)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}),
		}}
	})
	h1URL := "http://" + g.serveH1()
	h1Client := &http.Client{}
	t.Cleanup(h1Client.CloseIdleConnections)

	big := strings.Repeat("B", 3*rigChunk) // stored in chunks (putBig)
	// fillers is an asynchronous batch of n sets of other keys, which the
	// queue's one worker applies before the write under test.
	fillers := func(n int) string {
		var b strings.Builder
		b.WriteString("[")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"op":"set","key":"filler%d","value":"x"}`, i)
		}
		b.WriteString("]")
		return b.String()
	}

	type step struct {
		method, path, body string
		async              bool
		want               int
	}
	tests := []struct {
		name   string
		h1     bool
		first  step
		second step
		want   string // the key's value after both; "" for none
	}{
		{"async PUT, PUT", false, step{"PUT", "/k", "A", true, 202}, step{"PUT", "/k", "B", false, 201}, "B"},
		{"async PUT, detached PUT", true, step{"PUT", "/k", "A", true, 202}, step{"PUT", "/k", "B", false, 201}, "B"},
		{"async DELETE, PUT", true, step{"DELETE", "/k", "", true, 202}, step{"PUT", "/k", "B", false, 201}, "B"},
		{"async PUT, DELETE", true, step{"PUT", "/k", "A", true, 202}, step{"DELETE", "/k", "", false, 204}, ""},
		{"async PUT, batch set", true, step{"PUT", "/k", "A", true, 202}, step{"POST", "/", `[{"op":"set","key":"k","value":"B"}]`, false, 200}, "B"},
		{"async PUT, incr", true, step{"PUT", "/k", "41", true, 202}, step{"POST", "/k?op=incr", "", false, 200}, "42"},
		{"async PUT, PUT in chunks", false, step{"PUT", "/k", "A", true, 202}, step{"PUT", "/k", big, false, 201}, big},
		{"async PUT, set beside the REST API", true, step{"PUT", "/k", "A", true, 202}, step{"PUT", "/set-beside?key=k", "B", false, 201}, "B"},
	}
	const rounds = 100 // without the wait nearly every round loses the synchronous write
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, client := g.url, g.client
			if tt.h1 {
				base, client = h1URL, h1Client
			}
			send := func(s step) (int, string) {
				t.Helper()
				req, err := http.NewRequest(s.method, base+s.path, strings.NewReader(s.body))
				if err != nil {
					t.Fatal(err)
				}
				req.ContentLength = int64(len(s.body))
				if s.async {
					req.Header.Set("Prefer", "respond-async")
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", s.method, s.path, err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			ahead := fillers(30)
			wrong := 0
			for i := range rounds {
				if code, body := send(step{"POST", "/", ahead, true, 202}); code != 202 {
					t.Fatalf("async filler batch = %d %s", code, body)
				}
				if code, body := send(tt.first); code != tt.first.want {
					t.Fatalf("round %d: %s %s = %d %s, want %d", i, tt.first.method, tt.first.path, code, body, tt.first.want)
				}
				code, _ := send(tt.second) // a 404 too if it went first (DELETE, incr)
				for g.h.h.async.queued.Load() > 0 {
					time.Sleep(100 * time.Microsecond)
				}
				got, value := send(step{"GET", "/k", "", false, 0})
				if code != tt.second.want || tt.want == "" && got != 404 || tt.want != "" && (got != 200 || value != tt.want) {
					wrong++
				}
				send(step{"DELETE", "/k", "", false, 0})
			}
			if wrong > 0 {
				t.Errorf("%d of %d rounds: the key did not end with the synchronous write's outcome (the earlier asynchronous write landed after it)", wrong, rounds)
			}
		})
	}
	if n := testutil.ToFloat64(order.ran); n == 0 {
		t.Errorf(`memcgate_sync_writes_waited_total{result="ran"} = 0 after %d rounds of synchronous writes behind asynchronous ones`, rounds*len(tests))
	}
}

// TestSyncWriteBehindStuckAsyncTimesOut: a synchronous write behind an
// asynchronous write memcached does not answer waits until its request's
// deadline, then gets 504 naming what it waited for, and is never sent.
func TestSyncWriteBehindStuckAsyncTimesOut(t *testing.T) {
	mc := memcachedtest.Start(t)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 1, Timeout: 10 * time.Second}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := NewHandler(c, log, reg, Options{AsyncWorkers: 1, RequestTimeout: 10 * time.Second})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- h.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ran })

	// The request's deadline, far shorter than the 10 s of the write
	// queued before it: a write that waited for that one would answer
	// seconds past the bound below.
	const deadline = 300 * time.Millisecond
	mc.Pause()
	resumed := false
	defer func() {
		if !resumed {
			mc.Resume()
		}
	}()
	if w := asyncDo(h, "PUT", "/stuck", "A"); w.Code != http.StatusAccepted {
		t.Fatalf("async PUT = %d %s", w.Code, w.Body)
	}
	start := time.Now()
	w := httptest.NewRecorder()
	rctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	h.ServeHTTP(w, httptest.NewRequestWithContext(rctx, "PUT", "/stuck", strings.NewReader("B")))
	took := time.Since(start)
	if w.Code != http.StatusGatewayTimeout || !strings.Contains(w.Body.String(), "asynchronous writes of this key") {
		t.Errorf("PUT behind a stuck async write = %d %q, want 504 saying it waited for the key's asynchronous writes", w.Code, w.Body)
	}
	if took < deadline || took > deadline+3*time.Second {
		t.Errorf("PUT behind a stuck async write answered after %v, want about its deadline, %v", took, deadline)
	}
	if n := testutil.ToFloat64(h.h.ex.order.timedOut); n != 1 {
		t.Errorf(`memcgate_sync_writes_waited_total{result="deadline"} = %v, want 1`, n)
	}
	mc.Resume()
	resumed = true
	for h.h.async.queued.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: "stuck"}})
	if res.Err == nil && bytes.Equal(res.Item.Value, []byte("B")) {
		t.Errorf("the key holds the 504'd write's value %q: it was sent", res.Item.Value)
	}
	if h.h.ex.order.pending("stuck") {
		t.Error("the key still has asynchronous writes pending after the queue drained")
	}
}

// BenchmarkWriteOrderWaitNone is what a synchronous write pays when no
// asynchronous write of its key is pending: a hash and an atomic load.
func BenchmarkWriteOrderWaitNone(b *testing.B) {
	w := NewWriteOrder()
	w.accepted("another key") // pending elsewhere
	ctx := context.Background()
	for b.Loop() {
		if err := w.wait(ctx, "users/1234/profile"); err != nil {
			b.Fatal(err)
		}
	}
}

// blockOldStore holds up the set of "old" until release, so that a
// test can move its key to another node meanwhile.
type blockOldStore struct {
	*fakeStore
	release, blocked chan struct{}
	once             sync.Once
}

func (s *blockOldStore) Do(ctx context.Context, o op.Op) op.Result {
	if o.Verb == op.Set && string(o.Item.Value) == "old" {
		s.once.Do(func() { close(s.blocked) })
		<-s.release
	}
	return s.fakeStore.Do(ctx, o)
}

// orderWaiters is how many synchronous writes of key wait in w.
func orderWaiters(w *WriteOrder, key string) int {
	_, sh := w.where(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.keys[key].waiters)
}

// TestSyncWriteWaitsAcrossLanes: a reload that moves a key to another
// node puts its later asynchronous writes on another worker, which may
// apply one before an earlier one on the first worker is done; a
// synchronous write accepted after the earlier one must still wait for
// it, not go once as many writes as came before it were applied.
func TestSyncWriteWaitsAcrossLanes(t *testing.T) {
	s := &blockOldStore{fakeStore: newFake(), release: make(chan struct{}), blocked: make(chan struct{})}
	var lane atomic.Int32
	owners := ownersFunc(func(string) (int, int) { return int(lane.Load()), 2 })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	order := NewWriteOrder()
	h := NewHandler(s, log, prometheus.NewRegistry(), Options{Owners: owners, AsyncWorkers: 2, RequestTimeout: 5 * time.Second, WriteOrder: order})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- h.Run(ctx) }()
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(s.release) }) }
	defer func() { release(); cancel(); <-ran }() // Run drains the queue: old must go
	if w := asyncDo(h, "PUT", "/k", "old"); w.Code != http.StatusAccepted {
		t.Fatalf("async PUT old: %d", w.Code)
	}
	<-s.blocked
	done := make(chan int, 1)
	go func() { done <- do(h, "PUT", "/k", "new").Code }()
	waitFor(t, "the synchronous PUT to wait for old", func() bool { return orderWaiters(order, "k") == 1 })
	lane.Store(1) // a reload moves the key's node
	if w := asyncDo(h, "PUT", "/k", "mid"); w.Code != http.StatusAccepted {
		t.Fatalf("async PUT mid: %d", w.Code)
	}
	select {
	case code := <-done:
		t.Fatalf("the synchronous PUT answered %d while the asynchronous write before it was still being applied", code)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if code := <-done; code != http.StatusCreated {
		t.Fatalf("synchronous PUT: %d, want 201", code)
	}
	if got := do(h, "GET", "/k", ""); got.Body.String() != "new" {
		t.Errorf("the key holds %q after 202 (old), 202 (mid), 201 (new); want new", got.Body.String())
	}
}
