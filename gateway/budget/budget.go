// Package budget bounds, in bytes, what the gateway holds on behalf of
// its clients: request bodies as they are read, values fetched for
// responses until they are written, multi-get and batch results, the
// asynchronous write queue and responses waiting for a slow reader. One
// Budget is shared by all of them, so that however the load is made up,
// what memcgate holds at once has one limit.
//
// A Budget never waits. An acquisition that would pass the limit fails
// at once, and its caller answers precisely (503 with Retry-After, or a
// per-item status in a batch) instead of holding the client's bytes.
package budget

import (
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// ErrExhausted is returned by Acquire when the bytes asked for would pass
// the limit.
var ErrExhausted = errors.New("budget: buffered bytes at their limit")

// Budget is a count of bytes held against a limit. It is safe for
// concurrent use and must not be copied after first use. A nil *Budget
// is unlimited and counts nothing.
type Budget struct {
	limit   atomic.Int64
	used    atomic.Int64
	refused atomic.Uint64

	freed   atomic.Pointer[[]*func()] // OnFree's functions; nil: none
	freedMu sync.Mutex                // serializes changes to freed
}

// New returns a budget of limit bytes; limit <= 0 means no limit (bytes
// are still counted).
func New(limit int64) *Budget {
	b := new(Budget)
	b.limit.Store(limit)
	return b
}

// SetLimit changes the limit for the acquisitions that follow; bytes held
// beyond a lowered limit are released as usual.
func (b *Budget) SetLimit(limit int64) {
	b.limit.Store(limit)
	b.notify()
}

// OnFree has f called after every change that may give room: a Release,
// an Acquire refused (its bytes, counted for a moment, taken back) and a
// SetLimit, each after the change is seen by Room. So a waiter that
// reads Room after it says it waits misses no room: what was given back
// before that read is in it, and what is given back after calls f. f runs
// on the goroutine that gave the bytes back, often with its locks held:
// it must be quick, never block and never call into the Budget's users.
// The function returned stops the calls; a call under way may still end
// after it returns. A nil Budget calls nothing.
func (b *Budget) OnFree(f func()) (stop func()) {
	if b == nil {
		return func() {}
	}
	fp := &f
	b.freedMu.Lock()
	var fs []*func()
	if old := b.freed.Load(); old != nil {
		fs = slices.Clone(*old)
	}
	fs = append(fs, fp)
	b.freed.Store(&fs)
	b.freedMu.Unlock()
	return func() {
		b.freedMu.Lock()
		defer b.freedMu.Unlock()
		old := b.freed.Load()
		if old == nil {
			return
		}
		fs := slices.DeleteFunc(slices.Clone(*old), func(g *func()) bool { return g == fp })
		if len(fs) == 0 {
			b.freed.Store(nil)
		} else {
			b.freed.Store(&fs)
		}
	}
}

// notify calls OnFree's functions.
func (b *Budget) notify() {
	if fs := b.freed.Load(); fs != nil {
		for _, f := range *fs {
			(*f)()
		}
	}
}

// Acquire counts n more bytes as held, or returns ErrExhausted, counting
// nothing, if that would pass the limit. Every successful Acquire is
// matched by a Release of the same n.
func (b *Budget) Acquire(n int64) error {
	if b == nil || n <= 0 {
		return nil
	}
	if used, limit := b.used.Add(n), b.limit.Load(); limit > 0 && used > limit {
		b.used.Add(-n)
		b.refused.Add(1)
		b.notify() // a Room read meanwhile saw n less
		return ErrExhausted
	}
	return nil
}

// Fits reports whether Acquire(n) would succeed now, counting nothing
// as held. A false answer counts as a refusal: its caller refuses on it.
func (b *Budget) Fits(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if limit := b.limit.Load(); limit > 0 && b.used.Load()+n > limit {
		b.refused.Add(1)
		return false
	}
	return true
}

// Force counts n more bytes as held whatever the limit: for bytes that
// are already in memory and cannot be dropped without breaking a
// response under way. Release them like acquired ones.
func (b *Budget) Force(n int64) {
	if b != nil && n > 0 {
		b.used.Add(n)
	}
}

// Release gives back n bytes counted by Acquire or Force.
func (b *Budget) Release(n int64) {
	if b != nil && n > 0 {
		b.used.Add(-n)
		b.notify()
	}
}

// Used is the number of bytes held now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Room is how many more bytes Acquire would hold now: the limit less
// what is held (0 past it), math.MaxInt64 without a limit. It counts no
// refusal, unlike Fits.
func (b *Budget) Room() int64 {
	if b == nil {
		return math.MaxInt64
	}
	limit := b.limit.Load()
	if limit <= 0 {
		return math.MaxInt64
	}
	return max(limit-b.used.Load(), 0)
}

// Limit is the limit in bytes; <= 0 means none.
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit.Load()
}

// Refused is the number of acquisitions refused so far.
func (b *Budget) Refused() uint64 {
	if b == nil {
		return 0
	}
	return b.refused.Load()
}
