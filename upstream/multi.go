package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// maxKeysPerGet bounds one multi-key get command line (250-byte keys make
// a 25 KB line at most), well inside what memcached reads in one go.
const maxKeysPerGet = 100

// probeKeys is the most distinct keys a multi-get with a limit reads
// without first asking memcached their values' sizes (mcpipe's
// GetMultiLimit probe): the probe costs a round trip (a multi-get of 50
// 100-byte values through the gateway: 489 µs at the median instead of
// 355 µs, on loopback), and up to 32 keys of memcached's largest default
// item (1 MiB) make it send at most 32 MiB, twice the default answer
// room. Past it memcached is asked only for the values that fit the
// limit: 100 distinct 1 MB keys made it send 100 MB for 16 MiB answered,
// 16 MB with the probe.
const probeKeys = 32

// pick returns the node of t that serves a key now under the failover
// policy, and whether it is not the key's owner. storeKey is the key as
// sent to memcached (node.passedOver); for a write (write), each node
// down that it passes over records it (stale.go).
func (c *Cluster) pick(t *topology, hashKey, storeKey string, write bool) (n *node, failover bool, err error) {
	ignoreHealth := c.panicking(t)
	owner := -1
	for i := range t.ring.Owners(hashKey) {
		if owner < 0 {
			owner = i
		}
		if !t.nodes[i].passedOver(ignoreHealth, storeKey) {
			return t.nodes[i], i != owner, nil
		}
		if c.opts.Failover != FailFast && write && !t.nodes[i].skipForWrite(storeKey, c.placedBy(storeKey, hashKey)) {
			return t.nodes[i], i != owner, nil // re-admitted since
		}
		if c.opts.Failover == FailFast {
			return nil, false, fmt.Errorf("%w: %s, the key's node, is down (failover policy %q)", ErrNoNodes, t.nodes[i].name, FailFast)
		}
	}
	return nil, false, ErrNoNodes
}

// Up reports whether an operation on key could be served now: its node,
// or under the failover policy one it fails over to, is up.
func (c *Cluster) Up(key string) bool {
	sk, hk := c.keys(key)
	_, _, err := c.pick(c.topo.Load(), hk, sk, false)
	return err == nil
}

// Owner returns the index of key's home node, the first of its ring
// order (the node its operations go to while it is up), among the n
// nodes of the server list now: 0 <= i < n. The nodes' health does not
// change it; a new server list (SetServers) may change both.
func (c *Cluster) Owner(key string) (i, n int) {
	t := c.topo.Load()
	hk := key // the ring hashes the client's key unless HashWithPrefix: no key to build
	if c.opts.KeyPrefix != "" && c.opts.HashWithPrefix {
		_, hk = c.keys(key)
	}
	return t.ring.Owner(hk), len(t.nodes)
}

// GetMulti reads many keys with one multi-key get per node (up to 100 keys
// per command), all nodes in parallel, each key once however often it is
// asked for. It returns the items found and, for keys that could not be
// read, why; a key in neither map is a miss. Keys whose node fails are
// retried one by one through Get, which fails over like any read. limit,
// if positive, caps the bytes of values kept: the values of keys past it
// are dropped as they are read (their keys fail with ErrOverLimit), so
// that a reply of any size costs at most limit bytes. With more than
// probeKeys distinct keys and pipelined connections, the sizes of the
// values are asked first and the keys past the limit are not read at all
// (they fail with ErrOverLimit too).
func (c *Cluster) GetMulti(ctx context.Context, keys []string, limit int, room op.Room) (map[string]op.Item, map[string]error) {
	pick := func(t *topology, hashKey, storeKey string) (*node, bool, error) {
		return c.pick(t, hashKey, storeKey, false)
	}
	return c.getMulti(ctx, keys, limit, room, pick, true, false)
}

// GetMultiReplica is GetMulti reading each key from its replica of the
// given rank (0 the first) in its replica set of copies copies
// (Replicas): a replicated read's fallback, batched. A key whose set has
// no replica of that rank fails with ErrNoNodes; keys whose node fails
// fail with its error, and are not retried elsewhere: the caller's next
// rank is their retry.
func (c *Cluster) GetMultiReplica(ctx context.Context, keys []string, limit int, room op.Room, rank, copies int) (map[string]op.Item, map[string]error) {
	pick := func(t *topology, hashKey, storeKey string) (*node, bool, error) {
		return c.pickReplica(t, hashKey, storeKey, rank, max(copies, 1))
	}
	return c.getMulti(ctx, keys, limit, room, pick, false, true)
}

// pickReplica returns the replica of rank rank of a key's set of copies
// replicas, chosen as Replicas chooses them, and whether it is not one of
// the key's home nodes. storeKey is the key as sent to memcached
// (node.passedOver).
func (c *Cluster) pickReplica(t *topology, hashKey, storeKey string, rank, copies int) (n *node, failover bool, err error) {
	ignoreHealth := c.panicking(t)
	failFast := c.opts.Failover == FailFast
	pos, live := 0, 0
	for i := range t.ring.Owners(hashKey) {
		home := pos < copies
		pos++
		if failFast && !home {
			break
		}
		if t.nodes[i].passedOver(ignoreHealth, storeKey) {
			continue
		}
		if live == rank {
			if live >= copies {
				break // past the replica set: a spare, not a replica
			}
			return t.nodes[i], !home, nil
		}
		live++
	}
	return nil, false, fmt.Errorf("%w: the key has no replica %d up", ErrNoNodes, rank+1)
}

// getMulti implements GetMulti and GetMultiReplica: pick places each key;
// retry reads the keys of a node that failed one by one through Do;
// tagged names in each item found the node that gave out its CAS
// (op.Item.CASNode). Without tagged, an item found on a node other than
// its key's owner names that node all the same, as Do's do.
func (c *Cluster) getMulti(ctx context.Context, keys []string, limit int, vroom op.Room, pick func(t *topology, hashKey, storeKey string) (*node, bool, error), retry, tagged bool) (map[string]op.Item, map[string]error) {
	found := make(map[string]op.Item, len(keys))
	failed := map[string]error{}
	var mu sync.Mutex // guards found, failed and kept
	kept := 0         // bytes of values kept so far, against limit
	type batch struct {
		node   *node
		store  []string          // keys as sent
		client map[string]string // store key → client key
		// moved holds the store keys read here for an ejected owner:
		// per key, as keys the node owns share its batches.
		moved map[string]bool
	}
	t := c.topo.Load()
	batches := map[*node][]*batch{}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		sk, hk := c.keys(k)
		n, fo, err := pick(t, hk, sk)
		if err != nil {
			failed[k] = err
			continue
		}
		bs := batches[n]
		if len(bs) == 0 || len(bs[len(bs)-1].store) == maxKeysPerGet {
			bs = append(bs, &batch{node: n, client: map[string]string{}})
			batches[n] = bs
		}
		b := bs[len(bs)-1]
		b.store = append(b.store, sk)
		b.client[sk] = k
		if fo {
			if b.moved == nil {
				b.moved = map[string]bool{}
			}
			b.moved[sk] = true
		}
	}
	// With many keys, learn the values' sizes before reading them, so
	// that memcached sends only those that fit each batch's share of the
	// limit (room), about limit in all, not every value found.
	probe := limit > 0 && len(seen) > probeKeys
	// room is the share of limit a batch about to be read may keep: what
	// no batch has kept or reserved, split among the batches not yet
	// started, so that batches read at once never hold more than limit
	// between them. done gives back its reservation.
	unstarted, reserved := 0, 0
	for _, bs := range batches {
		unstarted += len(bs)
	}
	room := func() int {
		if limit <= 0 {
			return 0
		}
		mu.Lock()
		defer mu.Unlock()
		r := max(limit-kept-reserved, 0) / max(unstarted, 1)
		unstarted--
		reserved += r
		return max(r, 1) // 1: even an empty room drops every value
	}
	done := func(r int) {
		if limit > 0 {
			mu.Lock()
			reserved -= min(r, reserved)
			mu.Unlock()
		}
	}
	// keep adds it to found if the limit has room for it.
	keep := func(k string, it op.Item) {
		mu.Lock()
		defer mu.Unlock()
		if limit > 0 && kept+len(it.Value) > limit {
			failed[k] = ErrOverLimit
			return
		}
		kept += len(it.Value)
		found[k] = it
	}
	var wg sync.WaitGroup
	for _, bs := range batches {
		for _, b := range bs {
			wg.Go(func() {
				var items map[string]*memcache.Item
				var dropped, nofit []string
				r := room()
				defer done(r)
				// A batch whose read panicked fails its keys: absent
				// from both maps, they would read as misses.
				panicked := false
				defer func() {
					if panicked {
						mu.Lock()
						for _, sk := range b.store {
							if _, ok := found[b.client[sk]]; !ok {
								failed[b.client[sk]] = panicguard.ErrPanicked
							}
						}
						mu.Unlock()
					}
				}()
				defer c.multiPanics.RecoverNoting(&panicked)
				err := b.node.do(ctx, opGetMulti, len(b.moved) > 0, func(mc dataClient, _ bool) (err error) {
					items, dropped, nofit, err = mc.GetMultiLimit(ctx, b.store, r, vroom, probe)
					return err
				})
				var ne *NodeError
				if retry && errors.As(err, &ne) {
					// The node failed mid-batch: read its keys one by one,
					// which retries on the next node.
					for _, sk := range b.store {
						k := b.client[sk]
						res := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: k}, Room: vroom})
						if n := len(res.Item.Value); res.Err == nil && !res.Lent && vroom != nil && n > 0 {
							// A single Get asks its Room only for large
							// values: the multi-get's holds them all.
							if !vroom.Reserve(n) {
								res = op.Result{Err: ErrNoFit}
							} else {
								defer vroom.Release(n)
							}
						}
						switch err := res.Err; {
						case err == nil:
							keep(k, res.Item)
						case !errors.Is(err, ErrNotFound):
							mu.Lock()
							failed[k] = err
							mu.Unlock()
						}
					}
					return
				}
				if err != nil && !errors.Is(err, ErrNotFound) {
					mu.Lock()
					for _, sk := range b.store {
						failed[b.client[sk]] = err
					}
					mu.Unlock()
					return
				}
				for _, sk := range b.store {
					if it, ok := items[sk]; ok {
						k := b.client[sk]
						item := itemOf(k, it)
						if tagged || b.moved[sk] {
							item.CASNode = b.node.tag // as Do names it
						}
						keep(k, item)
					}
				}
				mu.Lock()
				for _, sk := range dropped {
					failed[b.client[sk]] = ErrOverLimit
				}
				for _, sk := range nofit {
					failed[b.client[sk]] = ErrNoFit
				}
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return found, failed
}
