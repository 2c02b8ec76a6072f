package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

func TestGetBatchingUnderLoad(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.MaxConns, o.MaxIdleConns, o.MaxInFlight = 2, 2, 2 })
	ctx := t.Context()
	for i := range 50 {
		if err := c.Set(ctx, Item{Key: fmt.Sprint("b", i), Value: []byte(fmt.Sprint("value-", i))}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2000)
	for g := range 200 {
		wg.Go(func() {
			for j := range 10 {
				i := (g*7 + j) % 60 // keys 50..59 are misses
				it, err := c.Get(ctx, fmt.Sprint("b", i))
				switch {
				case i >= 50 && !errors.Is(err, ErrNotFound):
					errs <- fmt.Errorf("Get(b%d) = %v, want a miss", i, err)
				case i < 50 && (err != nil || string(it.Value) != fmt.Sprint("value-", i)):
					errs <- fmt.Errorf("Get(b%d) = %q, %v, want value-%d", i, it.Value, err, i)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	batched := testutil.ToFloat64(c.topo.Load().nodes[0].m.batched)
	st, _ := mcs[0].Stats()
	t.Logf("2000 Gets from 200 goroutines over 2 connections: %v went out batched; memcached saw cmd_get=%s (keys) in get commands", batched, st["cmd_get"])
	if batched == 0 {
		t.Error("no Get was batched with 200 goroutines on 2 connections")
	}
	if c.topo.Load().nodes[0].conns.Load() > 2 {
		t.Errorf("%d connections, want at most 2", c.topo.Load().nodes[0].conns.Load())
	}
	if len(c.topo.Load().nodes[0].pending) != 0 {
		t.Errorf("%d Gets left parked", len(c.topo.Load().nodes[0].pending))
	}
}

func TestParkedGetFollowsContext(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.MaxConns, o.MaxInFlight = 1, 1 })
	n := c.topo.Load().nodes[0]
	n.sem <- struct{}{} // the only slot is busy and stays busy
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx, "k")
	var ne *NodeError
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("parked Get past its deadline = %v, want a timeout", err)
	}
	if left := parkedGets(n); left != 0 {
		t.Errorf("%d waiters left parked after their deadline", left)
	}
	<-n.sem
	if _, err := c.Get(t.Context(), "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after the slot freed = %v, want a miss", err)
	}
}

func TestBatchedGetsFailOver(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.MaxConns, o.MaxInFlight = 1, 1 })
	key := keyOwnedBy(t, c, 0)
	mcs[0].Kill()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := c.Get(t.Context(), key); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get with its owner dead = %v, want a miss from the next node", err)
			}
		})
	}
	wg.Wait()
}

// refusingRoom is an op.Room that holds nothing: every value is refused.
type refusingRoom struct{ asked atomic.Int64 }

func (r *refusingRoom) Reserve(int) bool  { r.asked.Add(1); return false }
func (r *refusingRoom) Fits(int) bool     { return false }
func (r *refusingRoom) Holds(n int) int   { return n }
func (r *refusingRoom) Release(int)       {}
func (r *refusingRoom) Lend(n int) []byte { return make([]byte, 0, n) }

// TestGetWithRoomNotBatched busies the only slot of a node and sends
// Gets of a large value with a Room that holds nothing: they must wait
// for the slot, never park in a batch (which reads every value whole,
// outside any Room), and be refused by their Room once sent.
func TestGetWithRoomNotBatched(t *testing.T) {
	if *pipelineConns == 0 {
		t.Skip("gomemcache's pool reads every value whole; Rooms are the pipelined client's")
	}
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.MaxConns, o.MaxIdleConns, o.MaxInFlight = 1, 1, 1 })
	ctx := t.Context()
	if err := c.Set(ctx, Item{Key: "big", Value: bytes.Repeat([]byte("v"), 64<<10)}); err != nil {
		t.Fatal(err)
	}
	n := c.topo.Load().nodes[0]
	n.sem <- struct{}{} // the only slot is busy
	room := &refusingRoom{}
	errs := make(chan error, 5)
	for range 5 {
		go func() {
			errs <- c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "big"}, Room: room}).Err
		}()
	}
	// Parked or not, each Get counts among the node's waiters (join).
	waitFor(t, 10*time.Second, "5 Gets waiting for the busy slot", func() bool { return n.waiting.Load() == 5 })
	if parked := parkedGets(n); parked != 0 {
		t.Errorf("%d Gets with a Room parked for a batch", parked)
	}
	<-n.sem
	for range 5 {
		if err := <-errs; !errors.Is(err, ErrNoFit) {
			t.Errorf("Get with a Room that holds nothing = %v, want ErrNoFit", err)
		}
	}
	if batched := testutil.ToFloat64(n.m.batched); batched != 0 {
		t.Errorf("%v Gets went out batched", batched)
	}
}

// parkedGets is how many Gets wait in n's pending list.
func parkedGets(n *node) int {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	return len(n.pending)
}

// TestParkedGetSlotAfterDeadlineSendsNothing: a parked Get woken with a
// slot that ran only once its context had ended gives the slot back and
// sends nothing, as waitSlot does (TestWaitSlotAfterDeadlineSendsNothing).
// Sending its batch, it waited for a stopped memcached's Timeout past its
// own deadline. One P makes the order certain: the slot frees (the
// parked send completes), the context ends, then the Get runs.
func TestParkedGetSlotAfterDeadlineSendsNothing(t *testing.T) {
	mc := memcachedtest.Start(t)
	c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, func(o *Options) {
		o.MaxConns, o.MaxInFlight = 1, 1
		o.Timeout = 2 * time.Second
		o.BatchGets = true
	})
	n := c.topo.Load().nodes[0]
	mc.Pause()
	defer mc.Resume()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	n.sem <- struct{}{} // the only slot is busy
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "k")
		errc <- err
	}()
	for parkedGets(n) == 0 {
		time.Sleep(time.Millisecond) // it runs until it waits in its select
	}
	<-n.sem // the slot frees: the parked Get is woken holding it
	cancel()
	start := time.Now()
	err := <-errc
	if d := time.Since(start); d > time.Second {
		t.Errorf("Get woken with a slot after its context ended returned %v later (%v), want at once", d, err)
	}
	if err == nil {
		t.Error("Get woken with a slot after its context ended = nil error, want its context's")
	}
	if len(n.sem) != 0 || parkedGets(n) != 0 {
		t.Errorf("after: %d slots held, %d Gets parked; want none", len(n.sem), parkedGets(n))
	}
}
