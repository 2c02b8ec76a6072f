package upstream

import (
	"fmt"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestHashKeyPlacement: an operation placed by HashKey lands on the node
// an operation on that key itself goes to, whether the key prefix is
// hashed or not (the chunks of a large value go to their index's node).
func TestHashKeyPlacement(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	for _, withPrefix := range []bool{false, true} {
		t.Run(fmt.Sprintf("HashWithPrefix=%v", withPrefix), func(t *testing.T) {
			c, _ := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix, o.HashWithPrefix = "app:", withPrefix })
			for i := range 20 {
				key := fmt.Sprintf("key-%d", i)
				other := fmt.Sprintf("placed-by-key-%d-%v", i, withPrefix)
				res := c.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: other, Value: []byte("v")}, HashKey: key})
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				owner := c.Placement(key).Chain[0].Node
				if _, err := memcache.New(owner).Get("app:" + other); err != nil {
					t.Errorf("%q placed by %q: not on %q, the key's node: %v", other, key, owner, err)
				}
			}
		})
	}
}
