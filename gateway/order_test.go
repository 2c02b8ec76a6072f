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
// asynchronous write waits on the queue's one worker behind a write to
// another node, stopped (SIGSTOP), which resumes only once the
// synchronous write is seen waiting for it (or answered): so without the
// wait the synchronous write lands first in every round, and with it
// the synchronous write waits two round trips, not a number of writes
// that a loaded machine may take past its request deadline.
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
	// held is a key of another node than k's: its write, sent while its
	// node is stopped, holds the queue's one worker, and the write under
	// test behind it.
	home := g.cluster.Placement("k").Chain[0].Node
	held := ""
	for i := 0; held == ""; i++ {
		if k := fmt.Sprint("held", i); g.cluster.Placement(k).Chain[0].Node != home {
			held = k
		}
	}
	var heldNode *memcachedtest.Server
	for _, m := range g.mcs {
		if m.Addr == g.cluster.Placement(held).Chain[0].Node {
			heldNode = m
		}
	}
	if heldNode == nil {
		t.Fatalf("no memcached of the rig is %s", g.cluster.Placement(held).Chain[0].Node)
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
	const rounds = 100
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, client := g.url, g.client
			if tt.h1 {
				base, client = h1URL, h1Client
			}
			// send may run on another goroutine than the test's: it
			// returns its error.
			send := func(s step) (int, string, error) {
				req, err := http.NewRequest(s.method, base+s.path, strings.NewReader(s.body))
				if err != nil {
					return 0, "", err
				}
				req.ContentLength = int64(len(s.body))
				if s.async {
					req.Header.Set("Prefer", "respond-async")
				}
				resp, err := client.Do(req)
				if err != nil {
					return 0, "", fmt.Errorf("%s %s: %w", s.method, s.path, err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b), err
			}
			must := func(s step) (int, string) {
				t.Helper()
				code, body, err := send(s)
				if err != nil {
					t.Fatal(err)
				}
				return code, body
			}
			type answer struct {
				code int
				body string
				err  error
			}
			defer heldNode.Resume() // if a round ends the test (SIGCONT to a running process does nothing)
			wrong, late := 0, 0
			for i := range rounds {
				heldNode.Pause()
				if code, body := must(step{"PUT", "/" + held, "x", true, 202}); code != 202 {
					t.Fatalf("async PUT /%s = %d %s", held, code, body)
				}
				if code, body := must(tt.first); code != tt.first.want {
					t.Fatalf("round %d: %s %s = %d %s, want %d", i, tt.first.method, tt.first.path, code, body, tt.first.want)
				}
				second := make(chan answer, 1)
				go func() {
					code, body, err := send(tt.second)
					second <- answer{code, body, err}
				}()
				// Until the synchronous write waits, or has its answer
				// (at once, without the wait), the asynchronous one is
				// still queued behind held's.
				var a answer
				answered := false
				for !answered && orderWaiters(order, "k") == 0 {
					select {
					case a = <-second:
						answered = true
					case <-time.After(time.Millisecond):
					}
				}
				heldNode.Resume()
				if !answered {
					a = <-second
				}
				if a.err != nil {
					t.Fatal(a.err)
				}
				for g.h.h.async.queued.Load() > 0 {
					time.Sleep(100 * time.Microsecond)
				}
				got, value := must(step{"GET", "/k", "", false, 0})
				switch {
				case a.code == http.StatusGatewayTimeout && strings.Contains(a.body, "asynchronous writes of this key"):
					// Refused as documented, nothing sent: the machine
					// was too slow for the deadline, no write overtook.
					late++
				case a.code != tt.second.want || tt.want == "" && got != 404 || tt.want != "" && (got != 200 || value != tt.want):
					wrong++ // a 404 too if it went first (DELETE, incr)
				}
				must(step{"DELETE", "/k", "", false, 0})
			}
			if wrong > 0 {
				t.Errorf("%d of %d rounds: the key did not end with the synchronous write's outcome (the earlier asynchronous write landed after it)", wrong, rounds)
			}
			if late > 0 {
				t.Errorf("%d of %d rounds: the synchronous write's request deadline passed while it waited for the asynchronous one (504)", late, rounds)
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
