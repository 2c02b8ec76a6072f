package upstream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/memcgate/memcgate/upstream/op"
)

// A node's share of the caller's requests. A node that answers slowly but
// within Timeout is never ejected, and rightly: it answers. But the
// operations for its keys pile up in its slots and in the wait for one,
// and each holds one of the caller's request slots (the gateway's
// MEMCGATE_MAX_REQUESTS) all the while; at a few hundred milliseconds a
// reply, they come to hold every slot, and the requests for the healthy
// nodes get 503s too. So while the cluster has more than one node up, a
// node's operations, in flight and waiting for a slot together, may hold
// at most half of Options.RequestSlots; and, once the caller counts its
// requests for us (CountRequests), no more than its fair part (the slots
// over the nodes) unless more slots are free than it holds (and no
// longer half): two slow nodes then hold a third each, not all of it
// between them. Past that an
// operation fails at once with a *BusyError, which says nothing against
// the node's health (its replies came in time) and does not move to
// another node (the key's owner is up: its keys stay where every client
// places them).

// BusyError is an operation refused unsent because its node already
// holds its share of the caller's requests: Share operations in flight
// or waiting for a slot.
type BusyError struct {
	Node  string // host:port as configured
	Share int64
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("upstream: %s holds its share of requests (%d in flight or waiting)", e.Node, e.Share)
}

// requestShare is the cluster-wide part of the share, read by every node.
// It holds atomics and a mutex: it must not be copied.
type requestShare struct {
	mu     sync.Mutex                   // serializes changes, which read each other's fields
	slots  atomic.Int64                 // Options.RequestSlots, as SetRequestSlots changes it
	share  atomic.Int64                 // each node's share of them; 0: no bound
	fair   atomic.Int64                 // each node's fair part of them: slots over nodes and others
	count  atomic.Pointer[func() int64] // the caller's requests in flight (CountRequests); nil: unknown
	nodes  atomic.Int64                 // in the topology
	others atomic.Int64                 // nodes of other clusters drawing on the same slots (SetRequestSlots)
	down   *atomic.Int32                // healthPolicy.down: nodes down now
	bytes  atomic.Pointer[ByteBudget]   // the caller's byte budget (ShareBytes), of which each node's reads hold a share (readshare.go); nil: none
}

// set recomputes the share for slots over nodes and others: all of them
// for a single node (there is no other node to keep slots for), half
// otherwise. s.mu is held.
func (s *requestShare) set(slots int64, nodes, others int) {
	s.slots.Store(slots)
	s.nodes.Store(int64(nodes))
	s.others.Store(int64(others))
	s.fair.Store(max(slots/int64(max(nodes+others, 1)), 1))
	switch {
	case slots <= 0:
		s.share.Store(0)
	case nodes+others <= 1:
		s.share.Store(slots)
	default:
		s.share.Store((slots + 1) / 2)
	}
}

// setNodes recomputes the share for a topology of nodes.
func (s *requestShare) setNodes(nodes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set(s.slots.Load(), nodes, int(s.others.Load()))
}

// over reports whether a node holding after operations (in flight and
// waiting, the caller's counted) would pass its share, and the most it
// may hold now. All the slots while no other node is up to keep any for
// (other clusters' nodes count as up); else its fair part, and past it
// only while more slots are free than it would hold (with the caller's
// count), or at most half (without).
//
// Free slots, not half, once counted: the share counts operations and
// the slots count requests, and one request may have many operations on
// a node (a batch of 1,000 gets is about four multi-gets a node): many
// clients sending such batches to healthy nodes hold more operations on
// a node than there are requests in flight, and half refused them
// (decisions/0021). Every request stuck on a node holds an
// operation there, so a node holding no more than are free still leaves
// the others at least half of the slots.
func (s *requestShare) over(after int64) (bool, int64) {
	sh := s.share.Load()
	if sh == 0 || after <= s.fair.Load() {
		return false, sh // 0: no bound; within its fair part: the common case, two loads
	}
	if s.others.Load() == 0 && s.nodes.Load()-int64(s.down.Load()) <= 1 {
		slots := s.slots.Load()
		return after > slots, slots
	}
	if f := s.count.Load(); f != nil {
		// The caller's own request is among those in flight and not yet
		// among after's: free+1 is what it may hold with it.
		free := s.slots.Load() - (*f)()
		return after > free+1, max(free+1, s.fair.Load())
	}
	return after > sh, sh
}

// SetRequestSlots changes Options.RequestSlots, and so each node's share,
// for the operations that start from now. others is how many nodes of
// other clusters draw on the same slots (the other pools of a router):
// with any, a node of this cluster takes at most half of them even when
// it is the only one here.
func (c *Cluster) SetRequestSlots(slots, others int) {
	c.share.mu.Lock()
	defer c.share.mu.Unlock()
	c.share.set(int64(slots), int(c.share.nodes.Load()), others)
}

// CountRequests gives the cluster the caller's count of its requests in
// flight against RequestSlots (the gateway's), nil for none: a node may
// then hold more than its fair part of the slots only while more of them
// are free than it holds. f is called on the path that takes a slot,
// only when the node holds more than its fair part; it must be cheap.
func (c *Cluster) CountRequests(f func() int64) {
	if f == nil {
		c.share.count.Store(nil)
		return
	}
	c.share.count.Store(&f)
}

// held is how many of the node's slots count against its share: those
// of queued operations (op.Op.Queued), which hold no request slot of the
// caller, do not.
func (n *node) held() int64 { return int64(len(n.sem)) - n.queued.Load() }

// take takes a slot of the node's in-flight cap if one is free now and
// the node holds less than its share; it never waits.
func (n *node) take() bool {
	if over, _ := n.share.over(n.held() + 1); over {
		return false
	}
	select {
	case n.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

// wait takes a slot, waiting for one within ctx as one of the node's
// waiters (join). name names the operation in the errors.
func (n *node) wait(ctx context.Context, name string) error {
	if err := n.join(); err != nil {
		return err
	}
	defer n.leave()
	return n.waitSlot(ctx, name)
}

// admission is how an operation meets its node's share.
type admission uint8

const (
	asked    admission = iota // refused at once past the share (*BusyError)
	admitted                  // admitted already (op.Op.Admitted): counted, waits for a slot
	queued                    // holds no request slot (op.Op.Queued): waits, not counted
)

// admissionOf is o's admission.
func admissionOf(o op.Op) admission {
	switch {
	case o.Queued:
		return queued
	case o.Admitted:
		return admitted
	}
	return asked
}

// checkShare reports, as a *BusyError, whether one more operation would
// pass the node's share now; nothing is reserved.
func (n *node) checkShare() error {
	if over, s := n.share.over(n.held() + n.waiting.Load() + 1); over {
		return &BusyError{Node: n.name, Share: s}
	}
	return nil
}

// takeAdmitted takes a slot for an admitted operation (op.Op.Admitted),
// waiting for one within ctx as one of the node's waiters whatever the
// share: its caller checked the share before (checkShare).
func (n *node) takeAdmitted(ctx context.Context, name string) error {
	select {
	case n.sem <- struct{}{}:
		return nil
	default:
	}
	n.waiting.Add(1)
	defer n.leave()
	return n.waitSlot(ctx, name)
}

// takeQueued takes a slot for a queued operation (op.Op.Queued), waiting
// for one within ctx whatever the share, and counts it apart: such an
// operation holds no request slot of the caller, and nothing would retry
// it. releaseQueued gives the slot back.
func (n *node) takeQueued(ctx context.Context, name string) error {
	if err := n.waitSlot(ctx, name); err != nil {
		return err
	}
	n.queued.Add(1)
	return nil
}

// waitSlot waits within ctx for a slot, whatever the share: the callers
// above decide how the wait is counted. name names the operation in the
// error. A slot that frees as ctx ends is given back: select picks either
// ready case at random, and an operation sent past its caller's deadline
// would hold the caller for up to one more timeout. It is given back
// bare, not through release, which would send the parked Gets first on
// this caller's goroutine, as late; they wait on the slot themselves.
func (n *node) waitSlot(ctx context.Context, name string) error {
	select {
	case n.sem <- struct{}{}:
		if err := ctx.Err(); err != nil {
			<-n.sem
			return ctxError(n.name, name, err)
		}
		return nil
	case <-ctx.Done():
		return ctxError(n.name, name, ctx.Err())
	}
}

// releaseQueued gives back a slot takeQueued took.
func (n *node) releaseQueued() {
	n.queued.Add(-1)
	n.release()
}

// join counts the caller among the node's waiters for a slot, unless the
// node's operations in flight and waiting already hold its share: then a
// *BusyError. leave undoes a join that succeeded.
func (n *node) join() error {
	w := n.waiting.Add(1)
	if over, s := n.share.over(n.held() + w); over {
		n.waiting.Add(-1)
		return &BusyError{Node: n.name, Share: s}
	}
	return nil
}

func (n *node) leave() { n.waiting.Add(-1) }

// full reports whether an operation sent to the node now would wait for
// a slot or be refused.
func (n *node) full() bool {
	if len(n.sem) >= cap(n.sem) {
		return true
	}
	over, _ := n.share.over(n.held() + 1)
	return over
}
