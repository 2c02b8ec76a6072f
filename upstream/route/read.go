package route

import (
	"context"
	"errors"
	"time"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// Replicated reads. A read asks the key's replicas in read order (its
// chain order): the first, then the next after a failure, or after a miss
// with MissFallback. Under ReadHedged the second is also asked when the
// first has not answered within the pool's hedge delay, and the first
// answer wins; a hedge is never sent to a node whose slots are all taken,
// nor beyond the pool's hedge budget, and there is at most one per read.
// A read that fell back and still found nothing answers a miss if any
// replica answered one, else the last failure.

// get reads o (get, head or gat) from the set's replicas and returns the result
// and the rank of the replica that gave it (-1 if none did). An item found
// names that replica as the node that gave out its CAS (op.Item.CASNode):
// each replica counts CAS values of its own, and a write checked against
// this one is checked there (cas).
func (v *view) get(ctx context.Context, o op.Op, set *upstream.ReplicaSet) (op.Result, int) {
	reps := set.Replicas
	if len(reps) == 0 {
		_, err := v.need(0)
		return op.Result{Err: err}, -1
	}
	if v.read != ReadHedged || o.Verb != op.Get && o.Verb != op.Head || len(reps) == 1 {
		return v.getSequential(ctx, o, reps)
	}
	return v.getHedged(ctx, o, reps)
}

// getHedged is get under ReadHedged. Each request runs on a goroutine of
// its own, which records the node's latency for the hedge delay; a
// request that loses still finishes (memcached cannot take it back) and
// its answer is dropped.
func (v *view) getHedged(ctx context.Context, o op.Op, reps []upstream.Replica) (op.Result, int) {
	v.hedge.earn()
	results := make(chan outcome, len(reps)) // never blocks a request that lost
	ask := func(rank int) {
		go func() {
			// A read that panicked is a failed one: the next replica
			// may answer.
			out := outcome{rank: rank, res: op.Result{Err: panicguard.ErrPanicked}}
			defer func() { results <- out }()
			defer v.readPanics.Recover()
			start := time.Now()
			res := v.c.DoOn(ctx, o, reps[rank])
			// Neither a cancelled request nor one refused for the
			// byte budget (perhaps unsent) says how fast the node is.
			if !errors.Is(res.Err, context.Canceled) && !errors.Is(res.Err, upstream.ErrNoFit) {
				v.lat.observe(reps[rank].Node(), time.Since(start))
			}
			out.res = res
		}()
	}
	t := time.NewTimer(time.Duration(v.delay.Load()))
	defer t.Stop()
	timer := t.C
	ask(0)
	next, pending, hedged := 1, 1, false
	missed := false
	var last error
	for {
		select {
		case out := <-results:
			pending--
			switch err := out.res.Err; {
			case err == nil:
				if hedged && out.rank == 1 {
					v.pm.hedgesWon.Inc()
				}
				out.res.Item.CASNode = reps[out.rank].Tag()
				return out.res, out.rank
			case errors.Is(err, upstream.ErrNotFound):
				if !v.miss {
					return out.res, out.rank
				}
				missed = true
			case failure(err):
				last = err
			default:
				return out.res, out.rank
			}
			if pending > 0 {
				continue // the other request may still answer
			}
			if next >= len(reps) || ctx.Err() != nil {
				return v.notFound(missed, last), -1
			}
			v.fallback(out.res.Err)
			ask(next)
			next++
			pending++
		case <-timer:
			timer = nil
			if next != 1 || pending != 1 {
				continue // the first already answered and the read moved on
			}
			switch {
			case reps[1].Busy():
				v.pm.hedgesBusy.Inc()
			case !v.hedge.spend():
				v.pm.hedgesBudget.Inc()
			default:
				v.pm.hedgesSent.Inc()
				hedged = true
				ask(1)
				next++
				pending++
			}
		}
	}
}

// getSequential is get under ReadFirst: one replica at a time, on the
// caller's goroutine.
func (v *view) getSequential(ctx context.Context, o op.Op, reps []upstream.Replica) (op.Result, int) {
	missed := false
	var last error
	for i, r := range reps {
		res := v.c.DoOn(ctx, o, r)
		switch err := res.Err; {
		case err == nil:
			res.Item.CASNode = r.Tag()
			return res, i
		case errors.Is(err, upstream.ErrNotFound):
			if !v.miss {
				return res, i
			}
			missed = true
		case failure(err):
			last = err
		default:
			return res, i
		}
		if i+1 == len(reps) || ctx.Err() != nil {
			break
		}
		v.fallback(res.Err)
	}
	return v.notFound(missed, last), -1
}

// fallback counts a read moving on to the next replica after err.
func (v *view) fallback(err error) {
	if errors.Is(err, upstream.ErrNotFound) {
		v.pm.fallbackMiss.Inc()
	} else {
		v.pm.fallbackError.Inc()
	}
}

// notFound is the answer of a read every asked replica failed or missed:
// a miss if one answered so, else the last failure.
func (v *view) notFound(missed bool, last error) op.Result {
	if missed || last == nil {
		return op.Result{Err: upstream.ErrNotFound}
	}
	return op.Result{Err: last}
}
