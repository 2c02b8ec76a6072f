// Package chunk stores values larger than one memcached item. A value is
// written as numbered chunks under keys derived from its key and a random
// version, and then an index item under the key itself that names the
// version, the size and the chunk size. The index is written last and
// its chunks carry its version in their keys, so a reader sees the old
// value whole or the new one whole, never a mix of two; chunks outlive
// the index that names them by a grace period, so a reader that has read
// an index finds its chunks. Chunks go to their index's node
// (docs/decisions/0009-values-in-chunks.md says why).
//
// format.go is the format and does no I/O; values.go and reader.go read
// and write through a Store. The package knows nothing of HTTP.
package chunk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"

	"github.com/memcgate/memcgate/upstream/op"
)

// IndexFlags are the memcached flags of an index item. No value codec
// writes them: php-memcached reads type 15, which it does not know, and
// fails the get; pecl/memcache, and most other clients, find their
// compressed bit set and fail to decompress the index. So a client that
// reads memcached directly gets an error for a chunked value, never the
// index's bytes as if they were the value.
const IndexFlags uint32 = 0x8000000F

// magic starts every index: with IndexFlags, it is what marks an item as
// an index. Its first byte is not a zlib header, so clients that read
// the flags as "compressed" fail to inflate it.
const magic = "MGCX"

// formatVersion is the layout of what follows magic.
const formatVersion = 1

// indexLen is the length of an encoded index: magic, format version,
// version, size, chunk size, flags.
const indexLen = len(magic) + 1 + 8 + 8 + 4 + 4

// KeyPrefix starts every chunk key. The gateway refuses client keys that
// start with it (Reserved), and the HttpMemcModule endpoints cannot send
// one: they escape '%' as "%25", so a '%' they send is always followed by
// two hexadecimal digits, and '~' is not one.
const KeyPrefix = "%~"

// Limits on what an index may describe: larger ones are corrupt. They
// bound a chunk key's length and what a reader may be asked to hold.
const (
	// MaxChunkSize is the largest chunk size (memcached's -I is at most
	// 1 GiB, but a reader holds two chunks at once).
	MaxChunkSize = 64 << 20
	// MaxChunks is the most chunks of one value.
	MaxChunks = 1 << 24
)

// MaxKeyLen is the longest chunk key: KeyPrefix, 32 hex digits of the
// key's hash, '.', 16 of the version, '.', and up to 8 decimal digits of
// the chunk's number. It must fit memcached's 250 bytes with the
// gateway's key prefix.
const MaxKeyLen = len(KeyPrefix) + 32 + 1 + 16 + 1 + 8

// Errors of reading a value in chunks.
var (
	// ErrChunked is a request that cannot take a value stored in
	// chunks: append and prepend, or a read that cannot stream it (a
	// multi-get, a batch, the HttpMemcModule endpoints).
	ErrChunked = errors.New("chunk: the value is stored in chunks")
	// ErrChanging is an append or prepend whose item changed, every
	// time it was read, before the append could be sent (Values.Do):
	// other writes of the key kept landing in between.
	ErrChanging = errors.New("chunk: the item kept changing between its check and the append")
	// ErrMissing is a chunk that is gone (evicted, expired) or is not
	// the one its index names (wrong length or checksum): the value is
	// lost, and its index is dropped.
	ErrMissing = errors.New("chunk: a chunk of the value is missing")
	// ErrCorrupt is an item that starts as an index does but is not
	// one (an append or prepend reached it through another client).
	ErrCorrupt = errors.New("chunk: the index is corrupt")
	// ErrMoved is a Put during which its key's placement changed
	// (Options.Layout: a reload, or a node ejected or re-admitted): its
	// chunks and its index may be on different nodes, so the value is
	// not stored, or (when the change came while the index was on its
	// way) may be stored unreadable.
	ErrMoved = errors.New("chunk: the key's nodes changed while the value was written")
)

// Index describes a value stored in chunks.
type Index struct {
	Version   uint64 // random, in every chunk key: a rewrite uses new keys
	Size      int64  // the value's length in bytes
	ChunkSize int    // bytes per chunk; the last holds the rest
	Flags     uint32 // the value's flags, as the item of a small value would have them
}

// Count is the number of chunks.
func (x Index) Count() int {
	if x.Size == 0 {
		return 0
	}
	return int((x.Size + int64(x.ChunkSize) - 1) / int64(x.ChunkSize))
}

// ChunkLen is the length of chunk i.
func (x Index) ChunkLen(i int) int {
	return int(min(int64(x.ChunkSize), x.Size-int64(i)*int64(x.ChunkSize)))
}

// Encode returns the index as stored (under IndexFlags).
func (x Index) Encode() []byte {
	b := make([]byte, 0, indexLen)
	b = append(b, magic...)
	b = append(b, formatVersion)
	b = binary.BigEndian.AppendUint64(b, x.Version)
	b = binary.BigEndian.AppendUint64(b, uint64(x.Size))
	b = binary.BigEndian.AppendUint32(b, uint32(x.ChunkSize))
	return binary.BigEndian.AppendUint32(b, x.Flags)
}

// IsIndex reports whether an item with these flags and value is an
// index: its flags are IndexFlags and its value holds the marker. The
// marker is at its start, but for an index a prepend reached (one that
// raced the PUT that wrote the index, after it had found a plain value
// there): that item is an index too, a corrupt one (Parse), so that its
// bytes are never served as the value. An item that is not one is a
// plain value, whatever its flags.
func IsIndex(flags uint32, value []byte) bool {
	return flags == IndexFlags && bytes.Contains(value, []byte(magic))
}

// Parse reads the index it holds. ok is false if it is not an index
// (IsIndex); err wraps ErrCorrupt if it looks like one but is not.
func Parse(it op.Item) (x Index, ok bool, err error) {
	if !IsIndex(it.Flags, it.Value) {
		return Index{}, false, nil
	}
	b := it.Value
	if i := bytes.Index(b, []byte(magic)); i > 0 {
		return Index{}, true, fmt.Errorf("%w: %d bytes before its marker", ErrCorrupt, i)
	}
	if len(b) != indexLen || b[len(magic)] != formatVersion {
		return Index{}, true, fmt.Errorf("%w: %d bytes, format %d", ErrCorrupt, len(b), b[min(len(magic), len(b)-1)])
	}
	b = b[len(magic)+1:]
	x.Version = binary.BigEndian.Uint64(b)
	size := binary.BigEndian.Uint64(b[8:])
	chunk := binary.BigEndian.Uint32(b[16:])
	x.Flags = binary.BigEndian.Uint32(b[20:])
	if chunk == 0 || chunk > MaxChunkSize || size > uint64(chunk)*MaxChunks {
		return Index{}, true, fmt.Errorf("%w: %d bytes in chunks of %d", ErrCorrupt, size, chunk)
	}
	x.Size, x.ChunkSize = int64(size), int(chunk)
	return x, true, nil
}

// Reserved reports whether a client may not use key: it starts with
// KeyPrefix.
func Reserved(key string) bool {
	return len(key) >= len(KeyPrefix) && key[:len(KeyPrefix)] == KeyPrefix
}

// keyBase is the part of key's chunk keys of one version before the
// chunk's number: KeyPrefix, a hash of the key (any key, up to 250
// bytes, gives a key of fixed length), the version.
func keyBase(key string, version uint64) string {
	h := sha256.Sum256([]byte(key))
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], version)
	b := make([]byte, 0, MaxKeyLen)
	b = append(b, KeyPrefix...)
	b = hex.AppendEncode(b, h[:16])
	b = append(b, '.')
	b = hex.AppendEncode(b, v[:])
	return string(append(b, '.'))
}

// Key is the key of chunk i of key's value of the given version.
func Key(key string, version uint64, i int) string {
	return keyBase(key, version) + strconv.Itoa(i)
}

// crcTable is CRC-32C's (Castagnoli), which the CPU computes on amd64
// and arm64.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// checksum is a chunk's CRC-32C, stored as its flags: a chunk whose bytes
// do not match is never served.
func checksum(b []byte) uint32 { return crc32.Checksum(b, crcTable) }

// relativeMax is memcached's 30 days: larger expirations are Unix times.
const relativeMax = 60 * 60 * 24 * 30

// expiration is the expiration of chunks whose index expires at exp
// (memcached's meaning), grace seconds later; now is the Unix time, for
// a relative time that would pass 30 days.
func expiration(exp, grace int32, now int64) int32 {
	switch {
	case exp <= 0: // never, or at once
		return exp
	case exp <= relativeMax && exp+grace <= relativeMax:
		return exp + grace
	case exp <= relativeMax:
		return clampUnix(now + int64(exp) + int64(grace))
	}
	return clampUnix(int64(exp) + int64(grace))
}

func clampUnix(t int64) int32 {
	if t > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(t)
}
