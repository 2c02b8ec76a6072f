package route

import "sync/atomic"

// bound is the background budget: the replica writes running after their
// write was answered, in value bytes and in number, over all pools. A
// write it refuses waits for every replica instead, so what a client can
// make the gateway hold past its answers is the budget, and no more.
type bound struct {
	maxBytes, maxOps int64
	bytes, ops       atomic.Int64
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
	return true
}

// release gives back what acquire reserved.
func (b *bound) release(size int64) {
	b.bytes.Add(-size)
	b.ops.Add(-1)
}
