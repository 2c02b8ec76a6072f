package upstream

import (
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestGetMultiNamesEachKeysNodeInAFailover: a multi-get that reads, from
// one node, a key that node owns and a key failed over to it (its owner
// ejected) names the node in the failed-over key's CAS, as Do does, and
// none in the owned key's, whichever comes first in the request. A CAS
// from the node the key failed over to that names no node is checked on
// the owner once it is back, whose counter is another: the conditional
// write could act on a version its client never read.
func TestGetMultiNamesEachKeysNodeInAFailover(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, faultOptions)
	runCluster(t, c)
	moved, owned := keyOwnedBy(t, c, 0), keyOwnedBy(t, c, 1)
	mcs[0].Kill()
	waitFor(t, 5*time.Second, "ejection", func() bool { return !c.topo.Load().nodes[0].available() })
	for _, k := range []string{moved, owned} {
		if err := c.Set(t.Context(), Item{Key: k, Value: []byte("v-" + k)}); err != nil {
			t.Fatal(err)
		}
	}
	next := c.topo.Load().nodes[1].tag
	want := map[string]uint32{moved: next, owned: 0}
	for k, w := range want {
		if res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: k}}); res.Err != nil || res.Item.CASNode != w {
			t.Fatalf("scenario: Do(get %q) = node %08x, %v; want node %08x", k, res.Item.CASNode, res.Err, w)
		}
	}
	for _, tt := range []struct {
		name string
		keys []string
	}{
		{"owned key first", []string{owned, moved}},
		{"failed-over key first", []string{moved, owned}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			found, failed := c.GetMulti(t.Context(), tt.keys, 0, nil)
			if len(failed) != 0 {
				t.Fatalf("GetMulti(%q) failed %v", tt.keys, failed)
			}
			for _, k := range tt.keys {
				it, ok := found[k]
				if !ok {
					t.Fatalf("GetMulti(%q) missed %q", tt.keys, k)
				}
				if it.CASNode != want[k] {
					t.Errorf("GetMulti(%q): %q names node %08x, want %08x (as Do names it)", tt.keys, k, it.CASNode, want[k])
				}
			}
		})
	}
}
