package gateway

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
)

// WriteOrder keeps a key's synchronous writes behind the asynchronous
// writes of that key accepted before them (docs/http-api.md,
// "Asynchronous writes"): a client that got a 202 and then a 201 for the
// same key must find the 201's value, not have the queued write land on
// top of it. The async queue counts each write it accepts until it is
// applied or counted as failed; a synchronous write of a key with such
// writes waits for them (within its request's deadline) before anything
// is sent.
//
// The common case, no asynchronous write of the key pending, costs a hash
// and an atomic load: a counter per bucket of keys answers "none" without
// a lock. Only a bucket with writes pending looks the key up in a map.
//
// One WriteOrder serves one Handler and the routes that write beside it
// (the HttpMemcModule endpoints, through Ordered). The zero value is not
// usable; a nil *WriteOrder orders nothing.
type WriteOrder struct {
	seed    maphash.Seed
	buckets [orderBuckets]atomic.Int32 // writes pending per bucket of keys: 0 means none of its keys waits
	shards  [orderShards]orderShard

	waited   *prometheus.CounterVec // by result: the two below
	ran      prometheus.Counter     // synchronous writes that waited, then ran
	timedOut prometheus.Counter     // synchronous writes whose deadline passed while they waited
}

// orderBuckets is how many counters the keys are spread over: enough that
// a few keys written asynchronously leave almost every other key's check
// at one load.
const orderBuckets = 4096

// orderShards is how many locks the keys with writes pending are spread
// over, so that workers finishing writes of different keys do not queue
// for one.
const orderShards = 64

// orderShard holds the keys of some buckets that have asynchronous
// writes pending.
type orderShard struct {
	mu   sync.Mutex
	keys map[string]keyWrites // guarded by mu; a key leaves when nothing of it is pending or waited for
}

// keyWrites is one key's asynchronous writes, counted as they are
// accepted (numbered in that order) and as they are applied (or fail),
// and the synchronous writes waiting for some of them. The numbers still
// pending are kept, not a count: a key's writes are applied one after
// another by one worker, but a reload that moves the key to another node
// may apply a later one, on its new worker, before an earlier one.
type keyWrites struct {
	accepted uint64   // the number of the last write accepted
	pending  []uint64 // the numbers of those not applied yet, in ascending order (accepted appends, applied deletes)
	waiters  []orderWaiter
}

// first is the lowest number pending, or none.
func (k *keyWrites) first() (uint64, bool) {
	if len(k.pending) == 0 {
		return 0, false
	}
	return k.pending[0], true
}

// orderWaiter is a synchronous write waiting until no write numbered upTo
// or lower is pending: the writes of its key accepted before it.
type orderWaiter struct {
	upTo uint64
	ch   chan struct{} // closed when they are
}

// NewWriteOrder returns an empty WriteOrder. Its metrics are registered
// by the Handler given it (Options.WriteOrder).
func NewWriteOrder() *WriteOrder {
	w := &WriteOrder{seed: maphash.MakeSeed()}
	w.waited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_sync_writes_waited_total",
		Help: "Synchronous writes that waited for asynchronous writes of their key accepted before them (Prefer: respond-async) to be applied, by result: ran, or deadline (MEMCGATE_REQUEST_TIMEOUT passed first: 504, nothing sent).",
	}, []string{"result"})
	w.ran, w.timedOut = w.waited.WithLabelValues("ran"), w.waited.WithLabelValues("deadline")
	return w
}

// where returns key's bucket and shard.
func (w *WriteOrder) where(key string) (bucket *atomic.Int32, sh *orderShard) {
	h := maphash.String(w.seed, key)
	return &w.buckets[h%orderBuckets], &w.shards[(h/orderBuckets)%orderShards]
}

// accepted counts an asynchronous write of key as pending and returns
// its number, for applied. The queue calls it before the write can be
// applied, and before the 202 is sent.
func (w *WriteOrder) accepted(key string) uint64 {
	b, sh := w.where(key)
	sh.mu.Lock()
	if sh.keys == nil {
		sh.keys = map[string]keyWrites{}
	}
	k := sh.keys[key]
	k.accepted++
	k.pending = append(k.pending, k.accepted)
	sh.keys[key] = k
	b.Add(1) // under mu, so that a bucket at 0 never hides a key in the map
	sh.mu.Unlock()
	return k.accepted
}

// applied counts the asynchronous write of key numbered n (accepted's)
// as done: memcached answered, it failed, or it left as a UDP datagram
// nobody answers. It releases the synchronous writes that waited for it
// and no write before it.
func (w *WriteOrder) applied(key string, n uint64) {
	b, sh := w.where(key)
	sh.mu.Lock()
	k := sh.keys[key]
	if i := slices.Index(k.pending, n); i >= 0 {
		k.pending = slices.Delete(k.pending, i, i+1)
	}
	first, ok := k.first()
	k.waiters = slices.DeleteFunc(k.waiters, func(o orderWaiter) bool {
		if !ok || first > o.upTo {
			close(o.ch)
			return true
		}
		return false
	})
	if len(k.pending) == 0 && len(k.waiters) == 0 {
		delete(sh.keys, key)
	} else {
		sh.keys[key] = k
	}
	b.Add(-1)
	sh.mu.Unlock()
}

// pending reports whether key has asynchronous writes accepted and not
// yet applied.
func (w *WriteOrder) pending(key string) bool {
	if w == nil {
		return false
	}
	b, sh := w.where(key)
	if b.Load() == 0 {
		return false
	}
	sh.mu.Lock()
	k, ok := sh.keys[key]
	sh.mu.Unlock()
	return ok && len(k.pending) > 0
}

// wait returns once the asynchronous writes of key accepted so far have
// been applied (or have failed), or, if ctx ends first, an error
// wrapping ErrWaitedForAsync and ctx's error: the caller must then send
// nothing. Writes accepted while it waits are not waited for, so a key
// written asynchronously without pause cannot hold a synchronous write
// back forever.
func (w *WriteOrder) wait(ctx context.Context, key string) error {
	if w == nil {
		return nil
	}
	b, sh := w.where(key)
	if b.Load() == 0 {
		return nil
	}
	sh.mu.Lock()
	k, ok := sh.keys[key]
	if !ok || len(k.pending) == 0 {
		sh.mu.Unlock()
		return nil
	}
	me := orderWaiter{upTo: k.accepted, ch: make(chan struct{})}
	k.waiters = append(k.waiters, me)
	sh.keys[key] = k
	sh.mu.Unlock()
	select {
	case <-me.ch:
		w.ran.Inc()
		return nil
	case <-ctx.Done():
	}
	sh.mu.Lock()
	k, ok = sh.keys[key]
	gone := true // applied closed me.ch meanwhile
	if ok {
		n := len(k.waiters)
		k.waiters = slices.DeleteFunc(k.waiters, func(o orderWaiter) bool { return o.ch == me.ch })
		gone = len(k.waiters) == n
		if len(k.pending) == 0 && len(k.waiters) == 0 {
			delete(sh.keys, key)
		} else {
			sh.keys[key] = k
		}
	}
	sh.mu.Unlock()
	if gone {
		w.ran.Inc() // the writes were applied as the deadline came: go
		return nil
	}
	w.timedOut.Inc()
	return fmt.Errorf("%w: %w", ErrWaitedForAsync, ctx.Err())
}

// Doer runs one operation on its key's node (memc.Store and chunk.Store
// are the same method).
type Doer interface {
	Do(ctx context.Context, o op.Op) op.Result
}

// Ordered returns s with its writes kept behind the asynchronous writes
// of their key (Item.Key, the key memcached stores) accepted before them,
// for endpoints that write beside the Handler (the HttpMemcModule ones).
// A write whose ctx ends while it waits fails with nothing sent.
func (w *WriteOrder) Ordered(s Doer) Doer { return orderedDoer{s: s, w: w} }

// orderedDoer is what Ordered returns.
type orderedDoer struct {
	s Doer
	w *WriteOrder
}

// Do waits, for a write, then runs o on the store.
func (d orderedDoer) Do(ctx context.Context, o op.Op) op.Result {
	if o.Verb.Writes() {
		if err := d.w.wait(ctx, o.Item.Key); err != nil {
			return op.Result{Err: err}
		}
	}
	return d.s.Do(ctx, o)
}
