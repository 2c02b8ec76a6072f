package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// Replicated operations. Every verb's rule, in one place (docs/pools.md
// says the same for people):
//
//   - get, head: the read policy (read.go).
//   - set, add, replace, append, prepend, touch, head_touch, delete, incr,
//     decr: sent to every replica at once, answered under the write policy. The
//     answer is that of the first replica in read order among those that
//     answered when the policy was met, so that it agrees with what the
//     next read sees; with MissFallback, where reads pass over a replica
//     that lacks the key, a replica's not-found loses to another's
//     success for the same reason (a flushed, re-admitted replica does
//     not make incr, touch or delete of a key the next one holds answer
//     404). incr and decr go to every replica too: increments commute, so
//     replicas that got the same ones agree whatever their order; a
//     replica without the counter (it was away) stays without it, as
//     memcached's incr never creates one.
//   - cas, append_cas, prepend_cas: a CAS value is one node's, so they
//     go to the first replica only; once stored there, the others get
//     the same write without the check (set, append, prepend) under the
//     write policy. A CAS value read from another replica (after a
//     fallback or a hedge) conflicts there, and the client reads again.
//   - gat: read like get, then touch on the other replicas in the
//     background.
//
// A replica "answers" when memcached replies, whatever the reply (stored,
// not stored, not found…); it fails when it cannot be reached or does not
// reply in time. A replica whose write fails without reaching it (the
// connection was never made), or whose failure takes it out of service,
// is replaced by the next live node of the key's chain (a spare, whose
// copy gets FAILOVER_TTL): the key keeps its copies through a node's death.
//
// A copy is sent to its replica only once the copies of the key's
// earlier writes still running there have been answered (order.go): a
// write answered before all its copies landed is not overtaken on a
// replica by the next write of the key, which would leave that replica
// with the older value.

// do runs one operation on a replicated pool.
func (v *view) do(ctx context.Context, o op.Op) op.Result {
	switch {
	case o.Verb == op.Get || o.Verb == op.Head:
		set := v.c.Replicas(&o, v.replicas)
		res, _ := v.get(ctx, o, &set)
		return res
	case o.Verb == op.GAT:
		return v.gat(ctx, o)
	case o.Verb.Unchecked() != o.Verb: // cas, append_cas, prepend_cas
		return v.cas(ctx, o)
	case o.Verb.Writes():
		set := v.c.Replicas(&o, v.replicas)
		need, err := v.need(len(set.Replicas))
		if err != nil {
			return op.Result{Err: err}
		}
		if err := admit(o, set.Replicas); err != nil {
			return op.Result{Err: err}
		}
		return v.fanout(ctx, o, &set, set.Replicas, need)
	}
	return v.c.Do(ctx, o) // an invalid verb: the cluster says so
}

// admit checks every replica against its node's share of request slots
// before any copy of o is sent (upstream.Replica.Admit): refused then, the
// write is refused whole, and no replica is left older than the others.
// An o admitted already (op.Op.Admitted: a chunk of a value whose first
// operation was) is not checked again.
func admit(o op.Op, rs []upstream.Replica) error {
	if o.Admitted || o.Queued {
		return nil
	}
	for _, r := range rs {
		if err := r.Admit(o.Verb); err != nil {
			return err
		}
	}
	return nil
}

// need returns how many of a write's replicas must answer before it is
// answered, when up replicas are up; an error if the policy cannot be met.
func (v *view) need(up int) (int, error) {
	if up == 0 {
		return 0, fmt.Errorf("%w: no replica of the key is up in pool %q", upstream.ErrNoNodes, v.name)
	}
	switch v.write {
	case WriteMajority:
		if m := v.replicas/2 + 1; up < m {
			return 0, fmt.Errorf("%w: %d of the key's %d replicas are up in pool %q; the majority policy needs %d",
				upstream.ErrNoNodes, up, v.replicas, v.name, m)
		} else {
			return m, nil
		}
	case WriteFirst:
		return 1, nil
	}
	return up, nil
}

// failure reports whether err means a replica was not reached (as
// opposed to one of memcached's answers).
func failure(err error) bool {
	var ne *upstream.NodeError
	var be *upstream.BusyError
	return err != nil && (errors.As(err, &ne) || errors.As(err, &be) || errors.Is(err, upstream.ErrNoNodes) ||
		errors.Is(err, upstream.ErrServer) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// replaceable reports whether a replica's failed write may go to a spare
// instead: nothing reached the node, or the failure took it out of
// service (then re-admission flushes it). A replica that timed out and
// stays up may hold the write or not: it is not replaced, and the write
// counts as failed there.
func replaceable(err error, r upstream.Replica) bool {
	var ne *upstream.NodeError
	return errors.As(err, &ne) && (ne.Dial() || !r.Up())
}

// maxSpares bounds the spares one replica's write moves on to.
const maxSpares = 2

// outcome is one replica's result in a fan-out.
type outcome struct {
	rank int // of the replica in the fan-out's targets (a spare keeps the rank of the replica it replaces)
	res  op.Result
}

// fanout sends o to every target at once and answers once need of them
// have answered, or as soon as that can no longer happen. The answer is
// the answer of the lowest-ranked target among those that answered. The
// targets still running when it answers finish in the background if the
// background budget takes o (else fanout waits for them all: the budget
// is what bounds work past the answers, and o's value, which the caller
// reuses, is copied only then). need <= 0 answers at once (all in the
// background).
func (v *view) fanout(ctx context.Context, o op.Op, set *upstream.ReplicaSet, targets []upstream.Replica, need int) op.Result {
	if len(targets) == 0 {
		return op.Result{}
	}
	held := int64(len(o.Item.Value))
	background := need < len(targets) && v.bgAcquire(held)
	if background {
		o.Item.Value = bytes.Clone(o.Item.Value)
		o = ownKeys(o)
	}
	// Every replica was admitted (admit): a copy waits for its slot
	// rather than be refused, which would leave its replica older than
	// those that took the write, and reads it serves would go back in
	// time.
	o.Admitted = true
	if !background {
		need = len(targets)
	}
	// Each copy waits for the key's earlier copies still running on its
	// node (writeOrder); those of a write that may be answered before
	// they land are recorded for the writes after it.
	prev, done := v.order.enter(o.Item.Key, targets, background)
	wctx, cancel := detach(ctx, v.timeout)
	results := make(chan outcome, len(targets))
	var spares sync.Mutex // guards set's spares
	for i, r := range targets {
		go func() {
			if prev != nil {
				await(wctx, prev[i])
			}
			res := v.writeOne(wctx, o, set, &spares, r)
			if done != nil {
				v.order.answered(r.Node(), o.Item.Key, done[i])
			}
			results <- outcome{i, res}
		}()
	}
	answered, got := 0, 0
	best, failed := outcome{rank: -1}, outcome{rank: -1} // the lowest-ranked answer and failure
	for got < len(targets) && answered < need {
		out := <-results
		got++
		if failure(out.res.Err) {
			v.pm.writeFailed.Inc()
			if failed.rank < 0 || out.rank < failed.rank {
				failed = out
			}
			if background && answered+len(targets)-got < need {
				break // cannot be met: answer now, the rest finish in the background
			}
			continue
		}
		v.pm.writeAnswered.Inc()
		answered++
		if best.rank < 0 || v.answersBefore(out, best) {
			best = out
		}
	}
	if left := len(targets) - got; left > 0 {
		go func() {
			defer cancel()
			defer v.bgRelease(held)
			for range left {
				if out := <-results; failure(out.res.Err) {
					v.pm.bgFailed.Inc()
				} else {
					v.pm.bgAnswered.Inc()
				}
			}
		}()
	} else {
		cancel()
		if background {
			v.bgRelease(held)
		}
	}
	switch {
	case need <= 0:
		return op.Result{}
	case answered >= need:
		return best.res
	}
	err := failed.res.Err
	if err == nil {
		err = upstream.ErrNoNodes
	}
	return op.Result{Err: fmt.Errorf("%s reached %d of %d replicas in pool %q, the %s policy needs %d: %w",
		o.Verb, answered, len(targets), v.name, v.write, need, err)}
}

// answersBefore reports whether replica answer a is the one to give
// rather than b: the lower rank, but with MissFallback a success before
// a not-found, since a read would pass the replica that lacks the key.
func (v *view) answersBefore(a, b outcome) bool {
	if v.miss {
		aMiss, bMiss := errors.Is(a.res.Err, upstream.ErrNotFound), errors.Is(b.res.Err, upstream.ErrNotFound)
		if aMiss != bMiss {
			return bMiss
		}
	}
	return a.rank < b.rank
}

// writeOne runs o on one replica, moving on to spares when the replica
// cannot have applied it or went out of service for it.
func (v *view) writeOne(ctx context.Context, o op.Op, set *upstream.ReplicaSet, spares *sync.Mutex, r upstream.Replica) op.Result {
	if !r.Home() {
		set.CountFailover()
	}
	res := v.c.DoOn(ctx, o, r)
	for range maxSpares {
		if !replaceable(res.Err, r) || ctx.Err() != nil {
			break
		}
		spares.Lock()
		s, ok := set.Spare()
		spares.Unlock()
		if !ok {
			break
		}
		v.pm.substituted.Inc()
		r = s
		if !r.Home() {
			set.CountFailover()
		}
		res = v.c.DoOn(ctx, o, r)
	}
	return res
}

// cas stores o, a write checked against a CAS value (cas, append_cas,
// prepend_cas), on the key's first replica, which issued the CAS value
// the caller holds, and then sends it unchecked (a set of the stored
// value, an append or prepend of its bytes) to the other replicas under
// the write policy (the first replica counts toward it).
func (v *view) cas(ctx context.Context, o op.Op) op.Result {
	set := v.c.Replicas(&o, v.replicas)
	need, err := v.need(len(set.Replicas))
	if err != nil {
		return op.Result{Err: err}
	}
	if err := admit(o, set.Replicas); err != nil {
		return op.Result{Err: err}
	}
	o.Admitted = true
	if prev, _ := v.order.enter(o.Item.Key, set.Replicas[:1], false); prev != nil {
		await(ctx, prev[0]) // the check is against the caller's earlier write, whose copy may still be on its way
	}
	res := v.c.DoOn(ctx, o, set.Replicas[0])
	if failure(res.Err) {
		v.pm.writeFailed.Inc()
	} else {
		v.pm.writeAnswered.Inc()
	}
	if res.Err != nil {
		return res
	}
	s := o
	s.Verb, s.Item.CAS = o.Verb.Unchecked(), 0
	if rest := v.fanout(ctx, s, &set, set.Replicas[1:], need-1); rest.Err != nil {
		return op.Result{Err: fmt.Errorf("%s stored on %s, the first replica, but not copied as the policy needs: %w",
			o.Verb, set.Replicas[0].Node(), rest.Err)}
	}
	return res
}

// gat reads o's key as get does, touching the replica that answers, and
// touches the other replicas in the background, so that the copies a
// later read may fall back to live as long.
func (v *view) gat(ctx context.Context, o op.Op) op.Result {
	set := v.c.Replicas(&o, v.replicas)
	res, rank := v.get(ctx, o, &set)
	if res.Err != nil || len(set.Replicas) < 2 {
		return res
	}
	others := make([]upstream.Replica, 0, len(set.Replicas)-1)
	for i, r := range set.Replicas {
		if i != rank {
			others = append(others, r)
		}
	}
	if admit(o, others) != nil {
		return res // the touches are a courtesy: a replica at its share keeps its expiration
	}
	t := op.Op{Verb: op.Touch, Item: op.Item{Key: o.Item.Key, Expiration: o.Item.Expiration}, HashKey: o.HashKey}
	v.fanout(ctx, t, &set, others, 0)
	return res
}

// detach is ctx without its cancellation but with its deadline (or
// 4×timeout from now if it has none): a write's replicas finish what was
// started even if the client leaves, so that the copies agree.
func detach(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(4 * timeout)
	}
	return context.WithDeadline(context.Background(), dl) // none of ctx's values: see background
}

// bgAcquire reserves room for one write of size value bytes in the
// background budget, counting a refusal.
func (v *view) bgAcquire(size int64) bool {
	if v.bg.acquire(size) {
		return true
	}
	v.pm.bgRefused.Inc()
	return false
}

func (v *view) bgRelease(size int64) { v.bg.release(size) }
