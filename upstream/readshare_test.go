package upstream

import (
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fixedBudget is a ByteBudget of limit bytes with used of them held.
type fixedBudget struct{ limit, used int64 }

func (b fixedBudget) Limit() int64 { return b.limit }
func (b fixedBudget) Room() int64  { return max(b.limit-b.used, 0) }

// TestOverBytes: a node's reads may hold their fair part of the budget
// (the limit over every node), past it only while the budget, with the
// value held too, keeps at least as much free as the node would hold;
// the whole budget while no other node is up; anything without a
// budget.
func TestOverBytes(t *testing.T) {
	tests := []struct {
		name                string
		nodes, others, down int
		budget              ByteBudget // nil: none
		held, n             int64      // the node's reads, and the value asked for
		want                bool
	}{
		{"no budget", 2, 0, 0, nil, 0, 1 << 40, false},
		{"no limit", 2, 0, 0, fixedBudget{0, 0}, 0, 1 << 40, false},
		{"one node: the whole budget", 1, 0, 0, fixedBudget{100, 60}, 60, 40, false},
		{"the other node down: the whole budget", 2, 0, 1, fixedBudget{100, 60}, 60, 40, false},
		{"within the fair part", 2, 0, 0, fixedBudget{100, 10}, 10, 40, false},
		{"past half of two", 2, 0, 0, fixedBudget{100, 50}, 50, 1, true},
		{"one claim of most of the budget", 2, 0, 0, fixedBudget{100, 0}, 0, 90, true},
		{"one of three down: still bounded", 3, 0, 1, fixedBudget{90, 60}, 30, 1, true},
		{"a pool of one beside other pools' nodes", 1, 3, 0, fixedBudget{100, 0}, 0, 60, true},
		{"past the fair part, less than half what is free", 4, 0, 0, fixedBudget{100, 20}, 20, 10, false},
		{"past the fair part, more than half what is free", 4, 0, 0, fixedBudget{100, 50}, 20, 20, true},
		{"a node holding no more than is free after it", 4, 0, 0, fixedBudget{100, 40}, 30, 10, false},
		{"the budget lowered below what is held: the fair part still", 2, 0, 0, fixedBudget{40, 80}, 10, 10, false},
		{"the budget lowered below what is held: nothing past the fair part", 2, 0, 0, fixedBudget{40, 80}, 20, 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var down atomic.Int32
			down.Store(int32(tt.down))
			s := &requestShare{down: &down}
			s.nodes.Store(int64(tt.nodes))
			s.others.Store(int64(tt.others))
			if tt.budget != nil {
				s.bytes.Store(&tt.budget)
			}
			if got := s.overBytes(tt.held+tt.n, tt.n); got != tt.want {
				t.Errorf("overBytes(%d, %d) = %v, want %v", tt.held+tt.n, tt.n, got, tt.want)
			}
		})
	}
}

// TestReadHold: Take counts what a node's reads hold until Give, and
// past the share counts a refusal and holds nothing; the cluster's
// budget reaches every node's (ShareBytes).
func TestReadHold(t *testing.T) {
	c, _ := fakeCluster(t, 2, nil)
	b := &fixedBudget{limit: 100}
	c.ShareBytes(b)
	n := c.topo.Load().nodes[0]
	refusals := func() float64 {
		return testutil.ToFloat64(c.m.shareRefused.WithLabelValues(n.name))
	}
	if !n.reads.Take(50) {
		t.Fatal("Take of the fair part refused")
	}
	b.used = 50
	if n.reads.Take(1) || refusals() != 1 || n.reads.held.Load() != 50 {
		t.Errorf("Take past half of two nodes: held %d, %v refusals; want refused, 50 held, 1 refusal", n.reads.held.Load(), refusals())
	}
	n.reads.Give(50)
	b.used = 0
	if n.reads.held.Load() != 0 || !n.reads.Take(1) {
		t.Errorf("after Give: held %d, and a Take refused", n.reads.held.Load())
	}
	n.reads.Give(1)
	before := refusals()
	at, past := n.reads.Ahead(aheadBudgets*100), n.reads.Ahead(aheadBudgets*100+1)
	if !at || past || refusals() != before+1 {
		t.Errorf("Ahead of %d times the budget: %v, one byte more: %v, %v refusals counted; want true, false, 1",
			aheadBudgets, at, past, refusals()-before)
	}
	c.ShareBytes(nil)
	if !n.reads.Take(1<<30) || !n.reads.Ahead(1<<40) {
		t.Error("Take or Ahead refused without a budget")
	}
}
