package route

import (
	"sync"
	"sync/atomic"
)

// bound is the background budget: the replica writes running after their
// write was answered, in value bytes and in number, over all pools. A
// write it refuses waits for every replica instead, so what a client can
// make the gateway hold past its answers is the budget, and no more. The
// warm-up and shadow budgets are bounds too. What a bound holds is
// running work, which wait waits for (Router.Close). It must not be
// copied.
type bound struct {
	maxBytes, maxOps int64
	bytes, ops       atomic.Int64
	running          sync.WaitGroup // one per acquire not yet released
}

func newBound(maxBytes, maxOps int64, m *metrics) *bound {
	b := &bound{maxBytes: maxBytes, maxOps: maxOps}
	m.watchBound(b)
	return b
}

// acquire reserves one write of size bytes, if both caps have room for it.
func (b *bound) acquire(size int64) bool {
	if b.ops.Add(1) > b.maxOps {
		b.ops.Add(-1)
		return false
	}
	if b.bytes.Add(size) > b.maxBytes {
		b.bytes.Add(-size)
		b.ops.Add(-1)
		return false
	}
	b.running.Add(1)
	return true
}

// release gives back what acquire reserved.
func (b *bound) release(size int64) {
	b.bytes.Add(-size)
	b.ops.Add(-1)
	b.running.Done()
}

// wait returns once everything acquired has been released.
func (b *bound) wait() { b.running.Wait() }
