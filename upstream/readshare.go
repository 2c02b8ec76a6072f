package upstream

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// A node's share of the caller's byte budget. A read whose value the
// caller holds through its op.Room (a large GET, every value of a
// multi-get or batch) holds the value's claimed size from its VALUE line,
// before the node has sent a byte of it (decisions/0012, 0025): a node
// that is slow or lies ("VALUE k 0 1048000" and then nothing, or a
// trickle within Timeout each step) holds that much until its reply ends
// or its connection fails. With many clients reading its keys it could
// hold the whole budget, and every other node's large reads and every
// client's bodies would be refused meanwhile. So while another node is
// up, the holds of a node's reads, counted from before each value is
// read until its reply has been read, are bounded as its request slots
// are (busy.go): its fair part of the budget (the budget over every
// node), and past it only while the budget, with the value held too,
// keeps as much free as the node would hold (overBytes). A value past
// that is refused as one the budget refused (ErrNoFit: read off and
// dropped, 503, not the node's failure, the key stays where it is).
// While no other node is up, a node's reads may take the whole budget.
// decisions/0050 says why here and why this rule.

// ByteBudget is the caller's byte budget as the nodes' shares read it:
// the gateway's budget.Budget. Limit is read on every value a Room is
// asked about, Room only past a node's fair part.
type ByteBudget interface {
	// Limit is the budget in bytes; <= 0 means none.
	Limit() int64
	// Room is how many more bytes it would hold now.
	Room() int64
}

// ShareBytes gives the cluster the byte budget its reads' Rooms hold
// values against (nil: none), so that each node's reads hold at most
// their share of it (readHold).
func (c *Cluster) ShareBytes(b ByteBudget) {
	if b == nil {
		c.share.bytes.Store(nil)
		return
	}
	c.share.bytes.Store(&b)
}

// overBytes reports whether a node whose reads would hold after bytes of
// the budget with n more would pass its share of it: never while no
// other node is up (other clusters' nodes count as up) or without a
// budget; else when after passes its fair part (the limit over the
// nodes) and the budget, once it held the n bytes too, would have less
// free than after. Every node stuck holding values keeps to what is
// free, so one bad node holds at most half of the budget, two of three a
// third each, as with request slots; and a single claim holds at most
// half of what is free, never the whole budget at once. (Room less n,
// not Room: a slot is one unit, but one value may claim all of the
// budget.)
func (s *requestShare) overBytes(after, n int64) bool {
	bp := s.bytes.Load()
	if bp == nil {
		return false
	}
	b := *bp
	limit := b.Limit()
	nodes, others := s.nodes.Load(), s.others.Load()
	if limit <= 0 || after <= limit/max(nodes+others, 1) {
		return false // no budget; within the fair part: a load and a division
	}
	if others == 0 && nodes-int64(s.down.Load()) <= 1 {
		return false
	}
	return after > b.Room()-n
}

// readHold counts what one node's reads hold of the caller's byte budget
// while they are read: mcpipe.Share for the node's pipelined connections,
// and the share of the claims its gomemcache pool holds (claimConn).
// It holds atomics: it must not be copied.
type readHold struct {
	held    atomic.Int64
	share   *requestShare
	refused prometheus.Counter // values refused past the share
}

// Take counts n bytes more as held by the node's reads, or, past the
// node's share of the budget (overBytes), counts a refusal and nothing
// held.
func (r *readHold) Take(n int) bool {
	if n <= 0 {
		return true
	}
	if r.share.overBytes(r.held.Add(int64(n)), int64(n)) {
		r.held.Add(-int64(n))
		r.refused.Inc()
		return false
	}
	return true
}

// Give gives back n bytes Take counted.
func (r *readHold) Give(n int) { r.held.Add(-int64(n)) }

// Ahead reports whether the node may have n bytes of large values on
// their way at once (mcpipe's reads sent on a size hint and not yet
// answered): aheadBudgets times the budget, whatever the other nodes
// have; or, past that, counts a refusal. decisions/0058 says why.
func (r *readHold) Ahead(n int64) bool {
	bp := r.share.bytes.Load()
	if bp == nil {
		return true
	}
	if limit := (*bp).Limit(); limit > 0 && n > aheadBudgets*limit {
		r.refused.Inc()
		return false
	}
	return true
}

// aheadBudgets is how many times the byte budget a node may have on its
// way as large values. Bytes on their way are not held yet: a fast
// reader's value is held only while its response is written, so the
// node may have more on its way than the budget could hold at once, and
// 64 clients reading 1 MB values as fast as they can are refused no
// more than without a bound; but it is bounded, so that requests for
// large values whose clients never read the answers cannot queue
// thousands of them on the node.
const aheadBudgets = 4
