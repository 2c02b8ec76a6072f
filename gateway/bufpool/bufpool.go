// Package bufpool lends byte buffers for request bodies and takes them
// back, so that a gateway reading large bodies at a high rate reuses
// their memory instead of asking the garbage collector for fresh, zeroed
// pages for each one: for 100 KB PUTs the allocation, the zeroing, the
// page faults of new memory and the collector's work on it are otherwise
// a large part of the gateway's CPU
// (docs/decisions/0011-pooled-body-buffers.md).
//
// Buffers come in power-of-two size classes from MinSize to MaxSize; a
// buffer lent for n bytes has the capacity of the smallest class that
// holds n, and larger ones are allocated and never kept. Buffers of
// SmallMax or less are kept as a sync.Pool keeps things, per processor
// and until the garbage collector drops them; larger ones are kept up to
// a number of bytes set when the Pool is made, and for IdleMax at most
// without being lent again, and beyond either given to the garbage
// collector: what a burst of large bodies leaves behind is bounded, and
// does not outlive the burst.
//
// A buffer given back must no longer be read or written by anyone: its
// next borrower overwrites it. Its bytes beyond what the borrower writes
// are whatever the previous borrower left, so a borrower reads only what
// it wrote.
package bufpool

import (
	"math/bits"
	"sync"
	"time"
	"unsafe"
)

const (
	// MinSize is the capacity of the smallest buffer Get lends.
	MinSize = 4 << 10
	// SmallMax is the capacity of the largest buffer kept per processor.
	SmallMax = 16 << 10
	// MaxSize is the capacity of the largest buffer a Pool keeps.
	MaxSize = 1 << 20

	// IdleMax is how long a large buffer is kept without being lent.
	IdleMax = time.Second

	minShift = 12 // log2(MinSize)
	small    = 3  // classes of SmallMax and less
	classes  = 9  // MinSize << 0 … MinSize << 8 == MaxSize
)

// Pool lends byte buffers in size classes. It is safe for concurrent
// use. A nil *Pool keeps nothing: Get allocates and Put drops.
type Pool struct {
	// The first byte of each small buffer: a pointer goes into a
	// sync.Pool without an allocation, and the class gives the length
	// back.
	small [small]sync.Pool // of *byte

	mu    sync.Mutex
	large [classes - small][]freeBuf // free buffers of each large class, oldest first
	kept  int                        // bytes in large
	max   int                        // the most bytes large may hold
	idle  time.Duration              // IdleMax (tests shorten it)
	sweep *time.Timer                // lets go of buffers idle for IdleMax; made by the first Put
	armed bool                       // sweep is set to fire
}

// freeBuf is a large buffer kept, and when it was given back.
type freeBuf struct {
	b  []byte
	at time.Time
}

// New returns a Pool that keeps at most maxLarge bytes of buffers larger
// than SmallMax (none if maxLarge <= 0).
func New(maxLarge int) *Pool {
	return &Pool{max: maxLarge, idle: IdleMax}
}

// Cap is the capacity of the buffer Get(n) lends: n's size class, or n
// itself past MaxSize.
func (p *Pool) Cap(n int) int {
	if n > MaxSize {
		return n
	}
	return MinSize << class(n)
}

// Get returns a buffer of length 0 and a capacity of at least n: the
// smallest class's capacity that holds n, or exactly n above MaxSize.
func (p *Pool) Get(n int) []byte {
	if n > MaxSize {
		return make([]byte, 0, n)
	}
	c := class(n)
	size := MinSize << c
	switch {
	case p == nil:
	case c < small:
		if first, _ := p.small[c].Get().(*byte); first != nil {
			return unsafe.Slice(first, size)[:0]
		}
	default:
		p.mu.Lock()
		free := p.large[c-small]
		if k := len(free); k > 0 {
			b := free[k-1].b
			free[k-1] = freeBuf{}
			p.large[c-small] = free[:k-1]
			p.kept -= size
			p.mu.Unlock()
			return b[:0]
		}
		p.mu.Unlock()
	}
	return make([]byte, 0, size)
}

// Put gives b back for a later Get, if its capacity is a class's and,
// for a large one, the Pool has room for it; other buffers are left to
// the garbage collector. Nothing may use b, or any slice of its array,
// after Put.
func (p *Pool) Put(b []byte) {
	size := cap(b)
	if p == nil || size < MinSize || size > MaxSize || size&(size-1) != 0 {
		return
	}
	c := bits.TrailingZeros(uint(size)) - minShift
	if c < small {
		p.small[c].Put(unsafe.SliceData(b[:size]))
		return
	}
	p.mu.Lock()
	if p.kept+size <= p.max {
		p.large[c-small] = append(p.large[c-small], freeBuf{b[:size], time.Now()})
		p.kept += size
		p.armLocked()
	}
	p.mu.Unlock()
}

// armLocked sets the sweep to fire p.idle from now, if it is not set.
func (p *Pool) armLocked() {
	switch {
	case p.armed:
	case p.sweep == nil:
		p.sweep = time.AfterFunc(p.idle, p.sweepIdle)
	default:
		p.sweep.Reset(p.idle)
	}
	p.armed = true
}

// sweepIdle lets go of the large buffers kept for IdleMax or longer, and
// sets itself again while some are kept.
func (p *Pool) sweepIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = false
	cutoff := time.Now().Add(-p.idle)
	for c, free := range p.large {
		n := 0
		for n < len(free) && !free[n].at.After(cutoff) {
			p.kept -= cap(free[n].b)
			n++
		}
		if n > 0 {
			k := copy(free, free[n:])
			clear(free[k:])
			p.large[c] = free[:k]
		}
	}
	if p.kept > 0 {
		p.armLocked()
	}
}

// SetMax changes the most bytes of large buffers the Pool keeps, and
// lets go of kept buffers beyond a lowered one. A nil Pool ignores it.
func (p *Pool) SetMax(maxLarge int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.max = maxLarge
	for c := len(p.large) - 1; c >= 0 && p.kept > p.max; c-- {
		free := p.large[c]
		for len(free) > 0 && p.kept > p.max {
			p.kept -= cap(free[len(free)-1].b)
			free[len(free)-1] = freeBuf{}
			free = free[:len(free)-1]
		}
		p.large[c] = free
	}
}

// Kept returns the bytes of large buffers the Pool holds for reuse.
func (p *Pool) Kept() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept
}

// class returns the index of the smallest class that holds n bytes.
func class(n int) int {
	if n <= MinSize {
		return 0
	}
	return bits.Len(uint(n-1)) - minShift
}
