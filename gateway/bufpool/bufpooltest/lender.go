// Package bufpooltest provides a lender of byte buffers for tests of the
// code that borrows them from a bufpool.Pool: it lends as the pool does
// and checks that every buffer is given back once, only when nothing
// uses it any more.
package bufpooltest

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/memcgate/memcgate/gateway/bufpool"
)

// Poison is what a buffer holds once it is given back.
const Poison = 0xEE

// Lender lends byte buffers with bufpool's capacities (power-of-two
// classes from bufpool.MinSize, so a buffer may be larger than asked
// for), and checks how they are used: a buffer given back is poisoned
// and lent again first, so that whoever still uses it sees the next
// borrower's bytes or the poison; a Put of a buffer that is not out
// (given back twice, or never lent), of one with another capacity than
// it was lent with, or of one marked held is an error, and so is a value
// in a buffer already given back (Using). Check reports the errors. It
// is safe for concurrent use.
type Lender struct {
	mu    sync.Mutex
	out   map[*byte]int // lent and not given back: first byte → capacity
	held  map[*byte]bool
	free  [][]byte
	errs  []string
	lends int
}

// New returns a Lender with nothing lent.
func New() *Lender {
	return &Lender{out: map[*byte]int{}, held: map[*byte]bool{}}
}

// arrayOf identifies b's array by its first byte.
func arrayOf(b []byte) *byte { return &b[:1][0] }

// Cap is the capacity Get(n) lends.
func (l *Lender) Cap(n int) int {
	size := bufpool.MinSize
	for size < n {
		size *= 2
	}
	return size
}

// Get lends a buffer of length 0 and the capacity bufpool would give for
// n bytes, a poisoned one given back before if there is one.
func (l *Lender) Get(n int) []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lends++
	size := l.Cap(n)
	for i, b := range l.free {
		if cap(b) == size {
			l.free = slices.Delete(l.free, i, i+1)
			l.out[arrayOf(b)] = size
			return b[:0]
		}
	}
	b := make([]byte, 0, size)
	l.out[arrayOf(b)] = size
	return b
}

// Put takes b back and poisons it.
func (l *Lender) Put(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := arrayOf(b)
	switch size, ok := l.out[p]; {
	case !ok:
		l.errs = append(l.errs, fmt.Sprintf("Put of a buffer that is not lent (cap %d): given back twice?", cap(b)))
		return
	case size != cap(b):
		l.errs = append(l.errs, fmt.Sprintf("Put with cap %d of a buffer lent with cap %d", cap(b), size))
	case l.held[p]:
		l.errs = append(l.errs, fmt.Sprintf("Put of a buffer (cap %d) its holder still holds", cap(b)))
	}
	delete(l.out, p)
	b = b[:cap(b)]
	for i := range b {
		b[i] = Poison
	}
	l.free = append(l.free, b[:0])
}

// Hold records that someone keeps b: giving it back is an error until
// Release.
func (l *Lender) Hold(b []byte) {
	l.mu.Lock()
	l.held[arrayOf(b)] = true
	l.mu.Unlock()
}

// Release ends a Hold.
func (l *Lender) Release(b []byte) {
	l.mu.Lock()
	delete(l.held, arrayOf(b))
	l.mu.Unlock()
}

// Using checks that v, a value about to be used (on its way to
// memcached), is not in a buffer already given back.
func (l *Lender) Using(what string, v []byte) {
	if cap(v) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.free {
		if arrayOf(b[:cap(b)]) == arrayOf(v) {
			l.errs = append(l.errs, what+": the value is in a buffer already given back")
		}
	}
}

// Lent is how many buffers are out.
func (l *Lender) Lent() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.out)
}

// Lends is how many buffers were ever lent.
func (l *Lender) Lends() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lends
}

// Check reports every error seen so far on t.
func (l *Lender) Check(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errs {
		t.Error(e)
	}
}
