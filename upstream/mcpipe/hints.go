package mcpipe

import (
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/memcgate/memcgate/upstream/op"
)

// SizeHints remembers which keys last had a large value, and about how
// large, as seen by reads that asked a Room: such reads go on the large
// lane, and a read the Room could not take now is refused before it is
// sent (Client.admit). Decision 0017 says why. Package upstream keeps one
// for each node of gomemcache's pool too, which has no lanes: there a
// key known large is never parked in a batch of Gets (decisions/0062).
//
// It is a fixed table of hintSlots words, one per key hash, each
// overwritten by the last key that hashed to it: lossy, allocation-free
// and lock-free. A word holds the top bits of the key's hash (its tag)
// and the value's size in KiB; zero is empty. A hint is only a guess:
// the value may have changed or gone since. A hint is trusted for
// hintRetry from when it was learnt; after that a read refused on it is
// still sent, once per hintRetry for its slot, so that a stale hint is
// corrected while the Room stays full, at the cost of one value read and
// dropped per interval when it was right.
//
// A SizeHints must not be copied.
type SizeHints struct {
	seed  maphash.Seed
	used  atomic.Bool // a hint was ever noted: until then, keys are not even hashed
	slots [hintSlots]atomic.Uint64
	tried [hintSlots]atomic.Int64 // when the slot's hint was learnt or a read refused on it last sent anyway, in Unix nanoseconds
	every time.Duration           // hintRetry; tests shorten it
}

// hintSlots is the number of keys SizeHints can remember at once: 64 KiB
// per node with tried.
const hintSlots = 4096

// hintSizeBits is how many low bits of a word hold the size in KiB (up to
// 2 GiB, more than memcached's largest item, 1 GiB, and still an int on
// 32-bit systems), and hintSizeMask those bits.
const (
	hintSizeBits = 21
	hintSizeMask = 1<<hintSizeBits - 1
)

// hintRetry is how often a read refused on its key's hint is sent anyway.
const hintRetry = time.Second

// NewSizeHints returns an empty table.
func NewSizeHints() *SizeHints {
	return &SizeHints{seed: maphash.MakeSeed(), every: hintRetry}
}

// slot returns the index of key's word and the tag a hint for key has
// there.
func (h *SizeHints) slot(key string) (int, uint64) {
	sum := maphash.String(h.seed, key)
	return int(sum % hintSlots), sum&^hintSizeMask | 1<<hintSizeBits // never zero
}

// Saw records what a read of key that asked a Room found: a value of size
// bytes.
func (h *SizeHints) Saw(key string, size int) {
	if size < op.LentValue {
		h.Forget(key)
		return
	}
	i, tag := h.slot(key)
	h.slots[i].Store(tag | uint64(min(size>>10, hintSizeMask)))
	h.tried[i].Store(time.Now().UnixNano())
	if !h.used.Load() {
		h.used.Store(true)
	}
}

// Forget drops key's hint, if it has one: its value is small, gone or
// about to change.
func (h *SizeHints) Forget(key string) {
	if !h.used.Load() {
		return
	}
	i, tag := h.slot(key)
	if v := h.slots[i].Load(); v&^hintSizeMask == tag {
		h.slots[i].CompareAndSwap(v, 0)
	}
}

// Size is the size last seen of key's value if it was large, else 0.
func (h *SizeHints) Size(key string) int {
	if !h.used.Load() {
		return 0
	}
	i, tag := h.slot(key)
	if v := h.slots[i].Load(); v&^hintSizeMask == tag {
		return int(v&hintSizeMask) << 10
	}
	return 0
}

// Retry reports whether a read of key, refused on its hint, is to be sent
// anyway: true at most once per hintRetry for key's slot, and not within
// hintRetry of the hint being learnt.
func (h *SizeHints) Retry(key string) bool {
	i, _ := h.slot(key)
	now := time.Now().UnixNano()
	last := h.tried[i].Load()
	return now-last >= int64(h.every) && h.tried[i].CompareAndSwap(last, now)
}
