package upstream

import (
	"errors"
	"fmt"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestReplicas: a key's replicas are the first live nodes of its chain,
// the first being the node Do uses; a down node is skipped and a spare
// stands in; under FailFast only live home nodes are replicas.
func TestReplicas(t *testing.T) {
	mcs := memcachedtest.StartN(t, 4)
	for _, failFast := range []bool{false, true} {
		t.Run(fmt.Sprint("failfast=", failFast), func(t *testing.T) {
			c, _ := newTestCluster(t, mcs, func(o *Options) {
				if failFast {
					o.Failover = FailFast
				}
			})
			o := op.Op{Item: op.Item{Key: "some key"}}
			chain := c.Placement("some key").Chain
			s := c.Replicas(&o, 2)
			if len(s.Replicas) != 2 || s.Replicas[0].Node() != chain[0].Node || s.Replicas[1].Node() != chain[1].Node ||
				!s.Replicas[0].Home() || !s.Replicas[1].Home() {
				t.Fatalf("replicas %v, want the chain's first two (%v)", s.Replicas, chain)
			}
			first := c.topo.Load().nodes[0]
			for _, n := range c.topo.Load().nodes {
				if n.name == chain[0].Node {
					first = n
				}
			}
			first.eject("test", errors.New("test"), false)
			defer first.admit()
			s = c.Replicas(&o, 2)
			if failFast {
				if len(s.Replicas) != 1 || s.Replicas[0].Node() != chain[1].Node {
					t.Errorf("fail policy, owner down: replicas %v, want only %s", s.Replicas, chain[1].Node)
				}
				if _, ok := s.Spare(); ok {
					t.Error("fail policy: a spare")
				}
				return
			}
			if len(s.Replicas) != 2 || s.Replicas[0].Node() != chain[1].Node || s.Replicas[1].Node() != chain[2].Node || s.Replicas[1].Home() {
				t.Errorf("owner down: replicas %v, want %s and %s (not home)", s.Replicas, chain[1].Node, chain[2].Node)
			}
			if sp, ok := s.Spare(); !ok || sp.Node() != chain[3].Node {
				t.Errorf("spare %v, %v; want %s", sp, ok, chain[3].Node)
			}
			if _, ok := s.Spare(); ok {
				t.Error("a second spare from a chain of four with three taken")
			}
		})
	}
}

// TestDoOnAndGetMultiReplica: DoOn writes to the node given, capping the
// TTL off the key's home nodes; GetMultiReplica reads each key from the
// replica of the rank asked.
func TestDoOnAndGetMultiReplica(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.FailoverTTL = 30e9 })
	ctx := t.Context()
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys {
		o := op.Op{Verb: op.Set, Item: op.Item{Key: k, Value: []byte("r1-" + k)}}
		s := c.Replicas(&o, 2)
		if res := c.DoOn(ctx, o, s.Replicas[1]); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	found, failed := c.GetMultiReplica(ctx, keys, 0, nil, 1, 2)
	if len(found) != len(keys) || len(failed) != 0 {
		t.Errorf("rank 1: found %v, failed %v; want every key", found, failed)
	}
	found, failed = c.GetMultiReplica(ctx, keys, 0, nil, 0, 2)
	if len(found) != 0 || len(failed) != 0 {
		t.Errorf("rank 0: found %v, failed %v; want misses", found, failed)
	}
	if _, failed = c.GetMultiReplica(ctx, keys, 0, nil, 3, 3); !errors.Is(failed["a"], ErrNoNodes) {
		t.Errorf("rank 3 of 3: %v, want ErrNoNodes", failed["a"])
	}
	// A write off the key's home nodes gets FailoverTTL.
	o := op.Op{Verb: op.Set, Item: op.Item{Key: "ttl", Value: []byte("v")}}
	s := c.Replicas(&o, 1)
	sp, _ := s.Spare()
	if res := c.DoOn(ctx, o, sp); res.Err != nil {
		t.Fatal(res.Err)
	}
	if ttl := metaTTL(t, sp.Node(), "ttl"); ttl <= 0 || ttl > 30 {
		t.Errorf("TTL off the home node = %d, want the 30s cap", ttl)
	}
}
