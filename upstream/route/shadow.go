package route

import (
	"bytes"
	"errors"
	"strings"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// Shadow: a stable sample of a pool's keys (by an FNV-1a hash of the key,
// the same in every gateway) is also sent to a shadow pool, after the
// client's answer is known and without delaying it; the shadow's answer
// is compared with the client's and counted, never returned. Every verb
// is mirrored, writes too, so that the shadow pool holds what the primary
// holds and its reads can be compared at all; a cas is mirrored as a set
// of the stored value (a CAS value is one node's), an append_cas or
// prepend_cas as an append or prepend of its bytes, a delete_cas as a
// delete, and only once the primary stored (or deleted) it. An operation whose primary answer is a failure is
// not mirrored: there is nothing to compare it with.
//
// Results: match (the same outcome and, for reads, the same value and
// flags; for incr and decr the same number), mismatch, or error (the
// shadow pool could not answer). Mirrored work runs in the background
// under the shadow budget; what does not fit is dropped and counted.

// shadowDo mirrors o, whose primary answer was res, to the shadow pool.
func (v *view) shadowDo(o op.Op, res op.Result) {
	if failure(res.Err) {
		return
	}
	verb := o.Verb // counted as the client's verb, whatever is sent
	switch o.Verb {
	case op.Get:
		// Mirrored as a multi-get of its key, so that the shadow's answer
		// is bounded in bytes as a multi-get's is: a shadow holding a
		// large value the primary lost cannot make a GET keep it.
		found, failed := map[string]op.Item{}, map[string]error{}
		switch {
		case res.Err == nil:
			found[o.Item.Key] = res.Item
		case !errors.Is(res.Err, upstream.ErrNotFound):
			failed[o.Item.Key] = res.Err
		}
		v.shadowGetMulti([]string{o.Item.Key}, found, failed)
		return
	case op.GAT:
		// Mirrored as a touch, whose answer has no value to hold: the
		// shadow's expiration follows the primary's, and only whether it
		// has the key is compared.
		o.Verb, res.Item.Value = op.Touch, nil
		if errors.Is(res.Err, upstream.ErrNoFit) {
			// memcached had the item and touched it; only its value
			// was refused (its op.Op.Room): a touch's success.
			res.Err = nil
		}
	}
	so := o
	if u := o.Verb.Unchecked(); u != o.Verb {
		if res.Err != nil {
			return
		}
		so.Verb, so.Item.CAS, so.Item.CASNode = u, 0, 0
	}
	size := int64(len(o.Item.Value) + len(res.Item.Value))
	bg := v.pol.px.shadBG
	if !bg.acquire(size) {
		v.pol.sm.dropped.Inc()
		return
	}
	// The caller reuses the value it sent (a PUT body's buffer) and may
	// reuse the one it read once it has answered: keep copies.
	so.Item.Value = bytes.Clone(o.Item.Value)
	so = ownKeys(so)
	res.Item.Value, res.Item.Key = bytes.Clone(res.Item.Value), strings.Clone(res.Item.Key)
	s, sm, ov, panics := v.pol.shadow, v.pol.sm, o.Verb, v.bgPanics
	go func() {
		defer bg.release(size)
		bctx, cancel := background(2 * s.timeout)
		defer cancel()
		defer panics.Recover()
		sres := s.own(bctx, so)
		sm.count(verb, compare(ov, res, sres))
	}()
}

// comparison is how a shadow answer compared with the primary's.
type comparison uint8

const (
	match comparison = iota
	mismatch
	shadowError
	numComparisons
)

func (c comparison) String() string {
	return [...]string{"match", "mismatch", "error"}[c]
}

// compare compares a shadow answer with the primary's.
func compare(v op.Verb, primary, shadow op.Result) comparison {
	if failure(shadow.Err) {
		return shadowError
	}
	if outcomeClass(primary.Err) != outcomeClass(shadow.Err) {
		return mismatch
	}
	if primary.Err != nil {
		return match // the same refusal or miss
	}
	switch v {
	case op.Get, op.GAT:
		if primary.Item.Flags != shadow.Item.Flags || !bytes.Equal(primary.Item.Value, shadow.Item.Value) {
			return mismatch
		}
	case op.Head, op.HeadTouch:
		if primary.Item.Flags != shadow.Item.Flags || primary.N != shadow.N {
			return mismatch
		}
	case op.Incr, op.Decr:
		if primary.N != shadow.N {
			return mismatch
		}
	}
	return match
}

// shadowGetMulti mirrors the sampled keys of a multi-get, whose primary
// answer is found and failed, to the shadow pool as one multi-get.
func (v *view) shadowGetMulti(keys []string, found map[string]op.Item, failed map[string]error) {
	type want struct {
		key string
		res op.Result
	}
	var sample []want
	var size int64
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] || !v.pol.sampled(k) {
			continue
		}
		seen[k] = true
		if err, ok := failed[k]; ok && failure(err) {
			continue
		}
		w := want{key: strings.Clone(k), res: op.Result{Err: upstream.ErrNotFound}} // kept past the request: see ownKeys
		if it, ok := found[k]; ok {
			it.Value, it.Key = bytes.Clone(it.Value), w.key // the caller's once returned
			w.res = op.Result{Item: it}
			size += int64(len(it.Value))
		} else if _, ok := failed[k]; ok {
			continue // over the byte limit, or refused by its Room: not kept, nothing to compare
		}
		sample = append(sample, w)
	}
	if len(sample) == 0 {
		return
	}
	// The shadow's values are kept up to twice the primary's (one byte
	// at least: 0 would be no limit), held against the budget with the
	// primary's copies: a shadow pool holding what the primary lost
	// cannot make a multi-get keep unbounded bytes in the background. A
	// value past that is one the shadow has: a mismatch if the primary
	// missed the key, else not compared (dropped).
	room := max(2*size, 1)
	held := size + room
	bg := v.pol.px.shadBG
	if !bg.acquire(held) {
		v.pol.sm.dropped.Add(float64(len(sample)))
		return
	}
	s, sm, panics := v.pol.shadow, v.pol.sm, v.bgPanics
	go func() {
		defer bg.release(held)
		bctx, cancel := background(2 * s.timeout)
		defer cancel()
		defer panics.Recover()
		ks := make([]string, len(sample))
		for i, w := range sample {
			ks[i] = w.key
		}
		sf, se := s.getMultiOwn(bctx, ks, int(room), nil) // its values within the room held above
		for _, w := range sample {
			sres := op.Result{Err: upstream.ErrNotFound}
			if it, ok := sf[w.key]; ok {
				sres = op.Result{Item: it}
			} else if err, ok := se[w.key]; ok {
				sres = op.Result{Err: err}
			}
			if errors.Is(sres.Err, upstream.ErrOverLimit) && w.res.Err == nil {
				if len(sample) == 1 {
					// Alone, past twice the primary's length: longer
					// than the primary's value, so not the same.
					sm.count(op.Get, mismatch)
					continue
				}
				sm.dropped.Inc()
				continue
			}
			sm.count(op.Get, compare(op.Get, w.res, sres))
		}
	}()
}
