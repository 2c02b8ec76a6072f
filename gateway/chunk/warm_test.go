package chunk

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/route"
)

// oneNode is the cluster options of a pool of mc alone.
func oneNode(mc *memcachedtest.Server) upstream.Options {
	return upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port, Weight: 1}}, PipelineConns: 2, Timeout: 2 * time.Second,
		Health: upstream.HealthOptions{Interval: 50 * time.Millisecond, Timeout: time.Second, Fall: 2, Rise: 2}}
}

// warmRouter is a router whose default pool (cold) fills its misses from
// pool "old" (warm), run until the test ends.
func warmRouter(t *testing.T, cold, warm *memcachedtest.Server) *route.Router {
	t.Helper()
	r, err := route.New(route.Options{Pools: []route.PoolOptions{
		{Cluster: oneNode(cold), Warm: "old"},
		{Name: "old", Cluster: oneNode(warm)},
	}, WarmDefaultTTL: time.Minute}, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; r.Close() })
	for deadline := time.Now().Add(5 * time.Second); !r.Ready(); {
		if time.Now().After(deadline) {
			t.Fatal("router not ready in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r
}

// TestDeleteBringsNothingBackFromAWarmPool: a DELETE of a value in
// chunks that only the warm pool holds (a cold pool filling itself from
// an old one) leaves the key missing. Before, the delete's own look at
// the item (is it an index?) was a warm hit that the router copied into
// the cold pool in the background, and the copy, an add, landed after
// the delete in about 6 of 10 tries: the whole value was served again
// (its chunks were still in the warm pool) for the rest of its TTL.
func TestDeleteBringsNothingBackFromAWarmPool(t *testing.T) {
	cold, warm := memcachedtest.Start(t), memcachedtest.Start(t)
	ctx := t.Context()
	old, err := upstream.New(oneNode(warm), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Close() })
	coldOnly, err := upstream.New(oneNode(cold), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coldOnly.Close() })
	before := New(old, Options{ChunkSize: raceChunk, Grace: time.Hour, Timeout: 5 * time.Second}, prometheus.NewRegistry())
	const keys = 10
	for i := range keys {
		if err := put(ctx, before, "blob"+strconv.Itoa(i), bigValue(2, byte(i))); err != nil {
			t.Fatal(err)
		}
	}
	r := warmRouter(t, cold, warm)
	v := New(r, Options{ChunkSize: raceChunk, Grace: time.Hour, Timeout: 5 * time.Second}, prometheus.NewRegistry())
	for i := range keys {
		key := "blob" + strconv.Itoa(i)
		if res := v.Do(ctx, op.Op{Verb: op.Delete, Item: op.Item{Key: key}}); res.Err != nil && !errors.Is(res.Err, upstream.ErrNotFound) {
			t.Fatalf("Delete(%s): %v", key, res.Err)
		}
	}
	// A warm hit read after the deletes is copied in the background as
	// a copy started by them would have been: once it is in the cold
	// pool, theirs would be too.
	if err := old.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "probe", Value: []byte("p")}}).Err; err != nil {
		t.Fatal(err)
	}
	if res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "probe"}}); res.Err != nil {
		t.Fatalf("Get(probe) = %v, want the warm pool's", res.Err)
	}
	for deadline := time.Now().Add(5 * time.Second); coldOnly.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "probe"}}).Err != nil; {
		if time.Now().After(deadline) {
			t.Fatal("probe not copied into the cold pool in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range keys {
		key := "blob" + strconv.Itoa(i)
		if res := coldOnly.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}}); !errors.Is(res.Err, upstream.ErrNotFound) {
			t.Errorf("cold pool's %s after its delete: %d bytes, %v; want a miss", key, len(res.Item.Value), res.Err)
		}
		if res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}}); !errors.Is(res.Err, upstream.ErrNotFound) {
			t.Errorf("Get(%s) after its delete: %d bytes, %v; want a miss", key, len(res.Item.Value), res.Err)
		}
	}
}

// layoutStore is a Store whose layout (Options.Layout) moves on once,
// when the first write of the chunk numbered at, or of the index if at
// is -1, has been answered: a reload that lands while a Put is under
// way.
type layoutStore struct {
	Store
	at     int
	layout atomic.Uint64
	moved  atomic.Bool
}

func (s *layoutStore) Do(ctx context.Context, o op.Op) op.Result {
	res := s.Store.Do(ctx, o)
	isChunk := Reserved(o.Item.Key)
	if o.Verb.Writes() && (isChunk && strings.HasSuffix(o.Item.Key, "."+strconv.Itoa(s.at)) || !isChunk && s.at < 0) && s.moved.CompareAndSwap(false, true) {
		s.layout.Add(1)
	}
	return res
}

// TestPutAcrossAReload: a Put during which the servers or routes changed
// (a reload: chunks written before it may be on other nodes than the
// index after it) stores no value and fails with ErrMoved, rather than
// answer 201 for a value whose first chunks no read finds. Before, a
// prefix moved to another pool by a SIGHUP 2 s into an 8 MB PUT got
// 201, and the next GET 404 (and the index was dropped).
func TestPutAcrossAReload(t *testing.T) {
	tests := []struct {
		name      string
		at        int // the chunk after whose write the layout moves; -1: the index
		wantIndex bool
	}{
		{"between chunks", 0, false},
		{"after the last chunk", 2, false},
		{"while the index is written", -1, true}, // it may be in: told so, left to expire
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			_, c, _ := realValues(t, nil)
			s := &layoutStore{Store: c, at: tt.at}
			v := New(s, Options{ChunkSize: raceChunk, Grace: time.Hour, Timeout: 5 * time.Second, Layout: func(string) uint64 { return s.layout.Load() }}, prometheus.NewRegistry())
			err := put(ctx, v, "k", bigValue(2, 1))
			if !errors.Is(err, ErrMoved) {
				t.Fatalf("Put across a reload = %v, want ErrMoved", err)
			}
			res := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
			if got := res.Err == nil; got != tt.wantIndex {
				t.Errorf("index in after the Put: %v (%v), want %v", got, res.Err, tt.wantIndex)
			}
			if err := put(ctx, v, "k", bigValue(2, 2)); err != nil {
				t.Fatalf("Put after the reload: %v", err)
			}
		})
	}
}

// switchStore is a Store that sends every operation to one of two
// clusters, as a reload that moves a key to another pool does.
type switchStore struct {
	a, b  Store
	moved atomic.Bool // b serves
}

func (s *switchStore) Do(ctx context.Context, o op.Op) op.Result {
	if s.moved.Load() {
		return s.b.Do(ctx, o)
	}
	return s.a.Do(ctx, o)
}

// TestDropNamesTheIndexNotItsCAS: a reader that finds a chunk missing
// drops the index it read, and only that index. Once the key is placed on
// another node (a reload, a failover), where the chunks are missing, the
// item there may have the very CAS the index had on the first node (each
// node counts its own): before, the drop, a CAS, replaced that newer
// value with an expired index. Seen end to end: a 30 MB value read
// slowly, a reload moving its prefix to another pool, a PUT of the key
// there (201) whose CAS was the index's; the reader's drop deleted it,
// and the next GET was 404.
func TestDropNamesTheIndexNotItsCAS(t *testing.T) {
	ctx := t.Context()
	_, first, _ := realValues(t, nil)
	_, second, addr := realValues(t, nil)
	s := &switchStore{a: first, b: second}
	v := New(s, Options{ChunkSize: raceChunk, Grace: time.Hour, Timeout: 5 * time.Second}, prometheus.NewRegistry())
	if err := put(ctx, v, "k", bigValue(2, 1)); err != nil {
		t.Fatal(err)
	}
	index := first.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
	if index.Err != nil {
		t.Fatal(index.Err)
	}
	// The second node's next CAS is the index's: fill its count.
	for {
		res := second.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "filler", Value: []byte("x")}})
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		got := second.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "filler"}})
		if got.Item.CAS >= index.Item.CAS-1 {
			break
		}
	}
	s.moved.Store(true)
	if err := second.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "k", Value: []byte("newer")}}).Err; err != nil {
		t.Fatal(err)
	}
	newer := second.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
	if newer.Item.CAS != index.Item.CAS {
		t.Fatalf("the newer item's CAS on %s is %d, want the index's %d", addr, newer.Item.CAS, index.Item.CAS)
	}
	v.Drop(ctx, "k", index.Item)
	if got := second.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}}); got.Err != nil || string(got.Item.Value) != "newer" {
		t.Errorf("the newer value after the old index's drop: %q, %v; want it kept", got.Item.Value, got.Err)
	}
	s.moved.Store(false)
	v.Drop(ctx, "k", index.Item)
	if got := first.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}}); !errors.Is(got.Err, upstream.ErrNotFound) {
		t.Errorf("the index after its own drop: %v, want a miss", got.Err)
	}
}
