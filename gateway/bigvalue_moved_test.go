package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// movingStore is a Store whose key moves to another node (as a reload or
// a failover moves it) when the first chunk is read, once armed: every
// operation from then on goes to second.
type movingStore struct {
	*upstream.Cluster
	second *upstream.Cluster
	armed  atomic.Bool
	moved  atomic.Bool
}

func (s *movingStore) Do(ctx context.Context, o op.Op) op.Result {
	if s.armed.Load() && o.Verb == op.Get && chunk.Reserved(o.Item.Key) {
		s.moved.Store(true)
	}
	if s.moved.Load() {
		return s.second.Do(ctx, o)
	}
	return s.Cluster.Do(ctx, o)
}

// oneNodeCluster is a cluster of mc alone.
func oneNodeCluster(t *testing.T, mc *memcachedtest.Server) *upstream.Cluster {
	t.Helper()
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 2, Timeout: time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBigValueMovedKeyServesTheNewerItem: a GET that read a value's index
// on one node and finds its first chunk missing because the key moved to
// another node since (a reload, a failover) reads the key again there,
// and a newer item there whose CAS is the index's by chance (each node
// counts its own) is served, not taken for the index read and answered
// 404 (nor dropped: TestDropNamesTheIndexNotItsCAS).
func TestBigValueMovedKeyServesTheNewerItem(t *testing.T) {
	ctx := t.Context()
	first, second := oneNodeCluster(t, memcachedtest.Start(t)), oneNodeCluster(t, memcachedtest.Start(t))
	s := &movingStore{Cluster: first, second: second}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := NewHandler(s, log, prometheus.NewRegistry(), Options{MaxValueBytes: rigChunk, BigValueMaxBytes: 1 << 20, BigValueGrace: rigGrace, Budget: budget.New(64 << 20)})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	g := &bigRig{t: t, url: srv.URL, client: srv.Client()}
	g.mustPut("/k", value(3*rigChunk, "old"))
	index := first.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
	if index.Err != nil {
		t.Fatal(index.Err)
	}
	for { // the second node's next CAS is the index's
		if err := second.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "filler", Value: []byte("x")}}).Err; err != nil {
			t.Fatal(err)
		}
		if second.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "filler"}}).Item.CAS >= index.Item.CAS-1 {
			break
		}
	}
	if err := second.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "k", Value: []byte("newer")}}).Err; err != nil {
		t.Fatal(err)
	}
	if cas := second.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}}).Item.CAS; cas != index.Item.CAS {
		t.Fatalf("the newer item's CAS is %d, want the index's %d", cas, index.Item.CAS)
	}
	s.armed.Store(true)
	if a := g.do("GET", "/k", nil); a.status != 200 || string(a.body) != "newer" {
		t.Errorf("GET /k after it moved = %d %q, want 200 newer", a.status, a.body)
	}
	if got := second.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}}); got.Err != nil || string(got.Item.Value) != "newer" {
		t.Errorf("the newer item after the GET: %q, %v; want it kept", got.Item.Value, got.Err)
	}
}
