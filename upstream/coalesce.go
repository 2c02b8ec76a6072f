package upstream

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
)

// Get batching. When every connection slot of a node is busy, a Get does
// not just queue for a slot: it leaves its key in the node's pending list,
// and whoever frees a slot next first sends all pending keys (up to 100)
// as one multi-key get on its connection, then hands the slot on. Under
// load, many client requests cost one memcached round trip and one write
// and read syscall pair; identical keys in a batch are fetched once. A node
// with a free slot never batches, so an idle gateway adds no latency.
//
// Why no lost wake-up: a waiter first appends itself to pending, then waits
// for either its result or a free slot. Every slot holder looks at pending
// before releasing its slot, and a holder that found pending empty releases
// the slot, which a waiter that appended later can then take itself. A
// waiter that gets a slot after a holder took its key releases the slot
// (serving others first) and only waits for its result: it never spins on
// the semaphore while its batch is in flight.

// getWaiter is one Get parked in a node's pending list.
type getWaiter struct {
	key   string // as sent to memcached
	done  chan getResult
	taken bool // guarded by the node's pmu: a holder has it in a batch
}

type getResult struct {
	it  *memcache.Item
	err error
}

// get reads one key, batching it with other parked Gets when the node's
// slots are all busy (and batching is on). o is the Get, for its Room.
// A Get with a Room on a pipelined node is never parked: a batch is read
// whole, each value into a buffer of its own, outside every budget (up
// to maxKeysPerGet values of a megabyte each, for clients who chose the
// keys), so it waits for a slot instead; on its connection it shares a
// gets line with the Gets around it all the same, each value held
// against its own caller's Room. On gomemcache's pool a Get with a Room
// of a key known large is never parked either (getLarge), and a batch's
// reply reads at most Options.UnheldClaim of values outside the budget
// (claimConn; past that the budget holds them, and a refused batch's
// keys are read again each on its own: alone). lent reports whether the
// value is in a buffer o.Lend lent (op.Result.Lent).
func (n *node) get(ctx context.Context, key string, o op.Op) (it *memcache.Item, lent bool, err error) {
	o = op.Op{Verb: op.Get, Room: o.Room, Bulk: o.Bulk, Client: o.Client}
	if n.hints != nil && o.Room != nil {
		return n.getHinted(ctx, key, o)
	}
	return n.getBatching(ctx, key, o)
}

// getBatching is get for a Get that may be parked.
func (n *node) getBatching(ctx context.Context, key string, o op.Op) (it *memcache.Item, lent bool, err error) {
	if n.take() {
		it, err = n.getHolding(key, o)
		return it, n.lent(&o, it), err
	}
	if !n.batchGets || ((o.Room != nil || o.Bulk) && n.pipe != nil) {
		err := n.do(ctx, verbOp(op.Get), false, func(mc dataClient, _ bool) (err error) {
			it, _, err = mc.Do(ctx, o, key)
			return err
		})
		return it, n.lent(&o, it), err
	}
	if err := n.join(); err != nil {
		n.m.ops[verbOp(op.Get)][resultOf(err)].Inc()
		return nil, false, err
	}
	defer n.leave()
	w := &getWaiter{key: key, done: make(chan getResult, 1)}
	n.pmu.Lock()
	n.pending = append(n.pending, w)
	n.pmu.Unlock()
	select {
	case r := <-w.done:
		if r.err == errBatchNoFit {
			return n.alone(ctx, key, o)
		}
		return r.it, false, r.err
	case n.sem <- struct{}{}:
		if ctx.Err() != nil {
			// Won as ctx ended (select picks either ready case at
			// random, and a goroutine woken with the slot may run
			// late): given back bare, as waitSlot does. Sent, the batch
			// would hold this caller one more timeout past its deadline
			// against a stalled node; the other parked Gets wait on the
			// slot themselves.
			<-n.sem
			return n.unpark(ctx, w)
		}
		// A slot is ours. If no holder has taken our key yet, send it
		// with the other parked keys; either way our result then comes.
		n.pmu.Lock()
		var batch []*getWaiter
		if !w.taken {
			batch = n.takeLocked(w)
		}
		n.pmu.Unlock()
		if batch != nil {
			n.runBatch(batch)
		}
		n.release()
		r := <-w.done
		if r.err == errBatchNoFit {
			return n.alone(ctx, key, o)
		}
		return r.it, false, r.err
	case <-ctx.Done():
		return n.unpark(ctx, w)
	}
}

// unpark ends the wait of w, a parked Get whose ctx ended: it leaves the
// pending list with ctx's error, or, in a batch already, waits for the
// batch's result (its socket timeout bounds the wait).
func (n *node) unpark(ctx context.Context, w *getWaiter) (*memcache.Item, bool, error) {
	n.pmu.Lock()
	if !w.taken {
		for i, p := range n.pending {
			if p == w {
				n.pending = append(n.pending[:i], n.pending[i+1:]...)
				break
			}
		}
		n.pmu.Unlock()
		err := ctxError(n.name, "get", ctx.Err())
		n.m.ops[verbOp(op.Get)][resultOf(err)].Inc()
		return nil, false, err
	}
	n.pmu.Unlock()
	r := <-w.done
	if r.err == errBatchNoFit {
		err := ctxError(n.name, "get", ctx.Err())
		n.m.ops[verbOp(op.Get)][resultOf(err)].Inc()
		return nil, false, err
	}
	return r.it, false, r.err
}

// errBatchNoFit is a parked Get's result when its batch's reply held
// more than its unheld bytes (Options.UnheldClaim) and the byte budget
// refused the rest (claimConn): its key is read again on its own.
var errBatchNoFit = errors.New("upstream: the batch's values did not fit the byte budget")

// alone reads key again on its own for a parked Get whose batch was
// refused for the byte budget (errBatchNoFit), as an unparked Get does:
// a reply of one value reads up to Options.UnheldClaim unheld, so that
// a small value is not refused for the large ones it was batched with.
func (n *node) alone(ctx context.Context, key string, o op.Op) (*memcache.Item, bool, error) {
	var it *memcache.Item
	err := n.do(ctx, verbOp(op.Get), false, func(mc dataClient, _ bool) (err error) {
		it, _, err = mc.Do(ctx, o, key)
		return err
	})
	return it, n.lent(&o, it), err
}

// takeLocked removes a batch from the pending list and marks its waiters
// taken: first, if not nil, then the oldest others, up to maxKeysPerGet.
// n.pmu must be held.
func (n *node) takeLocked(first *getWaiter) []*getWaiter {
	batch := make([]*getWaiter, 0, min(len(n.pending), maxKeysPerGet))
	if first != nil {
		first.taken = true
		batch = append(batch, first)
	}
	rest := n.pending[:0]
	for _, p := range n.pending {
		if p == first {
			continue
		}
		if len(batch) < maxKeysPerGet {
			p.taken = true
			batch = append(batch, p)
			continue
		}
		rest = append(rest, p)
	}
	clear(n.pending[len(rest):])
	n.pending = rest
	return batch
}

// lent reports whether it, read by o on its own, is in a buffer o.Room
// lent: the pipelined client borrows for every value of op.LentValue
// bytes or more, gomemcache's pool for none.
func (n *node) lent(o *op.Op, it *memcache.Item) bool {
	return n.pipe != nil && o.Room != nil && it != nil && len(it.Value) >= op.LentValue
}

// getHolding runs a single get while holding a slot, then releases it.
func (n *node) getHolding(key string, o op.Op) (*memcache.Item, error) {
	start := time.Now()
	it, _, err := n.client.Do(context.Background(), o, key) // a Get never waits before it is sent
	err = classify(n.name, "get", err)
	n.m.duration[verbOp(op.Get)].Observe(time.Since(start).Seconds())
	n.m.ops[verbOp(op.Get)][resultOf(err)].Inc()
	n.observe(err)
	n.release()
	return it, err
}

// release gives up a slot the caller holds, after sending one batch of
// pending gets if there are any.
func (n *node) release() {
	if !n.batchGets {
		<-n.sem
		return
	}
	n.pmu.Lock()
	var batch []*getWaiter
	if len(n.pending) > 0 {
		batch = n.takeLocked(nil)
	}
	n.pmu.Unlock()
	if batch != nil {
		n.runBatch(batch)
	}
	<-n.sem
}

// runBatch fetches the waiters' keys with one multi-key get and delivers
// each result.
func (n *node) runBatch(batch []*getWaiter) {
	keys := make([]string, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	for _, w := range batch {
		if !seen[w.key] {
			seen[w.key] = true
			keys = append(keys, w.key)
		}
	}
	start := time.Now()
	var items map[string]*memcache.Item
	var err error
	if len(keys) == 1 {
		var it *memcache.Item
		if it, _, err = n.client.Do(context.Background(), op.Op{Verb: op.Get}, keys[0]); err == nil { // a Get never waits before it is sent
			items = map[string]*memcache.Item{keys[0]: it}
		} else if errors.Is(err, memcache.ErrCacheMiss) {
			err = nil
		}
	} else {
		items, err = n.client.GetMulti(keys)
	}
	err = classify(n.name, "get", err)
	n.m.duration[opGetMulti].Observe(time.Since(start).Seconds())
	n.m.ops[opGetMulti][resultOf(err)].Inc()
	n.m.batched.Add(float64(len(batch)))
	n.observe(err)
	alone := len(keys) > 1 && errors.Is(err, ErrNoFit)
	for _, w := range batch {
		if alone {
			w.done <- getResult{err: errBatchNoFit} // counted when read alone
			continue
		}
		r := getResult{err: err}
		if err == nil {
			if r.it = items[w.key]; r.it == nil {
				r.err = ErrNotFound
			}
		}
		n.m.ops[verbOp(op.Get)][resultOf(r.err)].Inc()
		w.done <- r
	}
}

// pendingGets guards a node's list of parked Gets.
type pendingGets struct {
	pmu     sync.Mutex // guards pending
	pending []*getWaiter
}
