package route

import (
	"context"
	"errors"
	"sync"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// GetMulti reads many keys, each once, with one upstream GetMulti per
// pool (the pools in parallel), and in a replicated pool falls back per
// key: the keys its first replicas failed (or missed, with MissFallback)
// are read from their next replicas, still batched per node. It returns
// what upstream.Cluster.GetMulti returns. limit caps the bytes of values
// kept over all pools: with several pools, each first gets an equal
// share, and the keys that did not fit theirs are read again with what
// the others left.
func (r *Router) GetMulti(ctx context.Context, keys []string, limit int, room op.Room) (map[string]op.Item, map[string]error) {
	t := r.t.Load()
	if t.direct {
		return t.def.c.GetMulti(ctx, keys, limit, room)
	}
	var order []*view
	groups := map[*view][]string{}
	for _, k := range keys {
		v, _ := t.pick(k)
		if groups[v] == nil {
			order = append(order, v)
		}
		groups[v] = append(groups[v], k)
	}
	if len(order) == 1 {
		return order[0].getMulti(ctx, keys, limit, room)
	}
	type part struct {
		found  map[string]op.Item
		failed map[string]error
	}
	parts := make([]part, len(order))
	share := 0
	if limit > 0 {
		share = max(limit/len(order), 1)
	}
	var wg sync.WaitGroup
	for i, v := range order {
		wg.Go(func() {
			// A pool's read that panicked fails its keys: absent from
			// both maps, they would read as misses.
			panicked := false
			defer func() {
				if panicked {
					parts[i].found, parts[i].failed = nil, failAll(groups[v], panicguard.ErrPanicked)
				}
			}()
			defer v.readPanics.RecoverNoting(&panicked)
			parts[i].found, parts[i].failed = v.getMulti(ctx, groups[v], share, room)
		})
	}
	wg.Wait()
	found := make(map[string]op.Item, len(keys))
	failed := map[string]error{}
	kept := 0
	for _, p := range parts {
		for k, it := range p.found {
			found[k] = it
			kept += len(it.Value)
		}
		for k, err := range p.failed {
			failed[k] = err
		}
	}
	if limit <= 0 {
		return found, failed
	}
	// The keys past their pool's share, again with what is left.
	for i, v := range order {
		var over []string
		for k, err := range parts[i].failed {
			if errors.Is(err, upstream.ErrOverLimit) {
				over = append(over, k)
			}
		}
		if len(over) == 0 || limit-kept <= 0 {
			continue
		}
		f, e := v.getMulti(ctx, over, limit-kept, room)
		for _, k := range over {
			if it, ok := f[k]; ok {
				found[k] = it
				kept += len(it.Value)
				delete(failed, k)
			} else if err, ok := e[k]; ok {
				failed[k] = err
			} else {
				delete(failed, k) // a miss now
			}
		}
	}
	return found, failed
}

// getMulti reads keys of one pool under its policies: getMultiOwn, then
// the warm pool for the keys it did not find, and the shadow sample
// mirrored.
func (v *view) getMulti(ctx context.Context, keys []string, limit int, room op.Room) (map[string]op.Item, map[string]error) {
	if !v.pol.active() {
		return v.getMultiOwn(ctx, keys, limit, room)
	}
	found, failed := v.getMultiOwn(ctx, keys, limit, room)
	if v.pol.warm != nil {
		v.warmGetMulti(ctx, keys, limit, room, found, failed)
	}
	if v.pol.shadow != nil {
		v.shadowGetMulti(keys, found, failed)
	}
	return found, failed
}

// getMultiOwn reads keys of one pool: its cluster's GetMulti for one copy;
// for several, each key from its first replica, then the keys not found
// from their next replicas, rank by rank.
func (v *view) getMultiOwn(ctx context.Context, keys []string, limit int, room op.Room) (map[string]op.Item, map[string]error) {
	if v.replicas == 1 {
		return v.c.GetMulti(ctx, keys, limit, room)
	}
	found, failed := v.c.GetMultiReplica(ctx, keys, limit, room, 0, v.replicas)
	kept := 0
	for _, it := range found {
		kept += len(it.Value)
	}
	missed := map[string]bool{} // keys a replica answered a miss for
	seen := make(map[string]bool, len(keys))
	var left []string
	for _, k := range keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		if _, ok := found[k]; ok {
			continue
		}
		switch err, ok := failed[k]; {
		case !ok:
			missed[k] = true
			if v.miss {
				left = append(left, k)
			}
		case failure(err) && !errors.Is(err, upstream.ErrNoNodes):
			left = append(left, k)
		}
	}
	for rank := 1; rank < v.replicas && len(left) > 0 && ctx.Err() == nil; rank++ {
		rest := 0
		if limit > 0 {
			if rest = limit - kept; rest <= 0 {
				for _, k := range left {
					failed[k] = upstream.ErrOverLimit
				}
				break
			}
		}
		for _, k := range left {
			if missed[k] {
				v.pm.fallbackMiss.Inc()
			} else {
				v.pm.fallbackError.Inc()
			}
		}
		f, e := v.c.GetMultiReplica(ctx, left, rest, room, rank, v.replicas)
		var next []string
		for _, k := range left {
			if it, ok := f[k]; ok {
				found[k] = it
				kept += len(it.Value)
				delete(failed, k)
				continue
			}
			err, ok := e[k]
			switch {
			case !ok: // a miss here
				missed[k] = true
				delete(failed, k)
				if v.miss {
					next = append(next, k)
				}
			case errors.Is(err, upstream.ErrNoNodes):
				// No replica of this rank is up, nor of the next ones.
			case failure(err):
				if !missed[k] {
					failed[k] = err
				}
				next = append(next, k)
			default:
				failed[k] = err
			}
		}
		left = next
	}
	return found, failed
}

// failAll maps each of keys to err.
func failAll(keys []string, err error) map[string]error {
	m := make(map[string]error, len(keys))
	for _, k := range keys {
		m[k] = err
	}
	return m
}
