package upstream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestNodeShare stops the first node (SIGSTOP, well within its Timeout)
// and starts operations on its keys one after another, all in flight at
// once: those past the node's share of RequestSlots (in flight and
// waiting for one of its 8 slots together) are refused at once with a
// *BusyError, while the node still holds every other one; the node stays
// up, its passive count untouched, and once it resumes the others are
// answered.
func TestNodeShare(t *testing.T) {
	tests := []struct {
		name      string
		nodes     int
		otherDown bool // the second node killed and ejected first
		queued    int  // the first this many are op.Op.Queued: they wait past the share, and do not count against it
		slots     int  // RequestSlots
		ops       int
		wantBusy  int
	}{
		{name: "half of the slots with two nodes", nodes: 2, slots: 8, ops: 10, wantBusy: 6},
		{name: "all of them with one node", nodes: 1, slots: 10, ops: 12, wantBusy: 2},
		{name: "all of them with the other node down", nodes: 2, otherDown: true, slots: 8, ops: 10, wantBusy: 2},
		{name: "waiting counts", nodes: 2, slots: 40, ops: 24, wantBusy: 4}, // 8 in flight, 12 waiting
		{name: "no cap", nodes: 2, slots: 0, ops: 12, wantBusy: 0},
		{name: "queued operations wait", nodes: 2, slots: 8, queued: 12, ops: 12, wantBusy: 0},
		{name: "queued operations do not count", nodes: 2, slots: 8, queued: 4, ops: 10, wantBusy: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, tt.nodes)
			c := slowFirstCluster(t, mcs, tt.slots)
			slow := c.topo.Load().nodes[0]
			key := keyOwnedBy(t, c, 0)
			if tt.otherDown {
				mcs[1].Kill()
				waitFor(t, 5*time.Second, "ejection", func() bool { return !c.topo.Load().nodes[1].available() })
			}
			mcs[0].Pause()
			defer mcs[0].Resume()

			var mu sync.Mutex
			busy, answered := 0, 0
			var wg sync.WaitGroup
			for i := range tt.ops {
				o := op.Op{Verb: op.Get, Item: op.Item{Key: key}, Queued: i < tt.queued}
				if i%2 == 1 {
					o = op.Op{Verb: op.Set, Item: op.Item{Key: key, Value: []byte("v")}, Queued: i < tt.queued}
				}
				wg.Go(func() {
					err := c.Do(t.Context(), o).Err
					var be *BusyError
					mu.Lock()
					defer mu.Unlock()
					switch {
					case errors.As(err, &be):
						busy++
					case err == nil, errors.Is(err, ErrNotFound):
						answered++
					default:
						t.Errorf("%v: %v", o.Verb, err)
					}
				})
				settled(&mu, slow, i+1, func() int { return busy + answered })
			}
			// At once: the refusals are all in while the stopped node
			// holds every operation admitted.
			mu.Lock()
			if busy != tt.wantBusy || answered != 0 {
				t.Errorf("with the node stopped: busy %d, answered %d; want %d and 0%s", busy, answered, tt.wantBusy, mcs[0].ResumedNote())
			}
			mu.Unlock()
			mcs[0].Resume()
			wg.Wait()
			if busy != tt.wantBusy || answered != tt.ops-tt.wantBusy {
				t.Errorf("busy %d, answered %d; want %d and %d", busy, answered, tt.wantBusy, tt.ops-tt.wantBusy)
			}
			if !slow.available() || slow.passiveRuns.Load() != 0 {
				t.Errorf("slow node up %v, passive timeouts %d: a refusal says nothing against it", slow.available(), slow.passiveRuns.Load())
			}
			var counted float64
			for _, v := range []op.Verb{op.Get, op.Set} {
				counted += testutil.ToFloat64(c.m.ops.WithLabelValues(slow.name, v.String(), "busy"))
			}
			if int(counted) != tt.wantBusy {
				t.Errorf(`ops_total{result="busy"} = %v, want %d`, counted, tt.wantBusy)
			}
		})
	}
}

func TestRequestShareFollowsNodes(t *testing.T) {
	tests := []struct {
		slots         int64
		nodes, others int
		want          int64
	}{
		{slots: 0, nodes: 3, want: 0},
		{slots: 10000, nodes: 1, want: 10000},
		{slots: 10000, nodes: 1, others: 2, want: 5000},
		{slots: 10000, nodes: 2, want: 5000},
		{slots: 10001, nodes: 16, want: 5001},
	}
	for _, tt := range tests {
		var s requestShare
		s.set(tt.slots, tt.nodes, tt.others)
		if got := s.share.Load(); got != tt.want {
			t.Errorf("share of %d slots over %d nodes and %d others = %d, want %d", tt.slots, tt.nodes, tt.others, got, tt.want)
		}
	}
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.RequestSlots = 100 })
	if got := c.share.share.Load(); got != 50 {
		t.Errorf("two nodes: share %d, want 50", got)
	}
	if _, err := c.SetServers(t.Context(), c.topo.Load().servers[:1], c.topo.Load().dist); err != nil {
		t.Fatal(err)
	}
	if got := c.share.share.Load(); got != 100 {
		t.Errorf("after SetServers to one node: share %d, want 100", got)
	}
	c.SetRequestSlots(40, 0)
	if got := c.share.share.Load(); got != 40 {
		t.Errorf("after SetRequestSlots(40, 0): share %d, want 40", got)
	}
	c.SetRequestSlots(40, 3)
	if over, got := c.share.over(21); !over || got != 20 {
		t.Errorf("one node, with 3 of other clusters: 21 over %v, share %d; want over 20", over, got)
	}
}

// TestCommandsCountTowardShare: raw commands (stats, version) waiting for
// a stopped node count against its share like any operation, so a flood of
// /memc?cmd=stats cannot hold every request slot waiting for it; a
// flush_all, which must reach the node, waits its turn instead.
func TestCommandsCountTowardShare(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c := slowFirstCluster(t, mcs, 8)
	defer mcs[0].Resume()
	for _, tt := range []struct {
		name     string
		run      func() []NodeReply
		wantBusy int
	}{
		{"stats", func() []NodeReply { return c.Stats(t.Context()) }, 6},
		{"flush_all", func() []NodeReply { return c.FlushAll(t.Context(), 0) }, 0},
	} {
		mcs[0].Pause()
		var mu sync.Mutex
		busy := 0
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() {
				r := tt.run()[0] // the slow node's reply
				var be *BusyError
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.As(r.Err, &be):
					busy++
				case r.Err != nil:
					t.Errorf("%s: %v", tt.name, r.Err)
				}
			})
			settled(&mu, c.topo.Load().nodes[0], i+1, func() int { return busy })
		}
		mu.Lock()
		if busy != tt.wantBusy {
			t.Errorf("%s: %d of 10 refused as busy with the node stopped, want %d", tt.name, busy, tt.wantBusy)
		}
		mu.Unlock()
		mcs[0].Resume()
		wg.Wait()
	}
}

// settled waits until the first want operations started on n are each in
// flight, waiting for a slot, or counted done (done, read under mu), so
// that the next starts after them and the count of refusals is exact. An
// operation waiting for a slot outside the share's count (a queued one)
// shows nowhere: it is given 300 ms.
func settled(mu *sync.Mutex, n *node, want int, done func() int) {
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		mu.Lock()
		d := done()
		mu.Unlock()
		if len(n.sem)+int(n.waiting.Load())+d >= want {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestShareOver: a node holds its fair part of the slots (30 over 3
// nodes: 10) whatever the others do, and past it only while more slots
// are free than it would hold (the caller's count of requests in flight,
// its own included), or at most half of them (15) when nothing counts.
func TestShareOver(t *testing.T) {
	var down atomic.Int32
	tests := []struct {
		name     string
		count    int64 // requests in flight; -1: not counted
		down     int32
		after    int64
		wantOver bool
		want     int64
	}{
		{name: "within its fair part", count: 30, after: 10, want: 15},
		{name: "past it, slots free", count: 12, after: 12, want: 19},
		{name: "past it, fewer free than it would hold", count: 25, after: 12, wantOver: true, want: 10},
		{name: "free just enough", count: 20, after: 11, want: 11},
		{name: "past the free slots", count: 16, after: 16, wantOver: true, want: 15},
		{name: "past half, slots free: operations of few requests", count: 3, after: 20, want: 28},
		{name: "not counted: half", count: -1, after: 15, want: 15},
		{name: "alone: all", count: 30, down: 2, after: 30, want: 30},
		{name: "alone, past all", count: 30, down: 2, after: 31, wantOver: true, want: 30},
	}
	for _, tt := range tests {
		s := requestShare{down: &down}
		s.set(30, 3, 0)
		down.Store(tt.down)
		if tt.count >= 0 {
			f := func() int64 { return tt.count }
			s.count.Store(&f)
		}
		if over, got := s.over(tt.after); over != tt.wantOver || got != tt.want {
			t.Errorf("%s: over(%d) = %v, %d; want %v, %d", tt.name, tt.after, over, got, tt.wantOver, tt.want)
		}
	}
}

// slowFirstCluster runs a cluster of mcs with RequestSlots slots and
// timeouts of a minute: a test stops the first node (Pause) to hold the
// operations it admits for as long as it needs, on any machine.
func slowFirstCluster(t *testing.T, mcs []*memcachedtest.Server, slots int) *Cluster {
	t.Helper()
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Timeout, o.Health.Timeout = time.Minute, time.Minute
		o.RequestSlots = slots
	})
	runCluster(t, c)
	return c
}

// TestWaitSlotAfterDeadline: a slot that frees as the caller's deadline
// passes is not taken: select picks either ready case at random, and an
// operation that won the slot past its deadline ran for one more
// Timeout (a GET answered 504 at REQUEST_TIMEOUT + TIMEOUT with the node
// stopped and one slot).
func TestWaitSlotAfterDeadline(t *testing.T) {
	n := &node{name: "n", sem: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 200 {
		if err := n.waitSlot(ctx, "get"); err == nil {
			t.Fatal("waitSlot took a free slot for a caller whose context had ended")
		}
		if len(n.sem) != 0 {
			t.Fatalf("%d slots held after a refusal, want 0", len(n.sem))
		}
	}
}

// TestWaitSlotAfterDeadlineSendsNothing: a slot given back by a caller
// whose context ended sends nothing on it, parked Gets included: the
// parked Gets take the slot themselves (see coalesce.go). Given back
// through release, it sent a batch of them first, on the caller's
// goroutine, which then waited for a stopped memcached's Timeout past
// its own deadline.
func TestWaitSlotAfterDeadlineSendsNothing(t *testing.T) {
	mc := memcachedtest.Start(t)
	c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, func(o *Options) {
		o.Timeout, o.Health.Timeout = 2*time.Second, time.Minute
		o.RequestSlots = 1
		o.BatchGets = true
	})
	runCluster(t, c)
	n := c.topo.Load().nodes[0]
	if !n.batchGets {
		t.Fatal("get batching off")
	}
	mc.Pause()
	defer mc.Resume()
	w := &getWaiter{key: "parked", done: make(chan getResult, 1)}
	n.pmu.Lock()
	n.pending = append(n.pending, w)
	n.pmu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 40 { // select takes the free slot half the time
		start := time.Now()
		if err := n.waitSlot(ctx, "set"); err == nil {
			t.Fatal("waitSlot took a slot for a caller whose context had ended")
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("waitSlot returned %v after a caller's deadline, want at once", d)
		}
	}
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if len(n.pending) != 1 || w.taken {
		t.Fatalf("the parked Get was taken (%d pending): nothing else holds a slot to send it", len(n.pending))
	}
}
