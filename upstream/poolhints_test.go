package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// testClient is an op.Client that says what it is told, and counts how
// often it was asked.
type testClient struct {
	gone  bool
	asked atomic.Int32
}

func (c *testClient) Gone() bool { c.asked.Add(1); return c.gone }

// getHits is memcached's count of gets that found their key.
func getHits(t *testing.T, mc *memcachedtest.Server) int {
	t.Helper()
	st, err := mc.Stats()
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(st["get_hits"])
	return n
}

// TestPoolLargeGetAsksItsClient busies the only connection of a node of
// gomemcache's pool and sends a Get with a Room of a key whose value was
// large when last read: it must wait for the connection, never park in a
// batch (read whole, outside the byte budget), and once it has the
// connection be sent only if its client is still there. A client that
// asked and reset at once is gone by then: memcached is not asked.
func TestPoolLargeGetAsksItsClient(t *testing.T) {
	for _, tt := range []struct {
		name string
		gone bool
	}{
		{"client gone", true},
		{"client there", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 1)
			c, _ := newTestCluster(t, mcs, func(o *Options) {
				o.PipelineConns, o.MaxConns, o.MaxIdleConns = 0, 1, 1
			})
			ctx := t.Context()
			value := bytes.Repeat([]byte("v"), 64<<10)
			if err := c.Set(ctx, Item{Key: "big", Value: value}); err != nil {
				t.Fatal(err)
			}
			get := func(cl op.Client) op.Result {
				return c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "big"}, Room: &countRoom{}, Client: cl})
			}
			if res := get(nil); res.Err != nil { // learns its size
				t.Fatal(res.Err)
			}
			n := c.topo.Load().nodes[0]
			n.sem <- struct{}{} // the only connection is busy
			cl := &testClient{gone: tt.gone}
			done := make(chan op.Result, 1)
			go func() { done <- get(cl) }()
			waitFor(t, 10*time.Second, "the Get waiting for the busy connection", func() bool { return n.waiting.Load() == 1 })
			if parked := parkedGets(n); parked != 0 {
				t.Errorf("a Get of a key known large parked for a batch")
			}
			hits := getHits(t, mcs[0])
			<-n.sem
			res := <-done
			sent := getHits(t, mcs[0]) - hits
			if tt.gone {
				if !errors.Is(res.Err, context.Canceled) || sent != 0 {
					t.Errorf("Get for a client gone = %v, %d gets sent; want context.Canceled, none sent", res.Err, sent)
				}
			} else if res.Err != nil || !bytes.Equal(res.Item.Value, value) || sent != 1 {
				t.Errorf("Get for a client there = %d bytes, %v, %d gets sent; want the value, one sent", len(res.Item.Value), res.Err, sent)
			}
			if got := cl.asked.Load(); got != 1 {
				t.Errorf("client asked %d times, want once, before the Get was sent", got)
			}
		})
	}
}

// TestPoolLargeGetsAheadBounded busies the only connection of a node of
// gomemcache's pool and sends Gets with a Room of a key whose value was
// large when last read: they wait for the connection, counted in the
// node's bytes ahead, and one that would take those past four times the
// byte budget is refused at once, unsent (ErrNoFit), as on the
// pipelined pool (decisions/0058). Parked, they were all batched.
func TestPoolLargeGetsAheadBounded(t *testing.T) {
	const size = 100 << 10 // with a budget of 64 KiB, two fit in the 256 KiB ahead, not three
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.PipelineConns, o.MaxConns, o.MaxIdleConns = 0, 1, 1
	})
	c.ShareBytes(budget.New(64 << 10))
	ctx := t.Context()
	value := bytes.Repeat([]byte("v"), size)
	if err := c.Set(ctx, Item{Key: "big", Value: value}); err != nil {
		t.Fatal(err)
	}
	get := func() op.Result {
		return c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "big"}, Room: &countRoom{}})
	}
	if res := get(); res.Err != nil { // learns its size
		t.Fatal(res.Err)
	}
	n := c.topo.Load().nodes[0]
	n.sem <- struct{}{} // the only connection is busy
	done := make(chan op.Result, 2)
	for i := range 2 {
		go func() { done <- get() }()
		waitFor(t, 10*time.Second, fmt.Sprintf("Get %d waiting for the busy connection", i+1), func() bool { return n.waiting.Load() == int64(i+1) })
	}
	hits := getHits(t, mcs[0])
	third := make(chan op.Result, 1)
	go func() { third <- get() }()
	var res op.Result
	waitFor(t, 10*time.Second, "the third Get answered or waiting", func() bool {
		select {
		case res = <-third:
			return true
		default:
			return n.waiting.Load() == 3
		}
	})
	switch {
	case n.waiting.Load() == 3:
		t.Error("third Get, past the node's bytes ahead, waits for the connection; want ErrNoFit at once")
		<-n.sem
		res = <-third
		n.sem <- struct{}{}
	case !errors.Is(res.Err, ErrNoFit):
		t.Errorf("third Get, past the node's bytes ahead = %v, want ErrNoFit at once", res.Err)
	}
	if got := testutil.ToFloat64(n.m.shareRefused); got != 1 {
		t.Errorf("%v refusals counted, want 1", got)
	}
	<-n.sem
	for range 2 {
		if res := <-done; res.Err != nil || len(res.Item.Value) != size {
			t.Errorf("Get within the bound = %d bytes, %v; want the value", len(res.Item.Value), res.Err)
		}
	}
	if sent := getHits(t, mcs[0]) - hits; sent != 2 {
		t.Errorf("%d gets sent, want 2", sent)
	}
	if ahead := n.ahead.Load(); ahead != 0 {
		t.Errorf("%d bytes still counted ahead, want none", ahead)
	}
}

// batchClaims is an Options.Claims that records the most it held at once,
// or refuses every claim.
type batchClaims struct {
	refuse bool

	mu                sync.Mutex
	held, peak, asked int64
}

func (p *batchClaims) Acquire(n int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked++
	if p.refuse {
		return errors.New("full")
	}
	p.held += n
	p.peak = max(p.peak, p.held)
	return nil
}

func (p *batchClaims) Release(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held -= n
}

// TestPoolBatchHoldsPastUnheld parks three Gets of values the gateway
// has never seen, each under Options.UnheldClaim, on a node of
// gomemcache's pool whose only connection is busy: their batch, one
// multi-key get, reads no more than UnheldClaim of values outside
// Options.Claims (a batch of up to 100 keys read every value whole
// unheld: 100 MB for values of 1 MB). The values past it are held while
// read; when Claims refuses them, each key is read again on its own and
// every Get still gets its value.
func TestPoolBatchHoldsPastUnheld(t *testing.T) {
	const size, unheld = 60 << 10, 100 << 10
	for _, tt := range []struct {
		name   string
		refuse bool
	}{
		{"claims held", false},
		{"claims refused: read alone", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 1)
			claims := &batchClaims{refuse: tt.refuse}
			c, _ := newTestCluster(t, mcs, func(o *Options) {
				o.PipelineConns, o.MaxConns, o.MaxIdleConns = 0, 1, 1
				o.Claims, o.UnheldClaim = claims, unheld
			})
			ctx := t.Context()
			for i := range 3 {
				if err := c.Set(ctx, Item{Key: fmt.Sprint("k", i), Value: bytes.Repeat([]byte{byte('a' + i)}, size)}); err != nil {
					t.Fatal(err)
				}
			}
			n := c.topo.Load().nodes[0]
			n.sem <- struct{}{} // the only connection is busy
			errs := make(chan error, 3)
			for i := range 3 {
				go func() {
					it, err := c.Get(ctx, fmt.Sprint("k", i))
					if err == nil && !bytes.Equal(it.Value, bytes.Repeat([]byte{byte('a' + i)}, size)) {
						err = fmt.Errorf("%d bytes, not k%d's value", len(it.Value), i)
					}
					errs <- err
				}()
			}
			waitFor(t, 10*time.Second, "3 Gets parked", func() bool { return parkedGets(n) == 3 })
			<-n.sem // a parked Get takes it and sends the three keys as one batch
			for range 3 {
				if err := <-errs; err != nil {
					t.Errorf("parked Get: %v", err)
				}
			}
			claims.mu.Lock()
			defer claims.mu.Unlock()
			switch {
			case !tt.refuse && claims.peak != 2*size:
				t.Errorf("the batch held %d bytes at most while read, want %d: all but the first %d of its values", claims.peak, 2*size, unheld)
			case tt.refuse && claims.asked == 0:
				t.Error("the batch's values past its unheld bytes were never claimed")
			}
			if claims.held != 0 {
				t.Errorf("%d bytes still held, want none", claims.held)
			}
		})
	}
}
