package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
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
//   - cas, append_cas, prepend_cas, delete_cas: a CAS value is one
//     node's, and a read names the replica that gave it out
//     (op.Item.CASNode), so they go to that replica only; once stored
//     (or deleted) there, the others get the same write without the
//     check (set, append, prepend, delete) under the write policy. A CAS
//     value that names no replica up now fails the check. One that the
//     replica checked does not answer (it may apply it later) drops the
//     key from the others, which no copy reaches (dropCopies).
//   - gat: read like get, then touch on the other replicas in the
//     background.
//
// A replica "answers" when memcached replies, whatever the reply (stored,
// not stored, not found…); it fails when it cannot be reached or does not
// reply in time. A replica whose failure takes it out of service (a
// connection refused ejects it at once) is replaced by the next live
// node of the key's chain (a spare, whose copy gets FAILOVER_TTL): the
// key keeps its copies through a node's death. One that stays in service
// (it timed out, or passive ejection did not take it out) is not: its
// reads still come to it.
//
// A copy is sent to a node, its replica or a spare, only once the copies
// of the key's earlier writes still running there have been answered
// (order.go): a write answered before all its copies landed is not
// overtaken on a node by the next write of the key, which would leave
// that node with the older value.

// do runs one operation on a replicated pool.
func (v *view) do(ctx context.Context, o op.Op) op.Result {
	switch {
	case o.Verb == op.Get || o.Verb == op.Head:
		set := v.c.Replicas(&o, v.replicas)
		res, _ := v.get(ctx, o, &set)
		return res
	case o.Verb == op.GAT:
		return v.gat(ctx, o)
	case o.Verb.Unchecked() != o.Verb: // cas, append_cas, prepend_cas, delete_cas
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
// opposed to one of memcached's answers), or could not store what the
// others may have (ErrNoMemory: its own memory, not the value).
func failure(err error) bool {
	var ne *upstream.NodeError
	var be *upstream.BusyError
	return err != nil && (errors.As(err, &ne) || errors.As(err, &be) || errors.Is(err, upstream.ErrNoNodes) ||
		errors.Is(err, upstream.ErrServer) || errors.Is(err, upstream.ErrNoMemory) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, panicguard.ErrPanicked))
}

// replaceable reports whether a replica's failed write may go to a spare
// instead: the failure took it out of service (a connection refused
// ejects it at once), so its reads no longer come to it, and
// re-admission clears the key there. A replica that stays up, whether
// it timed out (its reply's or its dial's, and may hold the write or
// not) or refused or reset a connection without being ejected (passive
// ejection off, or held back by MAX_EJECTED_PERCENT), is where its reads
// still go: it is not replaced, and the write counts as failed there,
// as a copy on a spare would be answered and never read while the
// replica serves the older value, with no re-admission to clear it
// (decisions/0086).
func replaceable(err error, r upstream.Replica) bool {
	var ne *upstream.NodeError
	return errors.As(err, &ne) && !r.Up()
}

// maxSpares bounds the spares one replica's write moves on to.
const maxSpares = 2

// outcome is one replica's result in a fan-out.
type outcome struct {
	rank int // of the replica in the fan-out's targets (a spare keeps the rank of the replica it replaces)
	res  op.Result
	node string // where the copy went last: the replica, or the spare it moved to
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
	// Each copy waits for the key's earlier copies still running on the
	// node it goes to, a spare included (writeOrder); those of a write
	// that may be answered before they land are recorded for the writes
	// after it.
	cs := newWriteCopies(&v.order, o.Item.Key, set, targets, background)
	wctx, cancel := detach(ctx, v.timeout)
	results := make(chan outcome, len(targets))
	for i, r := range targets {
		go func() {
			// A copy that panicked is a failed one: it is counted, and
			// the write is answered.
			out := outcome{rank: i, res: op.Result{Err: panicguard.ErrPanicked}}
			defer func() { results <- out }()
			defer v.writePanics.Recover()
			out.res, out.node = v.writeOne(wctx, o, cs, i, r)
		}()
	}
	answered, got := 0, 0
	best, failed := outcome{rank: -1}, outcome{rank: -1} // the lowest-ranked answer and failure
	var failedOn []string
	for got < len(targets) && answered < need {
		out := <-results
		got++
		if failure(out.res.Err) {
			v.replicaFailed(o.Verb, out, false)
			failedOn = append(failedOn, out.node)
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
			defer v.writePanics.Recover()
			for range left {
				if out := <-results; failure(out.res.Err) {
					v.replicaFailed(o.Verb, out, true)
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
	return op.Result{Err: &upstream.PartlyAppliedError{
		Msg:      fmt.Sprintf("%s reached %d of %d replicas in pool %q, the %s policy needs %d", o.Verb, answered, len(targets), v.name, v.write, need),
		Answered: answered, Sent: len(targets), Failed: failedOn, Err: err,
	}}
}

// replicaFailed counts the copy of a write of verb that did not reach
// out.node, found before the write was answered or after (background),
// and logs it at warn: a line a second at most per pool, with the count
// held back before it, as a node that goes down fails every copy sent to
// it. That replica misses the value, or keeps an older one, until the
// key is written again.
func (v *view) replicaFailed(verb op.Verb, out outcome, background bool) {
	c, result := v.pm.writeFailed, "failed"
	if background {
		c, result = v.pm.bgFailed, "background_failed"
	}
	c.Inc()
	if v.log == nil {
		return
	}
	if unlogged, ok := v.failLog.Pass(); ok {
		v.log.LogAttrs(context.Background(), slog.LevelWarn, "a replica write failed: the replica misses the value, or keeps an older one, until the key is written again",
			slog.String("pool", v.name), slog.String("policy", string(v.write)), slog.String("verb", verb.String()), slog.String("node", out.node),
			slog.String("result", result), slog.String("err", out.res.Err.Error()), slog.Uint64("unlogged_before", unlogged))
	}
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

// writeOne runs o on r, the fan-out's i-th target, moving on to spares
// when a node cannot have applied it or went out of service for it, and
// returns the result and the node that gave it. On each node it goes to,
// the copy is first ordered behind the key's earlier copies there, and
// gives its place up once that node is done with it: answered, failed,
// or left for a spare (then nothing reached the node, or it is out of
// service, and flushed before it is back).
func (v *view) writeOne(ctx context.Context, o op.Op, cs *writeCopies, i int, r upstream.Replica) (op.Result, string) {
	defer cs.finish(ctx)
	place := i
	for moves := 0; ; moves++ {
		if !r.Home() {
			cs.set.CountFailover()
		}
		await(ctx, cs.before(place, r))
		res := v.c.DoOn(ctx, o, r)
		cs.leave(place, r)
		if moves == maxSpares || !replaceable(res.Err, r) || ctx.Err() != nil {
			return res, r.Node()
		}
		s, p, ok := cs.spare()
		if !ok {
			return res, r.Node()
		}
		v.pm.substituted.Inc()
		r, place = s, p
	}
}

// writeCopies are a fan-out's copies of one write: the spares they may
// move on to, and their places in the key's write order (writeOrder).
type writeCopies struct {
	order   *writeOrder
	key     string
	set     *upstream.ReplicaSet
	targets int             // the fan-out's, whose places come first in prev and done
	prev    []chan struct{} // enter's: what each place waits for, per target then per reserved spare
	done    []chan struct{} // enter's: each place, given up once its node is done; nil when the write records none
	left    atomic.Int64    // copies still running, for a write that records

	mu       sync.Mutex         // guards set's spares, next and taken while copies run
	reserved []upstream.Replica // for a write that records, the only spares its copies may move to, each with its place
	taken    []bool             // per reserved spare: a copy moved there, and gives its place up
	next     int                // reserved[next:] are still to be tried
}

// newWriteCopies finds where in the key's write order each copy of a
// write to targets goes. A write that records (record, see writeOrder)
// reserves a place on each spare its copies could move on to, at most
// maxSpares per target, with its places on the targets.
func newWriteCopies(order *writeOrder, key string, set *upstream.ReplicaSet, targets []upstream.Replica, record bool) *writeCopies {
	cs := &writeCopies{order: order, key: key, set: set, targets: len(targets)}
	if record {
		cs.reserved = make([]upstream.Replica, 0, len(targets)*maxSpares)
		for range cap(cs.reserved) {
			s, ok := set.Spare()
			if !ok {
				break
			}
			cs.reserved = append(cs.reserved, s)
		}
		cs.taken = make([]bool, len(cs.reserved))
		cs.left.Store(int64(len(targets)))
	}
	cs.prev, cs.done = order.enter(key, targets, cs.reserved, record)
	return cs
}

// spare returns the next spare for a copy to move on to, and its place
// (-1: none reserved): for a write that records, the next reserved spare
// that is up; otherwise the set's next.
func (cs *writeCopies) spare() (upstream.Replica, int, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.done == nil {
		s, ok := cs.set.Spare()
		return s, -1, ok
	}
	for cs.next < len(cs.reserved) {
		j := cs.next
		cs.next++
		if cs.reserved[j].Up() {
			cs.taken[j] = true
			return cs.reserved[j], cs.targets + j, true
		}
	}
	return upstream.Replica{}, -1, false
}

// before is what the copy to r at place waits for before it is sent: the
// key's places recorded on r before the write's (enter's prev), or, for
// a copy with no place (-1), those recorded now.
func (cs *writeCopies) before(place int, r upstream.Replica) chan struct{} {
	switch {
	case place < 0:
		return cs.order.latest(r.Node(), cs.key)
	case cs.prev == nil:
		return nil
	}
	return cs.prev[place]
}

// leave gives up the copy's place on r, whose node is done with it.
func (cs *writeCopies) leave(place int, r upstream.Replica) {
	if cs.done != nil {
		cs.order.answered(r.Node(), cs.key, cs.done[place])
	}
}

// finish is called by each copy once it is done. The last of a write
// that records gives up the places reserved on spares that no copy took,
// each once the place before it is given up (answered).
func (cs *writeCopies) finish(ctx context.Context) {
	if cs.done == nil || cs.left.Add(-1) != 0 {
		return
	}
	for j, r := range cs.reserved { // every copy is done (left): taken is final
		if cs.taken[j] {
			continue
		}
		p := cs.targets + j
		if cs.prev != nil {
			await(ctx, cs.prev[p])
		}
		cs.order.answered(r.Node(), cs.key, cs.done[p])
	}
}

// cas stores o, a write checked against a CAS value (cas, append_cas,
// prepend_cas, delete_cas), on the replica that gave the CAS value out
// (op.Item.CASNode), and then sends it unchecked (a set of the stored
// value, an append or prepend of its bytes, a delete) to the other
// replicas under the write policy (the replica checked counts toward
// it). Each node counts CAS values of its own, so a value is checked only
// where it was read: one naming no replica of the key up now (removed,
// down, a spare since, or none named) fails the check
// (upstream.ErrCASNode), as the version read cannot be found. A
// delete_cas with no CAS (If-Match: *) checks the first replica. A check
// left unanswered (unsettled) drops the key from the other replicas
// (dropCopies) and answers its failure as partly applied: the replica
// checked may apply it yet.
func (v *view) cas(ctx context.Context, o op.Op) op.Result {
	set := v.c.Replicas(&o, v.replicas)
	need, err := v.need(len(set.Replicas))
	if err != nil {
		return op.Result{Err: err}
	}
	k := 0
	if o.Item.CAS != 0 {
		if k = checkedOn(set.Replicas, o.Item.CASNode); k < 0 {
			return op.Result{Err: upstream.ErrCASNode}
		}
	}
	if err := admit(o, set.Replicas); err != nil {
		return op.Result{Err: err}
	}
	o.Admitted = true
	checked := set.Replicas[k]
	if prev, _ := v.order.enter(o.Item.Key, set.Replicas[k:k+1], nil, false); prev != nil {
		await(ctx, prev[0]) // the check is against the caller's earlier write, whose copy may still be on its way
	}
	res := v.c.DoOn(ctx, o, checked)
	others := make([]upstream.Replica, 0, len(set.Replicas)-1)
	others = append(append(others, set.Replicas[:k]...), set.Replicas[k+1:]...)
	if failure(res.Err) {
		v.replicaFailed(o.Verb, outcome{res: res, node: checked.Node()}, false)
		if unsettled(res.Err) {
			done := "the key's other copies are deleted"
			if o.CopiesIfSame {
				// Under a deadline of its own, as dropCopies': the
				// caller's may be what ran out.
				bctx, cancel := background(4 * v.timeout)
				v.copiesIfSame(bctx, o, others)
				cancel()
				done = "the other replicas got it where the item read is there still"
			} else {
				v.dropCopies(o, &set, others)
			}
			return op.Result{Err: &upstream.PartlyAppliedError{
				Msg:  fmt.Sprintf("%s sent to %s, the replica checked, and not answered: it may apply it yet, and %s", o.Verb, checked.Node(), done),
				Sent: 1, Failed: []string{checked.Node()}, Err: res.Err,
			}}
		}
	} else {
		v.pm.writeAnswered.Inc()
	}
	if res.Err != nil {
		return res
	}
	if o.CopiesIfSame {
		v.copiesIfSame(ctx, o, others)
		return res
	}
	s := o
	s.Verb, s.Item.CAS, s.Item.CASNode = o.Verb.Unchecked(), 0, 0
	// A copy's answer is memcached's and not the write's: a replica
	// without the key (evicted, or flushed on its return) answers an
	// unchecked delete, append or prepend with a miss, and the write,
	// done where it was checked, stands. Only copies that did not reach
	// the replicas the policy needs fail it.
	if rest := v.fanout(ctx, s, &set, others, need-1); failure(rest.Err) {
		pe := &upstream.PartlyAppliedError{
			Msg:      fmt.Sprintf("%s stored on %s, the replica checked, but not copied as the policy needs", o.Verb, checked.Node()),
			Answered: 1, Sent: 1, Err: rest.Err,
		}
		var copied *upstream.PartlyAppliedError
		if errors.As(rest.Err, &copied) {
			pe.Answered, pe.Sent, pe.Failed = 1+copied.Answered, 1+copied.Sent, copied.Failed
		}
		return op.Result{Err: pe}
	}
	return res
}

// unsettled reports whether err, a checked write's failure on the
// replica checked, leaves the write's outcome there unknown: it was sent
// (or may have been) and not answered, so the node may apply it later.
// A connection never made, a refusal before sending (busy, no node) and
// memcached's own error answer leave it settled: not applied.
func unsettled(err error) bool {
	var ne *upstream.NodeError
	if errors.As(err, &ne) {
		return !ne.Dial()
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, panicguard.ErrPanicked)
}

// dropCopies deletes o's key from others, the replicas of set other than
// the one o, a checked write, went to and got no answer from (unsettled).
// That replica may apply o once it answers again, and o's copies never
// go to the others: they would go on serving the version o replaced or
// deleted, beside it, until the key is written again. A miss is an answer
// a cache may always give; an older value beside a newer one is not. The
// deletes run in the background if its budget takes them (else o's
// answer waits for them, as fanout does), each behind the key's earlier
// copies on its node, and they count toward nothing: o is answered with
// its own failure.
func (v *view) dropCopies(o op.Op, set *upstream.ReplicaSet, others []upstream.Replica) {
	if len(others) == 0 {
		return
	}
	d := op.Op{Verb: op.Delete, Item: op.Item{Key: o.Item.Key}, HashKey: o.HashKey, Admitted: true}
	ctx, cancel := background(4 * v.timeout)
	defer cancel() // the copies run under a deadline of their own (fanout, detach)
	v.fanout(ctx, d, set, others, 0)
}

// copiesIfSame writes o, a CAS marked op.Op.CopiesIfSame whose check on
// its replica passed (or went unanswered), on each of others where the
// copy there is still the item o read: the same flags and value bytes,
// read there (a head first, so that a large value of another version
// is not read), and written checked against the CAS read there. A copy
// that is another version, gone, or not read in time is left as it is:
// o writes back an item to let it go, and a newer version a write put
// on one replica after o's item was read must not go with it. The
// copies count toward nothing: o is answered with its replica's result.
func (v *view) copiesIfSame(ctx context.Context, o op.Op, others []upstream.Replica) {
	for _, r := range others {
		read := op.Op{Verb: op.Head, Item: op.Item{Key: o.Item.Key}, HashKey: o.HashKey, Admitted: true}
		got := v.c.DoOn(ctx, read, r)
		if got.Err != nil || got.Item.Flags != o.Item.Flags || got.N != uint64(len(o.Item.Value)) {
			continue
		}
		read.Verb = op.Get
		if got = v.c.DoOn(ctx, read, r); got.Err != nil || got.Item.Flags != o.Item.Flags || !bytes.Equal(got.Item.Value, o.Item.Value) {
			continue
		}
		w := o
		w.Item.CAS, w.Item.CASNode, w.Admitted, w.CopiesIfSame = got.Item.CAS, r.Tag(), true, false
		v.c.DoOn(ctx, w, r)
	}
}

// checkedOn is the index of the replica tagged node (upstream.NodeTag)
// among reps, or -1 if none is, or if two are (tags of 32 bits may
// collide, and a check on the wrong node is the error it exists to
// prevent).
func checkedOn(reps []upstream.Replica, node uint32) int {
	k := -1
	for i, r := range reps {
		if node != 0 && r.Tag() == node {
			if k >= 0 {
				return -1
			}
			k = i
		}
	}
	return k
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
