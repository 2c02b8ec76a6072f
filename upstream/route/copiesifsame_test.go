package route

import (
	"context"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestCopiesIfSame: a CAS marked op.Op.CopiesIfSame that writes back the
// item read with an expiration in the past (chunk.Values.Drop) lets it
// go on the replica checked and on the other replica only where that
// one still holds the same item: another version there (other bytes, or
// the same bytes under other flags) stays. So also when the check is
// not answered (the replica checked paused past the caller's deadline):
// the copies then run under a deadline of their own.
func TestCopiesIfSame(t *testing.T) {
	for _, tt := range []struct {
		name       string
		other      string // written straight to the other replica ("" = nothing), with flags 7
		unanswered bool
		kept       bool // the other replica keeps its item
	}{
		{"same", "", false, false},
		{"newer", "newer", false, true},
		{"same bytes, other flags", "v", false, true},
		{"same, check unanswered", "", true, false},
		{"newer, check unanswered", "newer", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			byAddr := map[string]*memcachedtest.Server{mcs[0].Addr: mcs[0], mcs[1].Addr: mcs[1]}
			r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 2}}})
			const key = "copies-if-same"
			if err := set(t.Context(), r, key, "v"); err != nil {
				t.Fatal(err)
			}
			read := r.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: key}})
			if read.Err != nil {
				t.Fatal(read.Err)
			}
			checked, other := "", ""
			for _, n := range r.Placement(key).ReplicaNodes {
				if upstream.NodeTag(n) == read.Item.CASNode {
					checked = n
				} else {
					other = n
				}
			}
			if checked == "" || other == "" {
				t.Fatalf("scenario: replicas %v, the read named %08x", r.Placement(key).ReplicaNodes, read.Item.CASNode)
			}
			if tt.other != "" {
				directSet(t, other, key, tt.other, 0)
			}
			ctx := t.Context()
			if tt.unanswered {
				byAddr[checked].Pause()
				defer byAddr[checked].Resume()
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond) // before the node's own timeout
				defer cancel()
			}
			it := read.Item
			it.Key, it.Expiration = key, -1
			w := r.Do(ctx, op.Op{Verb: op.CAS, Item: it, CopiesIfSame: true})
			if tt.unanswered != (w.Err != nil) {
				t.Errorf("the CAS = %v, want an error only if unanswered", w.Err)
			}
			v, ok := direct(t, other, key)
			switch {
			case tt.kept && (!ok || v != tt.other):
				t.Errorf("the other replica holds %q (%v), want its own %q kept", v, ok, tt.other)
			case !tt.kept && ok:
				t.Errorf("the other replica holds %q, want the item read let go", v)
			}
			if !tt.unanswered {
				if v, ok := direct(t, checked, key); ok {
					t.Errorf("the replica checked holds %q, want the item let go", v)
				}
			}
		})
	}
}
