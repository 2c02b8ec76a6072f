package route

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// armedRoom is an op.Room that takes everything, and whose Fits panics
// once while armed, as a bug in a caller's budget would.
type armedRoom struct{ armed atomic.Bool }

func (r *armedRoom) Reserve(int) bool  { return true }
func (r *armedRoom) Holds(n int) int   { return n }
func (r *armedRoom) Release(int)       {}
func (r *armedRoom) Lend(n int) []byte { return make([]byte, n) }
func (r *armedRoom) Fits(int) bool {
	if r.armed.CompareAndSwap(true, false) {
		panic("planted: Fits")
	}
	return true
}

// TestPanicInHedgedRead: a hedged read runs each replica's request on a
// goroutine of its own; one that panics (the Room's Fits, asked of a key
// known large on gomemcache's pool) is a failed request: the next replica
// answers, and the panic is counted in
// memcgate_panics_total{where="route_read"}. Without the stop, the panic
// ended the process.
func TestPanicInHedgedRead(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	g := panicguard.New(discard(), prometheus.NewRegistry())
	co := clusterOptions(mcs)
	co.PipelineConns = 0 // a Get with a Room asks Fits on the request's goroutine
	co.Panics = g
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 2, Read: ReadHedged}}})
	ctx := t.Context()
	value := strings.Repeat("v", 2*op.LentValue)
	if err := set(ctx, r, "k", value); err != nil {
		t.Fatal(err)
	}
	room := &armedRoom{}
	read := func() op.Result { return r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}, Room: room}) }
	if res := read(); res.Err != nil {
		t.Fatal(res.Err) // the first replica learns the value's size
	}
	room.armed.Store(true)
	if res := read(); res.Err != nil || string(res.Item.Value) != value {
		t.Errorf("hedged read whose first request panicked = %v; want the next replica's value", res.Err)
	}
	if room.armed.Load() {
		t.Fatal("Fits was not asked: the test checks nothing")
	}
	if n := g.Stopped("route_read"); n != 1 {
		t.Errorf(`memcgate_panics_total{where="route_read"} = %v, want 1`, n)
	}
}
