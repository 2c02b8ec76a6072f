package upstream

import (
	"context"
	"fmt"

	"github.com/memcgate/memcgate/upstream/op"
)

// Replication support. A caller that keeps copies of a key on several
// nodes (package route) asks the cluster for the key's replica set and
// runs operations on the replicas it chooses; where a key lives, whether
// a node is up, how an operation is counted and fed to passive health
// checking, and how a write off the key's home nodes has its TTL capped
// stay the cluster's business. With copies = 1 the set is the node Do
// would use first.

// Replica is one node of a key's replica set (Cluster.Replicas).
type Replica struct {
	n *node
	// home: the node is one of the key's first copies-many chain nodes,
	// where its copies live while every node is up. A write elsewhere (a
	// stand-in for a home node that is down) has its expiration capped
	// by FailoverTTL, so the copy ages out once the home node is back.
	home bool
}

// Node is the replica's node, host:port as configured.
func (r Replica) Node() string { return r.n.name }

// Tag is the node's tag (NodeTag), with which a read's op.Item.CASNode
// names the replica that gave out its CAS.
func (r Replica) Tag() uint32 { return r.n.tag }

// NodeTag is the tag of the node named name (host:port as configured):
// FNV-1a of the name, 32 bits, never 0. A read of a replicated pool
// names with it, in op.Item.CASNode, the node whose CAS value it read,
// since another node's CAS values count apart; a name, unlike a place in
// the key's chain, names the same node across health changes and
// reloads, and a node removed is named by no replica.
func NodeTag(name string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	if h == 0 {
		return 1
	}
	return h
}

// Home reports whether the node is one of the key's home nodes.
func (r Replica) Home() bool { return r.home }

// Up reports whether the node takes traffic now.
func (r Replica) Up() bool { return r.n.available() }

// Busy reports whether every slot of the node's in-flight cap, or of its
// share of request slots, is taken now, so that an operation sent there
// would wait or be refused. It is a snapshot: a caller deciding whether
// an optional request is worth sending (a hedged read) uses it; nothing
// is reserved.
func (r Replica) Busy() bool { return r.n.full() }

// Admit reports, as a *BusyError, whether one more operation would pass
// the node's share of request slots now (busy.go); nothing is reserved.
// A replicated write admits every replica before it sends any copy, then
// sends them op.Op.Admitted, which wait rather than be refused: a write
// reaches all its replicas or none.
// v is the write's verb, under which a refusal is counted
// (memcgate_upstream_ops_total{result="busy"}).
func (r Replica) Admit(v op.Verb) error {
	err := r.n.checkShare()
	if err != nil {
		r.n.m.ops[verbOp(v)][resBusy].Inc()
	}
	return err
}

// ReplicaSet is a key's replicas at one moment, and the nodes that may
// stand in for one that fails.
type ReplicaSet struct {
	// Replicas are the nodes that hold the key's copies now, in the
	// key's chain order: reads try them in this order. Fewer than the
	// copies asked for when fewer nodes are up; none when no node is.
	Replicas []Replica
	spares   []Replica // live nodes after the replicas in chain order
	owner    *node     // the key's first chain node, whose failovers are counted
}

// Spare returns the next node of the key's chain after the replicas and
// the spares already taken that is up, to stand in for a replica whose
// write failed; false when there is none. A spare is never a home node
// except when a home node was down when the set was made and is up now.
// A ReplicaSet is not safe for concurrent use.
func (s *ReplicaSet) Spare() (Replica, bool) {
	for len(s.spares) > 0 {
		r := s.spares[0]
		s.spares = s.spares[1:]
		if r.n.available() {
			return r, true
		}
	}
	return Replica{}, false
}

// Replicas returns the replica set of o's key for copies copies: the first
// copies nodes of the key's chain (its ring order, which starts with the
// node Do would use) that are up. Under the FailFast policy only the
// key's home nodes that are up are replicas and there are no spares: the
// ring stays as it is. In panic mode health is ignored, as Do ignores it
// (but for the keys a down node recorded: node.passedOver).
// With copies <= 1 it is the node Do would try first. For a write,
// each node down that would have been a replica remembers the key, to
// delete it before its re-admission.
func (c *Cluster) Replicas(o *op.Op, copies int) ReplicaSet {
	copies = max(copies, 1)
	sk, hk := c.keysOf(o)
	write := o.Verb.Writes()
	t := c.topo.Load()
	ignoreHealth := c.panicking(t)
	failFast := c.opts.Failover == FailFast
	var s ReplicaSet
	pos := 0
	for i := range t.ring.Owners(hk) {
		n := t.nodes[i]
		home := pos < copies
		pos++
		if s.owner == nil {
			s.owner = n
		}
		if failFast && !home {
			break
		}
		// A write records its key on each node down that would have
		// been a replica (stale.go); one re-admitted since is taken.
		if n.passedOver(ignoreHealth, sk) && (!write || len(s.Replicas) >= copies || n.skipForWrite(sk, c.placedBy(sk, hk))) {
			continue
		}
		r := Replica{n: n, home: home}
		if len(s.Replicas) < copies {
			s.Replicas = append(s.Replicas, r)
		} else {
			s.spares = append(s.spares, r)
		}
	}
	return s
}

// DoOn runs o on one replica of its key, with no failover: the result's
// error is what Do's would be had the node been the only one tried. A
// write to a node that is not one of the key's home nodes has its
// expiration capped by FailoverTTL. It is counted, timed and fed to
// passive health checking as Do's operations are. As with Do, a read's
// item may share its Value with other reads batched with it.
func (c *Cluster) DoOn(ctx context.Context, o op.Op, r Replica) op.Result {
	if !o.Verb.Valid() {
		return op.Result{Err: fmt.Errorf("upstream: no such verb %d", o.Verb)}
	}
	if err := ctx.Err(); err != nil {
		return op.Result{Err: err}
	}
	sk, _ := c.keysOf(&o)
	res, err := r.n.run(ctx, o, sk, !r.home, c.capTTL)
	res.Err = err
	return res
}

// CountFailover counts, on the key's first chain node, one operation
// served by a node that is not one of the key's home nodes (the
// memcgate_upstream_failovers_total Do keeps for its failovers).
func (s *ReplicaSet) CountFailover() {
	if s.owner != nil {
		s.owner.m.failovers.Inc()
	}
}
