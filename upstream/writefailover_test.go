package upstream

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestWriteFailoverNeedsOwnerGone: a write whose owner, in service, times
// out (memcached stopped longer than Options.Timeout) is not stored on
// the next node: it fails with the owner's timeout. The owner is still
// where the key's reads go, and a 2xx for a value stored elsewhere would
// leave its older value (or, for a delete, the value deleted) read back
// until the key is written again (decisions/0086). Each write verb, by
// Do and by DoAsync, with the owner's connection made before it stopped
// (the reply times out) and with none (the dial times out: the stopped
// memcached's listen backlog is full, as a hung memcached's fills). Once
// the owner runs again it answers its own value, and the next node never
// got the key.
func TestWriteFailoverNeedsOwnerGone(t *testing.T) {
	// A backlog of one: two connections queued on the stopped memcached
	// make every further dial wait for an accept that never comes.
	mcs := memcachedtest.StartN(t, 2, "-b", "1")
	writes := []struct {
		verb  op.Verb
		value string // of the write
	}{
		{op.Set, "new"},
		{op.Add, "new"},
		{op.Replace, "new"},
		{op.Append, "+"},
		{op.Prepend, "+"},
		{op.Incr, ""},
		{op.Decr, ""},
		{op.Touch, ""},
		{op.Delete, ""},
	}
	apis := []struct {
		name string
		do   func(c *Cluster, o op.Op) op.Result
	}{
		{"Do", func(c *Cluster, o op.Op) op.Result { return c.Do(t.Context(), o) }},
		{"DoAsync", func(c *Cluster, o op.Op) op.Result {
			done := make(chan op.Result, 1)
			if !c.DoAsync(t.Context(), o, func(r op.Result) { done <- r }) {
				return c.Do(t.Context(), o) // no connection open, or gomemcache's pool: Do, as the gateway does
			}
			return <-done
		}},
	}
	for _, api := range apis {
		for _, connected := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/connected=%v", api.name, connected), func(t *testing.T) {
				// A cluster of its own: it has no connection to the owner
				// until the test makes one.
				c, _ := newTestCluster(t, mcs, func(o *Options) {
					o.Timeout = 200 * time.Millisecond
					o.Health.PassiveFails = 0 // the owner stays in service
				})
				ctx := t.Context()
				keys := ownedBy(c, 0, fmt.Sprintf("wf-%s-%v-", api.name, connected), len(writes))
				for _, k := range keys {
					rawSet(t, mcs[0].Addr, k, "7")
				}
				if connected {
					if res := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: keys[0]}}); res.Err != nil {
						t.Fatalf("GET %s with its owner running: %v", keys[0], res.Err)
					}
				}
				mcs[0].Pause()
				if !connected {
					mcs[0].FillBacklog()
				}
				results := make([]op.Result, len(writes))
				for i, w := range writes {
					o := op.Op{Verb: w.verb, Item: op.Item{Key: keys[i], Value: []byte(w.value), Expiration: 100}, Delta: 1}
					results[i] = api.do(c, o)
				}
				note := mcs[0].ResumedNote()
				mcs[0].Resume()
				for i, w := range writes {
					var ne *NodeError
					if !errors.As(results[i].Err, &ne) || !ne.Timeout() || ne.Node != mcs[0].Addr {
						t.Errorf("%s %s while its owner, in service, times out = %v; want the owner's timeout (*NodeError of %s)%s", w.verb, keys[i], results[i].Err, mcs[0].Addr, note)
					}
					if got, err := memcache.New(mcs[1].Addr).Get(keys[i]); !errors.Is(err, memcache.ErrCacheMiss) {
						t.Errorf("%s %s: the next node holds %v, %v; want nothing: the write does not leave its owner", w.verb, keys[i], got, err)
					}
					// The owner holds its value, or the write if it read
					// it before the reply timed out: never a 2xx answered
					// for a value a read does not return.
					res := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: keys[i]}})
					for try := 0; try < 5 && errors.As(res.Err, &ne); try++ {
						// Just resumed, it may not have accepted the
						// connection a dial waits on yet.
						res = c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: keys[i]}})
					}
					switch {
					case res.Err != nil && !errors.Is(res.Err, ErrNotFound):
						t.Errorf("GET %s once its owner runs again: %v", keys[i], res.Err)
					case results[i].Err == nil && res.Err == nil && string(res.Item.Value) == "7":
						t.Errorf("%s %s succeeded, and a GET once its owner runs again returns the value it replaced (%q)", w.verb, keys[i], res.Item.Value)
					}
				}
			})
		}
	}
}

// ownedBy returns n keys, each prefix and a number, that node i of c
// owns.
func ownedBy(c *Cluster, i int, prefix string, n int) []string {
	var out []string
	for j := 0; len(out) < n; j++ {
		k := fmt.Sprint(prefix, j)
		if o, _ := c.Owner(k); o == i {
			out = append(out, k)
		}
	}
	return out
}
