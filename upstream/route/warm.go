package route

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// Warm-up: a pool (cold) fills itself from another (warm) instead of from
// the database. The rule for each verb, in one place (docs/pools.md says
// the same for people; docs/decisions/0008-warm-up-and-shadow.md says why):
//
//   - get, gat: the cold pool first; on a miss, a get from the warm pool.
//     A warm hit is the answer, and is written back into the cold pool in
//     the background with add (a client's write that lands first wins),
//     with the warm item's remaining TTL (Cluster.TTL) less a second, so
//     that the copy never outlives the original; WarmDefaultTTL when the
//     TTL cannot be learned. A gat's write-back takes the gat's TTL. A
//     warm failure answers the cold pool's miss: a warm pool that is down
//     costs hits, never errors.
//   - head: as get, with a head of the warm pool, whose hit has no value
//     to write back: a HEAD fills nothing, and reads no value to answer.
//     A get marked op.Op.Peek (a read before a write of the key) is not
//     written back either: the write it precedes would race the copy.
//   - a touch marked op.Op.Retire (the chunks of a value replaced or
//     deleted, let go after a grace period) touches the key in both
//     pools at once and copies nothing: a copy of each chunk only to
//     let it expire would cost the whole value.
//   - every write: the cold pool answers, and the key is deleted from the
//     warm pool before the answer, so the warm pool never holds a value
//     older than the cold one: a later cold miss (an eviction, a shorter
//     TTL, a delete) cannot bring an overwritten or deleted value back.
//     set, add and delete run in both pools at once; the verbs that need
//     the item (replace, append, prepend, incr, decr, touch, cas,
//     append_cas, prepend_cas, delete_cas) first fill a cold miss from
//     the warm pool, synchronously, and try once more, then delete it
//     from the warm pool.
//
// A warm hit names the warm node that gave out its CAS value
// (op.Item.CASNode, warmNode), also where the warm pool keeps one copy: a
// cold node counts CAS values of its own, and the same number there can
// be another version of the key. So a cas (append_cas, prepend_cas,
// delete_cas) with a CAS value read from the warm pool fails its check in
// the cold pool (upstream.ErrCASNode), and the client reads again.
//
// What it does not promise: a get that read the warm pool just before a
// delete can write the old value back after it (the write-back is an add,
// so only when the cold pool has no value); add answers by the cold pool
// alone.

// warmDo runs o on a view with a warm pool.
func (v *view) warmDo(ctx context.Context, o op.Op) op.Result {
	switch {
	case o.Verb == op.Get || o.Verb == op.GAT || o.Verb == op.Head:
		return v.warmGet(ctx, o)
	case o.Verb == op.Touch && o.Retire:
		// Touched where it is, copied nowhere (op.Op.Retire); answered
		// found if either pool had it.
		var wg sync.WaitGroup
		var wres op.Result
		wg.Go(func() {
			defer v.bgPanics.Recover()
			wres = v.pol.warm.own(ctx, o)
		})
		res := v.own(ctx, o)
		wg.Wait()
		if errors.Is(res.Err, upstream.ErrNotFound) && wres.Err == nil {
			return wres
		}
		return res
	case needsItem(o.Verb):
		res := v.own(ctx, o)
		if errors.Is(res.Err, upstream.ErrNotFound) && v.fill(ctx, o) {
			res = v.own(ctx, o)
		}
		v.invalidate(ctx, o)
		return res
	case o.Verb.Writes():
		var wg sync.WaitGroup
		wg.Go(func() {
			defer v.bgPanics.Recover()
			v.invalidate(ctx, o)
		})
		res := v.own(ctx, o)
		wg.Wait()
		return res
	}
	return v.own(ctx, o)
}

// needsItem reports whether v changes an item that must exist, so that a
// key still only in the warm pool must be filled first.
func needsItem(v op.Verb) bool {
	switch v {
	case op.Replace, op.Append, op.Prepend, op.Incr, op.Decr, op.Touch, op.HeadTouch, op.CAS, op.AppendCAS, op.PrependCAS, op.DeleteCAS:
		return true
	}
	return false
}

// keyOp is a verb on o's key, placed as o is.
func keyOp(v op.Verb, o *op.Op) op.Op {
	return op.Op{Verb: v, Item: op.Item{Key: o.Item.Key}, HashKey: o.HashKey}
}

// warmGet is a get, gat or head: the cold pool, then the warm one.
func (v *view) warmGet(ctx context.Context, o op.Op) op.Result {
	res := v.own(ctx, o)
	m := &v.pol.wm
	switch {
	case res.Err == nil:
		m.coldHit.Inc()
		return res
	case !errors.Is(res.Err, upstream.ErrNotFound):
		return res
	}
	wv := op.Get
	if o.Verb == op.Head {
		wv = op.Head
	}
	wres := v.pol.warm.own(ctx, keyOp(wv, &o))
	switch {
	case wres.Err == nil:
		m.warmHit.Inc()
		if wv == op.Get && !o.Peek {
			v.writeBack(o, wres.Item)
		}
		v.warmNode(&o, &wres.Item)
		return op.Result{Item: wres.Item, N: wres.N}
	case errors.Is(wres.Err, upstream.ErrNotFound):
		m.miss.Inc()
	default:
		m.warmError.Inc()
	}
	return res
}

// warmNode names in it, an item the warm pool answered for o, the warm
// node that gave out its CAS value (op.Item.CASNode), unless the warm
// pool (a replicated one) named it already: a cold node counts CAS values
// of its own, so a write checked against this one must fail in the cold
// pool, where a plain number would be checked against another counter. A
// warm pool of one copy names its node by the node that serves the key
// now (the one that just answered, unless its health changed since), or,
// with none up, by the warm pool's name: either way no cold node, unless
// a cold replica is that very node.
func (v *view) warmNode(o *op.Op, it *op.Item) {
	if it.CASNode != 0 || it.CAS == 0 {
		return
	}
	w := v.pol.warm
	if set := w.c.Replicas(o, 1); len(set.Replicas) > 0 {
		it.CASNode = set.Replicas[0].Tag()
		return
	}
	it.CASNode = upstream.NodeTag(w.name)
}

// writeBack adds it, read from the warm pool for o, to the cold pool in
// the background, within the warm-up budget.
func (v *view) writeBack(o op.Op, it op.Item) {
	m := &v.pol.wm
	bg := v.pol.px.warmBG
	size := int64(len(it.Value))
	if !bg.acquire(size) {
		m.wbDropped.Inc()
		return
	}
	it.Value = bytes.Clone(it.Value) // the client's answer, which its caller may reuse once sent
	it.Key, o = strings.Clone(it.Key), ownKeys(o)
	o.Item.Value = nil
	go func() {
		defer bg.release(size)
		bctx, cancel := background(2 * (v.pol.warm.timeout + v.timeout))
		defer cancel()
		defer v.bgPanics.Recover()
		exp, ok := o.Item.Expiration, true
		if o.Verb != op.GAT {
			exp, ok = v.warmTTL(bctx, &o, it.CAS)
		}
		if !ok {
			return
		}
		add := op.Op{Verb: op.Add, Item: op.Item{Key: it.Key, Value: it.Value, Flags: it.Flags, Expiration: exp}, HashKey: o.HashKey}
		switch err := v.own(bctx, add).Err; {
		case err == nil:
			m.wbStored.Inc()
		case errors.Is(err, upstream.ErrExists):
			m.wbExists.Inc()
		default:
			v.copyFailed(err)
		}
	}()
}

// warmTTL is the expiration a copy of o's warm item, whose CAS value is
// cas, takes in the cold pool: its remaining TTL less a second (memcached
// counts whole seconds, and the two pools' clocks tick apart), or
// WarmDefaultTTL when the warm pool cannot tell it. false when no copy
// should be written: the item is gone or about to go, or it changed since
// it was read (the TTL would be another value's).
func (v *view) warmTTL(ctx context.Context, o *op.Op, cas uint64) (int32, bool) {
	m := &v.pol.wm
	ttl, got, err := v.pol.warm.c.TTL(ctx, keyOp(op.Get, o))
	switch {
	case err == nil && got != cas:
		m.wbChanged.Inc()
		return 0, false
	case err == nil && ttl == 0:
		m.ttlKnown.Inc()
		return 0, true
	case err == nil && ttl <= 1:
		m.wbExpired.Inc()
		return 0, false
	case err == nil:
		m.ttlKnown.Inc()
		return expiration(int64(ttl) - 1), true
	case errors.Is(err, upstream.ErrNotFound):
		m.wbExpired.Inc()
		return 0, false
	}
	m.ttlDefault.Inc()
	return v.pol.px.warmTTL, true
}

// expiration is a remaining lifetime in seconds as memcached takes an
// expiration: relative up to 30 days, a Unix time beyond.
func expiration(secs int64) int32 {
	if secs > relativeExpiryMax {
		return int32(time.Now().Unix() + secs)
	}
	return int32(secs)
}

// relativeExpiryMax is memcached's 30 days: larger expirations are Unix
// times.
const relativeExpiryMax = 60 * 60 * 24 * 30

// fill copies o's key from the warm pool into the cold one before a verb
// that needs the item, and reports whether it is in the cold pool now.
func (v *view) fill(ctx context.Context, o op.Op) bool {
	m := &v.pol.wm
	wres := v.pol.warm.own(ctx, keyOp(op.Get, &o))
	if wres.Err != nil {
		if !errors.Is(wres.Err, upstream.ErrNotFound) {
			m.warmError.Inc()
		}
		return false
	}
	exp, ok := v.warmTTL(ctx, &o, wres.Item.CAS)
	if !ok {
		return false
	}
	it := wres.Item
	add := op.Op{Verb: op.Add, Item: op.Item{Key: it.Key, Value: it.Value, Flags: it.Flags, Expiration: exp}, HashKey: o.HashKey}
	switch err := v.own(ctx, add).Err; {
	case err == nil:
		m.wbStored.Inc()
		return true
	case errors.Is(err, upstream.ErrExists):
		m.wbExists.Inc()
		return true
	default:
		v.copyFailed(err)
		return false
	}
}

// invalidate deletes o's key from the warm pool.
func (v *view) invalidate(ctx context.Context, o op.Op) {
	m := &v.pol.wm
	switch err := v.pol.warm.own(ctx, keyOp(op.Delete, &o)).Err; {
	case err == nil:
		m.invDeleted.Inc()
	case errors.Is(err, upstream.ErrNotFound):
		m.invAbsent.Inc()
	default:
		m.invFailed.Inc()
		if unlogged, ok := v.invLog.Pass(); ok && v.log != nil {
			v.log.LogAttrs(ctx, slog.LevelWarn, "a delete in the warm pool after a write failed: the warm pool may still hold an older value, which a miss of the pool would serve and copy back",
				slog.String("pool", v.name), slog.String("warm", v.pol.warm.name), slog.String("verb", o.Verb.String()),
				slog.String("err", err.Error()), slog.Uint64("unlogged_before", unlogged))
		}
	}
}

// copyFailed counts a copy from the warm pool that the pool did not
// take (err), and logs it at warn, a line a second at most per pool with
// the count held back before it: the key stays cold, read from the warm
// pool at each miss, until a later copy lands.
func (v *view) copyFailed(err error) {
	v.pol.wm.wbFailed.Inc()
	if unlogged, ok := v.copyLog.Pass(); ok && v.log != nil {
		v.log.LogAttrs(context.Background(), slog.LevelWarn, "a warm-up copy into the pool failed: the key stays cold, read from the warm pool until a later copy lands",
			slog.String("pool", v.name), slog.String("warm", v.pol.warm.name), slog.String("err", err.Error()), slog.Uint64("unlogged_before", unlogged))
	}
}

// warmGetMulti completes a multi-get of a view with a warm pool: the keys
// the cold pool did not have (found and failed are its answer) are read
// from the warm pool, added to found and written back. limit is the
// caller's byte limit (0: none), room where its values are held (nil:
// nowhere).
func (v *view) warmGetMulti(ctx context.Context, keys []string, limit int, room op.Room, found map[string]op.Item, failed map[string]error) {
	m := &v.pol.wm
	kept := 0
	for _, it := range found {
		kept += len(it.Value)
	}
	var missing []string
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		if _, ok := found[k]; ok {
			m.coldHit.Inc()
			continue
		}
		if _, ok := failed[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return
	}
	left := 0
	if limit > 0 {
		if left = limit - kept; left <= 0 {
			for _, k := range missing {
				failed[k] = upstream.ErrOverLimit
			}
			return
		}
	}
	wf, we := v.pol.warm.getMultiOwn(ctx, missing, left, room)
	for _, k := range missing {
		if it, ok := wf[k]; ok {
			m.warmHit.Inc()
			o := op.Op{Verb: op.Get, Item: op.Item{Key: k}}
			v.writeBack(o, it)
			v.warmNode(&o, &it)
			found[k] = it
			continue
		}
		switch err, ok := we[k]; {
		case !ok:
			m.miss.Inc()
		case errors.Is(err, upstream.ErrOverLimit):
			failed[k] = err
		default:
			m.warmError.Inc() // the cold pool's miss stands
		}
	}
}
