package mcpipe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestItemsNotReadAfterReuse (issue #20): the reader keeps a shared gets
// line's item array for the next line, and the queue's array for the
// next calls. Callers on shared lines (single-key Gets, synchronous and
// asynchronous), replies of their own (multi-key Gets, GATs) and misses
// run at once on few connections, steadily and while memcached is
// paused past the timeout (connections failing mid-reply); every item a
// caller gets must be its key's, when it gets it and after everyone's
// later reads. Under -race a caller's read of an array the reader
// reused is also a race with the reader's write.
func TestItemsNotReadAfterReuse(t *testing.T) {
	for _, paused := range []bool{false, true} {
		t.Run(fmt.Sprintf("paused=%v", paused), func(t *testing.T) {
			m := memcachedtest.Start(t)
			c := newClient(m.Addr, 2, nil)
			t.Cleanup(func() { c.Close() })
			value := func(k string) string { return "v-" + k + "-" + strings.Repeat(k, len(k)%5+1) }
			const keys = 200
			for i := range keys {
				k := fmt.Sprintf("k%d", i)
				if err := c.Set(&memcache.Item{Key: k, Value: []byte(value(k)), Flags: uint32(i)}); err != nil {
					t.Fatal(err)
				}
			}
			stop := make(chan struct{})
			var pauses sync.WaitGroup
			if paused {
				pauses.Go(func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(200 * time.Millisecond):
						}
						m.Pause()
						time.Sleep(700 * time.Millisecond)
						m.Resume()
					}
				})
			}
			// check reports what is wrong with it as the item of key k ("" if
			// nothing is).
			check := func(k string, it *memcache.Item) string {
				if it == nil || it.Key != k || string(it.Value) != value(k) {
					return fmt.Sprintf("key %s: item %+v", k, it)
				}
				return ""
			}
			var mu sync.Mutex
			var kept []*memcache.Item // checked again once every worker is done
			var wg sync.WaitGroup
			for w := range 32 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 3))
					var mine []*memcache.Item
					defer func() {
						mu.Lock()
						kept = append(kept, mine...)
						mu.Unlock()
					}()
					deadline := time.Now().Add(2 * time.Second)
					for time.Now().Before(deadline) {
						n := rng.IntN(keys + 20)
						k, exists := fmt.Sprintf("k%d", n), n < keys // some misses
						var errs []string
						switch rng.IntN(9) {
						case 6: // a reply of its own
							ks := []string{k, fmt.Sprintf("k%d", rng.IntN(keys)), fmt.Sprintf("k%d", rng.IntN(keys))}
							items, err := c.GetMulti(ks)
							if err != nil {
								continue
							}
							for key, it := range items {
								if e := check(key, it); e != "" {
									errs = append(errs, "GetMulti: "+e)
								}
								mine = append(mine, it)
							}
							if _, ok := items[k]; ok != exists {
								errs = append(errs, fmt.Sprintf("GetMulti: %s found %v", k, ok))
							}
						case 7: // a GAT: a reply of its own
							it, _, err := c.Do(context.Background(), op.Op{Verb: op.GAT, Item: op.Item{Key: k}}, k)
							switch {
							case err == nil:
								if e := check(k, it); e != "" {
									errs = append(errs, "GAT: "+e)
								}
								mine = append(mine, it)
							case errors.Is(err, memcache.ErrCacheMiss) && exists:
								errs = append(errs, "GAT: a miss of "+k)
							}
						case 8: // on a shared line, called back by the reader
							done := make(chan string, 1)
							err := c.DoAsync(context.Background(), op.Op{Verb: op.Get, Item: op.Item{Key: k}}, k, func(it *memcache.Item, _ uint64, err error) {
								it = copied(it) // valid only until the callback returns
								switch {
								case err == nil:
									// kept before done: the worker's end, and
									// the check of kept after every worker's,
									// come after this append
									mu.Lock()
									kept = append(kept, it)
									mu.Unlock()
									done <- check(k, it)
								case errors.Is(err, memcache.ErrCacheMiss) && exists:
									done <- "a miss of " + k
								default:
									done <- ""
								}
							})
							if err == nil {
								if e := <-done; e != "" {
									errs = append(errs, "DoAsync: "+e)
								}
							}
						default: // on a shared line
							it, err := c.Get(k)
							switch {
							case err == nil:
								if e := check(k, it); e != "" {
									errs = append(errs, "Get: "+e)
								}
								mine = append(mine, it)
							case errors.Is(err, memcache.ErrCacheMiss) && exists:
								errs = append(errs, "Get: a miss of "+k)
							}
						}
						for _, e := range errs {
							t.Error(e)
						}
						if len(errs) > 0 {
							return
						}
					}
				})
			}
			wg.Wait()
			close(stop)
			pauses.Wait()
			for _, it := range kept {
				if e := check(it.Key, it); e != "" {
					t.Fatalf("an item changed after its caller had it: %s", e)
				}
			}
			t.Logf("%d items checked again", len(kept))
		})
	}
}

// TestSharedLineItemNotAllocated (issue #20): a Get on a shared gets line
// allocates its value's buffer and nothing else: its item is read into
// the reader's array and copied into the call (share), whose callback
// gets the call's own. (Do copies it out of the call before the call goes
// back to the pool: one allocation more.)
func TestSharedLineItemNotAllocated(t *testing.T) {
	if n := sharedLineAllocs(t, false); n > 1 {
		t.Errorf("DoAsync Get: %v allocations, want 1 (the value's buffer)", n)
	}
}

// TestSharedLineItemNotAllocatedAfterMiss: a line that memcached
// answered with misses alone leaves the reader's arrays for the next
// line as a line of hits does, so a Get after a miss allocates its
// value's buffer only, as one after a hit does.
func TestSharedLineItemNotAllocatedAfterMiss(t *testing.T) {
	if n := sharedLineAllocs(t, true); n > 1 {
		t.Errorf("DoAsync Get after a miss: %v allocations, want 1 (the value's buffer)", n)
	}
}

// sharedLineAllocs returns the fewest allocations, over three runs (a
// collection during one empties the pools the call draws on), of a
// DoAsync Get of a stored 400-byte value on a shared line, after a Get
// of a missing key if afterMiss. It skips the test under the race
// detector, which allocates.
func sharedLineAllocs(t *testing.T, afterMiss bool) float64 {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	key, value := strings.Repeat("k", 96), strings.Repeat("v", 400)
	if err := c.Set(&memcache.Item{Key: key, Value: []byte(value)}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	hit := func(it *memcache.Item, _ uint64, err error) {
		if err == nil && (it.Key != key || string(it.Value) != value) {
			err = fmt.Errorf("item %q of %d bytes", it.Key, len(it.Value))
		}
		got <- err
	}
	miss := func(_ *memcache.Item, _ uint64, err error) {
		if !errors.Is(err, memcache.ErrCacheMiss) {
			err = fmt.Errorf("a missing key's Get: %v, want a miss", err)
		} else {
			err = nil
		}
		got <- err
	}
	get := func(key string, done func(*memcache.Item, uint64, error)) {
		if err := c.DoAsync(context.Background(), op.Op{Verb: op.Get}, key, done); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	run := func() {
		if afterMiss {
			get("missing", miss)
		}
		get(key, hit)
	}
	run()
	n := 1e9
	for range 3 {
		n = min(n, testing.AllocsPerRun(200, run))
	}
	return n
}
