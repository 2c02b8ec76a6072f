package mcpipe

import (
	"hash/maphash"
	"sync/atomic"

	"github.com/memcgate/memcgate/upstream/op"
)

// sizeHints remembers, for the keys whose values a Room was last asked
// about, whether those values were large and about how large, so that a
// read the Room cannot take now is refused before it is sent (Client.Do).
// Without it a refused read still made memcached send the whole value,
// only to be dropped: a client asking for a 1 MB value over and over and
// never reading its answers turned a few bytes of request into a megabyte
// on the node's connections each time, ahead of every other client's
// requests there.
//
// It is a fixed table of hintSlots words, one per key hash, each
// overwritten by the last key that hashed to it: lossy, allocation-free
// and lock-free. A word holds the top bits of the key's hash (its tag)
// and the value's size in KiB; zero is empty. A hint is only a guess:
// the value may have changed since, which costs at most a refusal that a
// read would not have met (when the Room is full anyway), or a read that
// the Room is then asked about as before.
type sizeHints struct {
	seed  maphash.Seed
	used  atomic.Bool // a hint was ever noted: until then, keys are not even hashed
	slots [hintSlots]atomic.Uint64
}

// hintSlots is the number of keys sizeHints can remember at once: 32 KiB
// per node.
const hintSlots = 4096

// hintSizeBits is how many low bits of a word hold the size in KiB (up to
// 16 GiB, more than memcached's largest item).
const hintSizeBits = 24

func newSizeHints() *sizeHints {
	return &sizeHints{seed: maphash.MakeSeed()}
}

// slot returns the word for key and the tag a hint for key has there.
func (h *sizeHints) slot(key string) (*atomic.Uint64, uint64) {
	sum := maphash.String(h.seed, key)
	tag := sum>>hintSizeBits<<hintSizeBits | 1<<hintSizeBits // never zero
	return &h.slots[sum%hintSlots], tag
}

// saw records what a read of key that asked a Room found: a value of size
// bytes.
func (h *sizeHints) saw(key string, size int) {
	if size < op.LentValue {
		h.forget(key)
		return
	}
	w, tag := h.slot(key)
	w.Store(tag | uint64(min(size>>10, 1<<hintSizeBits-1)))
	h.used.Store(true)
}

// forget drops key's hint, if it has one: its value is small, gone or
// about to change.
func (h *sizeHints) forget(key string) {
	if !h.used.Load() {
		return
	}
	w, tag := h.slot(key)
	if v := w.Load(); v&^(1<<hintSizeBits-1) == tag {
		w.CompareAndSwap(v, 0)
	}
}

// size is the size last seen of key's value if it was large, else 0.
func (h *sizeHints) size(key string) int {
	if !h.used.Load() {
		return 0
	}
	w, tag := h.slot(key)
	if v := w.Load(); v&^(1<<hintSizeBits-1) == tag {
		return int(v&(1<<hintSizeBits-1)) << 10
	}
	return 0
}
