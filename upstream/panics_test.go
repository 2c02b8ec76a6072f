package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// boomRoom is a countRoom whose Reserve panics for a value of boomSize
// bytes, as a bug in a caller's budget would.
type boomRoom struct{ countRoom }

const boomSize = 777

func (r *boomRoom) Reserve(n int) bool {
	if n == boomSize {
		panic("planted: Reserve")
	}
	return r.countRoom.Reserve(n)
}

// TestPanicInMultiGetBatch: a multi-key read whose batch for one node
// panics (the Room's Reserve, on the batch's goroutine when the node is
// read through gomemcache) answers that batch's keys with
// panicguard.ErrPanicked, not as misses, and the other node's keys as
// read; what the Room held is given back; the panic is counted in
// memcgate_panics_total{where="upstream_multi_get"}; the next read of
// every key is answered. Without the stop, the panic ended the process.
func TestPanicInMultiGetBatch(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	g := panicguard.New(testLogger(), prometheus.NewRegistry())
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.PipelineConns = 0 // the values are read on the batch's goroutine
		o.Panics = g
	})
	ctx := t.Context()
	var keys []string
	for i := range 16 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	value := func(k string) []byte {
		if k == keys[0] {
			return []byte(strings.Repeat("b", boomSize))
		}
		return []byte("v-" + k)
	}
	owner := map[string]int{}
	for _, k := range keys {
		if res := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: k, Value: value(k)}}); res.Err != nil {
			t.Fatal(res.Err)
		}
		owner[k], _ = c.Owner(k)
	}
	room := &boomRoom{}
	found, failed := c.GetMulti(ctx, keys, 0, room)
	others := 0
	for _, k := range keys {
		switch {
		case owner[k] == owner[keys[0]]:
			if !errors.Is(failed[k], panicguard.ErrPanicked) {
				t.Errorf("%s, on the node whose batch panicked: found %v, failed %v; want panicguard.ErrPanicked", k, found[k].Value != nil, failed[k])
			}
		default:
			others++
			if string(found[k].Value) != string(value(k)) || failed[k] != nil {
				t.Errorf("%s, on the other node: found %q, failed %v; want its value", k, found[k].Value, failed[k])
			}
		}
	}
	if others == 0 {
		t.Fatal("every key on one node: the test checks nothing")
	}
	if room.reserved != room.released {
		t.Errorf("Room: %d bytes reserved, %d released", room.reserved, room.released)
	}
	if n := g.Stopped("upstream_multi_get"); n != 1 {
		t.Errorf(`memcgate_panics_total{where="upstream_multi_get"} = %v, want 1`, n)
	}
	found, failed = c.GetMulti(ctx, keys, 0, nil)
	if len(found) != len(keys) || len(failed) != 0 {
		t.Errorf("GetMulti after the panic: %d found, %v failed; want all %d", len(found), failed, len(keys))
	}
}

// fitsPanics is a countRoom whose Fits panics, as a bug in a caller's
// budget would.
type fitsPanics struct{ countRoom }

func (r *fitsPanics) Fits(int) bool { panic("planted: Fits") }

// TestPanicAdmittingLargeRead: a Get with a Room of a key whose value was
// large when last read, through gomemcache's pool, asks the Room whether
// it fits; a panic there gives back what the read counted ahead on its
// node (it went on counting for ever, and the node's large reads were
// refused once it reached the node's share).
func TestPanicAdmittingLargeRead(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.PipelineConns = 0 })
	ctx := t.Context()
	value := []byte(strings.Repeat("v", 2*op.LentValue))
	if res := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "k", Value: value}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}, Room: &countRoom{}}); res.Err != nil {
		t.Fatal(res.Err) // the node learns the value's size
	}
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Fatal("Get with a Room whose Fits panics did not ask it")
			}
		}()
		c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}, Room: &fitsPanics{}})
	}()
	n := c.topo.Load().nodes[0]
	if a := n.ahead.Load(); a != 0 {
		t.Errorf("node counts %d bytes of large reads ahead after the panic, want 0", a)
	}
}

// TestPanicInNodeCommand: a raw command sent to every node (stats, as
// /memc?cmd=stats asks) whose goroutine for one node panics (here its
// dial, as a bug in a dialer would) answers that node with
// panicguard.ErrPanicked and the other as read, and counts the panic in
// memcgate_panics_total{where="upstream_command"}; the next stats reach
// both. Without the stop, the panic ended the process.
func TestPanicInNodeCommand(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	g := panicguard.New(testLogger(), prometheus.NewRegistry())
	var armed atomic.Bool
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Panics = g
		o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
			if address == mcs[0].Addr && armed.CompareAndSwap(true, false) {
				panic("planted: dial")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		}
	})
	armed.Store(true)
	replies := c.Stats(t.Context())
	for _, r := range replies {
		switch {
		case r.Node == mcs[0].Addr && !errors.Is(r.Err, panicguard.ErrPanicked):
			t.Errorf("stats of %s, whose dial panicked: %v, want panicguard.ErrPanicked", r.Node, r.Err)
		case r.Node != mcs[0].Addr && (r.Err != nil || !strings.HasSuffix(string(r.Reply), "END\r\n")):
			t.Errorf("stats of %s: %q, %v; want its stats", r.Node, r.Reply, r.Err)
		}
	}
	if n := g.Stopped("upstream_command"); n != 1 {
		t.Errorf(`memcgate_panics_total{where="upstream_command"} = %v, want 1`, n)
	}
	for _, r := range c.Stats(t.Context()) {
		if r.Err != nil {
			t.Errorf("stats of %s after the panic: %v", r.Node, r.Err)
		}
	}
}

// TestPanicInHealthCheck: a probe that panics (here its dial, on the
// new connection a restarted memcached makes it open) is a failed probe,
// counted in memcgate_panics_total{where="health_check"} and logged a
// line a second at most, as every other panic stopped off a handler's
// goroutine; the node goes down, and comes back once its probes stop
// panicking. Before, each panic was an error line with its stack, one
// per node per round for as long as it lasted, and counted nowhere an
// alert watches.
func TestPanicInHealthCheck(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	var logs syncBuffer
	g := panicguard.New(slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
	var boom atomic.Bool
	d := &net.Dialer{}
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Panics = g
		o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
			if boom.Load() {
				panic("planted: dial")
			}
			return d.DialContext(ctx, network, address)
		}
	})
	runCluster(t, c)
	start := time.Now()
	boom.Store(true)
	mcs[0].Kill() // its probe's kept connection is closed: the next probe dials
	mcs[0].Restart()
	const panics = 10
	waitFor(t, 5*time.Second, "probes that panicked counted", func() bool { return g.Stopped("health_check") >= panics })
	elapsed := time.Since(start)
	if up := c.Nodes()[0].Up; up {
		t.Errorf("node 0 up after %d probes that panicked, want down", panics)
	}
	lines := strings.Count(logs.String(), "planted: dial")
	if max := 1 + int(elapsed/time.Second); lines < 1 || lines > max {
		t.Errorf("%d panics in %v logged %d lines, want 1 to %d (a line a second at most):\n%s", panics, elapsed, lines, max, logs.String())
	}
	if !strings.Contains(logs.String(), "where=health_check node="+mcs[0].Addr) {
		t.Errorf("the panic's line does not say where it was stopped and for which node:\n%s", logs.String())
	}
	boom.Store(false)
	waitFor(t, 5*time.Second, "node 0 back once its probes pass", func() bool { return c.Nodes()[0].Up })
}
