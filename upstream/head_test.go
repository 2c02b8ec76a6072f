package upstream

import (
	"bufio"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestHead: a head answers an item's flags, CAS and size without its
// value, in both pools (make test runs this package with gomemcache's
// too), and a miss as a get does.
func TestHead(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix = "app:" })
	ctx := t.Context()
	for _, size := range []int{0, 3, 100 << 10} {
		key := "k" + strings.Repeat("x", size%7)
		if err := c.Set(ctx, Item{Key: key, Value: make([]byte, size), Flags: 9}); err != nil {
			t.Fatal(err)
		}
		got, err := c.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		res := c.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: key}})
		if res.Err != nil || res.N != uint64(size) || res.Item.Flags != 9 || res.Item.CAS != got.CAS || res.Item.Value != nil || res.Item.Key != key {
			t.Errorf("head of %d bytes = %+v size %d, %v; want flags 9, CAS %d, no value", size, res.Item, res.N, res.Err, got.CAS)
		}
	}
	if res := c.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: "absent"}}); !errors.Is(res.Err, ErrNotFound) {
		t.Errorf("head of a missing key: %v, want ErrNotFound", res.Err)
	}
	// head_touch answers as head does, and sets the expiration: -1
	// expires the item at once.
	res := c.Do(ctx, op.Op{Verb: op.HeadTouch, Item: op.Item{Key: "k", Expiration: -1}})
	if res.Err != nil || res.N != 0 || res.Item.Flags != 9 || res.Item.Value != nil {
		t.Errorf("head_touch = %+v size %d, %v; want flags 9, size 0", res.Item, res.N, res.Err)
	}
	if _, err := c.Get(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after head_touch with expiration -1: %v, want ErrNotFound", err)
	}
	if res := c.Do(ctx, op.Op{Verb: op.HeadTouch, Item: op.Item{Key: "absent", Expiration: 60}}); !errors.Is(res.Err, ErrNotFound) {
		t.Errorf("head_touch of a missing key: %v, want ErrNotFound", res.Err)
	}
	var hits float64
	for _, n := range c.topo.Load().nodes {
		hits += testutil.ToFloat64(n.m.ops[verbOp(op.Head)][resOK])
	}
	if hits != 3 {
		t.Errorf("head hits counted = %v, want 3", hits)
	}
}

// TestHeadWithoutMeta: a node that answers mg with ERROR (memcached
// before 1.6) answers a head with a get of the whole value, and is asked
// with mg only once.
func TestHeadWithoutMeta(t *testing.T) {
	var mgs atomic.Int64
	srv := memcachedtest.StartScripted(t, func(line string, _ *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); f[0] {
		case "mg":
			mgs.Add(1)
		case "gets":
			return memcachedtest.Value(f[1], "abc", 5, 77) + "END\r\n", true
		case "version":
			return "VERSION 1.5.22\r\n", true
		}
		return "ERROR\r\n", true
	})
	c, _ := newTestCluster(t, []*memcachedtest.Server{{Addr: srv.Addr, Port: srv.Port}}, nil)
	for range 3 {
		res := c.Do(t.Context(), op.Op{Verb: op.Head, Item: op.Item{Key: "k"}})
		if res.Err != nil || res.N != 3 || res.Item.Flags != 5 || res.Item.CAS != 77 || res.Item.Value != nil {
			t.Fatalf("head = %+v size %d, %v; want flags 5, CAS 77, size 3, no value", res.Item, res.N, res.Err)
		}
	}
	if n := mgs.Load(); n > 1 || *pipelineConns == 0 && n != 0 {
		t.Errorf("%d mg commands, want at most one (none with gomemcache's pool)", n)
	}
}
