// Package bufpool lends byte buffers for request bodies and takes them
// back, so that a gateway reading large bodies at a high rate reuses
// their memory instead of asking the garbage collector for fresh, zeroed
// pages for each one: for 100 KB PUTs the allocation, the zeroing, the
// page faults of new memory and the collector's work on it were about
// 40 % of the gateway's CPU (docs/decisions/0011-pooled-body-buffers.md).
//
// Buffers come in power-of-two size classes from MinSize to MaxSize; a
// buffer lent for n bytes has the capacity of the smallest class that
// holds n, and larger ones are allocated and never kept. A buffer given
// back must no longer be read or written by anyone: its next borrower
// overwrites it. Its bytes beyond what the borrower writes are whatever
// the previous borrower left, so a borrower reads only what it wrote.
package bufpool

import (
	"math/bits"
	"sync"
	"unsafe"
)

const (
	// MinSize is the capacity of the smallest buffer Get lends.
	MinSize = 4 << 10
	// MaxSize is the capacity of the largest buffer a Pool keeps.
	MaxSize = 1 << 20

	minShift = 12 // log2(MinSize)
	classes  = 9  // MinSize << 0 … MinSize << 8 == MaxSize
)

// Pool lends byte buffers in size classes. The zero value is ready to
// use and a nil *Pool keeps nothing (Get allocates, Put drops). It is
// safe for concurrent use; the buffers it keeps go to the garbage
// collector like those of a sync.Pool when they stay unused.
type Pool struct {
	// The first byte of each buffer: a pointer goes into a sync.Pool
	// without an allocation, and the class gives the length back.
	free [classes]sync.Pool // of *byte
}

// Get returns a buffer of length 0 and a capacity of at least n: the
// smallest class's capacity that holds n, or exactly n above MaxSize.
func (p *Pool) Get(n int) []byte {
	if n > MaxSize {
		return make([]byte, 0, n)
	}
	c := class(n)
	size := MinSize << c
	if p != nil {
		if first, _ := p.free[c].Get().(*byte); first != nil {
			return unsafe.Slice(first, size)[:0]
		}
	}
	return make([]byte, 0, size)
}

// Put gives b back for a later Get, if its capacity is a class's; other
// buffers are left to the garbage collector. Nothing may use b, or any
// slice of its array, after Put.
func (p *Pool) Put(b []byte) {
	size := cap(b)
	if p == nil || size < MinSize || size > MaxSize || size&(size-1) != 0 {
		return
	}
	p.free[bits.TrailingZeros(uint(size))-minShift].Put(unsafe.SliceData(b[:size]))
}

// class returns the index of the smallest class that holds n bytes.
func class(n int) int {
	if n <= MinSize {
		return 0
	}
	return bits.Len(uint(n-1)) - minShift
}
