package upstream

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// closedAddr returns a loopback address nothing listens on: a dial to it
// is refused by the kernel, as one to a port a firewall rejects, or to a
// proxy in front of memcached while it restarts, is.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestWriteStaysWithARefusedNodeInService: a write whose owner refused
// its connection goes on to the next node only when the refusal took the
// owner out of service, as it does with passive health on. With passive
// ejection off (PASSIVE_FAILS 0) the owner stays in service, and once it
// takes connections again its reads return what it held: a write stored
// on the next node would have been answered as stored and never read,
// and the record of its key for the owner's re-admission (0020) never
// fires, as the owner is never re-admitted (decisions/0086). The owner's
// memcached runs throughout with its data; only its connections are
// refused for a while.
func TestWriteStaysWithARefusedNodeInService(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	refusedAt := closedAddr(t)
	var refusing atomic.Bool
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Health.PassiveFails = 0 // the owner stays in service
		o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
			if refusing.Load() && address == mcs[0].Addr {
				address = refusedAt
			}
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		}
	})
	ctx := t.Context()
	keys := ownedBy(c, 0, "wr-", 2)
	for _, k := range keys {
		rawSet(t, mcs[0].Addr, k, "7")
	}
	refusing.Store(true)
	set := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: keys[0], Value: []byte("new"), Expiration: 100}})
	del := c.Do(ctx, op.Op{Verb: op.Delete, Item: op.Item{Key: keys[1]}})
	if !c.topo.Load().nodes[0].available() {
		t.Fatal("the owner was taken out of service with passive ejection off")
	}
	refusing.Store(false)
	for _, w := range []struct {
		verb op.Verb
		key  string
		res  op.Result
	}{{op.Set, keys[0], set}, {op.Delete, keys[1], del}} {
		if w.res.Err != nil {
			var ne *NodeError
			if !errors.As(w.res.Err, &ne) || ne.Node != mcs[0].Addr {
				t.Errorf("%s %s while its owner refused connections = %v; want the owner's failure", w.verb, w.key, w.res.Err)
			}
		}
		if got, err := memcache.New(mcs[1].Addr).Get(w.key); !errors.Is(err, memcache.ErrCacheMiss) {
			t.Errorf("%s %s: the next node holds %v, %v; want nothing: the write does not leave an owner in service", w.verb, w.key, got, err)
		}
		res := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: w.key}})
		if w.res.Err == nil && res.Err == nil && string(res.Item.Value) == "7" {
			t.Errorf("%s %s succeeded, and a GET once its owner takes connections again returns the value it replaced (%q)", w.verb, w.key, res.Item.Value)
		}
	}
}
