package route

import (
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestCheckedWriteWithACopyMissing: a write checked on the replica its
// CAS names, whose other replica lacks the key (evicted, or flushed on
// its return), is answered by the check: the delete, append or prepend
// done there succeeds, although the unchecked copy finds no item on the
// other replica. A miss (412 for a conditional delete) would tell the
// client nothing was written when the version it read is gone or
// changed.
func TestCheckedWriteWithACopyMissing(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 2}}})
	ctx := t.Context()
	tests := []struct {
		verb op.Verb
		want string // on the replica checked; "" for none
	}{
		{op.DeleteCAS, ""},
		{op.AppendCAS, "v+"},
		{op.PrependCAS, "+v"},
	}
	for _, tt := range tests {
		t.Run(tt.verb.String(), func(t *testing.T) {
			key := "missing-" + strings.ReplaceAll(tt.verb.String(), "_", "-")
			if err := set(ctx, r, key, "v"); err != nil {
				t.Fatal(err)
			}
			res := r.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: key}})
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			checked, other := "", ""
			for _, n := range r.Placement(key).ReplicaNodes {
				if upstream.NodeTag(n) == res.Item.CASNode {
					checked = n
				} else {
					other = n
				}
			}
			if checked == "" || other == "" {
				t.Fatalf("scenario: replicas %v, the read named %08x", r.Placement(key).ReplicaNodes, res.Item.CASNode)
			}
			mc := memcache.New(other)
			err := mc.Delete(key)
			mc.Close()
			if err != nil {
				t.Fatalf("scenario: deleting the copy on %s: %v", other, err)
			}
			w := r.Do(ctx, op.Op{Verb: tt.verb, Item: op.Item{Key: key, Value: []byte("+"), CAS: res.Item.CAS, CASNode: res.Item.CASNode}})
			if w.Err != nil {
				t.Errorf("%v checked on %s, with no copy on %s = %v, want success", tt.verb, checked, other, w.Err)
			}
			v, ok := direct(t, checked, key)
			if got := map[bool]string{true: v}[ok]; got != tt.want {
				t.Errorf("after %v, %s holds %q, want %q", tt.verb, checked, got, tt.want)
			}
		})
	}
}
