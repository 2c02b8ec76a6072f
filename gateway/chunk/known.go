package chunk

import (
	"hash/maphash"
	"sync/atomic"
)

// knownWords is the size of known's table: 256 KiB of words, one key
// hash each, allocated with the first index these Values write or read.
const knownWords = 1 << 15

// known remembers the keys whose item was an index when these Values
// last wrote or read it, so that a small write of such a key can retire
// the chunks it replaces (Values.overIndex), while a small write of any
// other key costs a hash and a load. It is lossy and lock-free: a word
// per key hash holding the hash itself, so a key whose word another key
// took is forgotten (its chunks are then left to expire, as any index
// written by another gateway and never read through this one), and a key
// is taken for another only if their 64-bit hashes are equal, which costs
// one head read. The zero value is not ready: seed must be set.
type known struct {
	seed  maphash.Seed
	words atomic.Pointer[[knownWords]atomic.Uint64]
}

// hash is key's word in the table: never 0, which marks a free word.
func (k *known) hash(key string) uint64 {
	return maphash.String(k.seed, key) | 1
}

// has reports whether key was last seen holding an index.
func (k *known) has(key string) bool {
	w := k.words.Load()
	if w == nil {
		return false
	}
	h := k.hash(key)
	return w[h%knownWords].Load() == h
}

// add remembers that key holds an index.
func (k *known) add(key string) {
	w := k.words.Load()
	if w == nil {
		k.words.CompareAndSwap(nil, new([knownWords]atomic.Uint64))
		w = k.words.Load()
	}
	h := k.hash(key)
	w[h%knownWords].Store(h)
}

// forget forgets key, which no longer holds an index.
func (k *known) forget(key string) {
	w := k.words.Load()
	if w == nil {
		return
	}
	h := k.hash(key)
	w[h%knownWords].CompareAndSwap(h, 0)
}
