package phpvalue

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"io"
	"math"
)

// pecl/memcache's flag bits (src/memcache_pool.h, MMC_*): the low byte
// holds SERIALIZED and COMPRESSED, the second byte the type of an
// unserialized value, and bits 16-31 are the application's.
const (
	memcacheSerialized = 0x0001
	memcacheCompressed = 0x0002
	memcacheTypeMask   = 0x0f00 // what mmc_unpack_value switches on
	memcacheTypeBool   = 0x0100
	memcacheTypeLong   = 0x0300
	memcacheTypeDouble = 0x0700
)

// Defaults of pecl/memcache's compression settings, used where
// MemcacheOptions are given zero values.
const (
	// DefaultMemcacheThreshold is memcache.compress_threshold: strings of
	// at least this many bytes are compressed.
	DefaultMemcacheThreshold = 20000
	// DefaultMemcacheMinSavings is MMC_DEFAULT_SAVINGS, the default second
	// argument of Memcache::setCompressThreshold: the compressed form is
	// kept only if it saves at least this fraction.
	DefaultMemcacheMinSavings = 0.2
)

// MemcacheCompressed reports whether DecodeMemcache of a value with these
// flags inflates it: its cost then depends on the inflated size, up to
// DecodeMemcache's maxSize, not on the payload's.
func MemcacheCompressed(flags uint32) bool { return flags&memcacheCompressed != 0 }

// DecodeMemcache interprets a value the older Memcache extension
// (pecl/memcache 3.x and 4.x, Debian php-memcache) stored with the given
// flags, as Memcache::get reads it (mmc_unpack_value):
//
//   - COMPRESSED (0x02): the payload is a zlib stream (RFC 1950, from
//     compress(), with no length prefix), whatever the type;
//   - SERIALIZED (0x01): the body is PHP serialize() output (Serialized);
//   - otherwise the type byte (flags & 0x0f00): 0x0300 Long, 0x0700
//     Double (stored as text, e.g. "0.1", "1.0e+100", "-INF", "NAN"),
//     0x0100 Bool, and String for 0 and every other value, as PHP reads
//     them.
//
// A Bool body is normalised to the Type's storage form: "1" for true (PHP
// reads true only for the one-byte body "1") and empty for false
// (pecl/memcache writes "0"). UserFlags are the flags' bits 16-31. maxSize
// bounds len(Body); maxSize <= 0 means DefaultMaxSize. A compressed
// payload does not record its inflated size, so inflating stops, with
// ErrTooLarge, as soon as it passes maxSize: a small payload cannot make
// DecodeMemcache allocate much more than maxSize.
//
// Errors wrap ErrCorrupt (a compressed payload that does not inflate) or
// ErrTooLarge. DecodeMemcache never panics and is safe for concurrent use.
func DecodeMemcache(flags uint32, payload []byte, maxSize int) (Value, error) {
	return DecodeMemcacheHeld(flags, payload, maxSize, nil)
}

// DecodeMemcacheHeld is DecodeMemcache with the inflated body's memory
// asked of hold (nil: nothing asked) before each buffer it grows into is
// allocated: the size is not recorded, so the body doubles as it comes,
// and hold sees every buffer, about twice the body in all.
func DecodeMemcacheHeld(flags uint32, payload []byte, maxSize int, hold Hold) (Value, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	v := Value{Type: memcacheType(flags), UserFlags: uint16(flags >> userFlagsShift), Body: payload}
	if flags&memcacheCompressed != 0 {
		body, err := inflateUnsized(payload, maxSize, hold)
		if err != nil {
			return Value{}, err
		}
		v.Body = body
	} else if len(payload) > maxSize {
		return Value{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(payload), maxSize)
	}
	if v.Type == Bool {
		v.Body = memcacheBool(v.Body)
	}
	return v, nil
}

// memcacheType is the Type pecl/memcache gives a value with these flags.
func memcacheType(flags uint32) Type {
	if flags&memcacheSerialized != 0 {
		return Serialized
	}
	switch flags & memcacheTypeMask {
	case memcacheTypeLong:
		return Long
	case memcacheTypeDouble:
		return Double
	case memcacheTypeBool:
		return Bool
	default:
		return String
	}
}

// memcacheBool maps a stored bool to the Bool storage form.
func memcacheBool(body []byte) []byte {
	if len(body) == 1 && body[0] == '1' {
		return body
	}
	return body[:0]
}

// inflateUnsized decodes a zlib stream of unknown inflated size, failing
// with ErrTooLarge once it passes maxSize. The body grows by doubling,
// from what the input can plausibly produce; each new buffer is asked of
// hold (if not nil) before it is allocated. The limit and hold, not the
// first guess, are what bound a bomb.
func inflateUnsized(data []byte, maxSize int, hold Hold) ([]byte, error) {
	r, err := zlib.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: zlib: %w", ErrCorrupt, err)
	}
	defer r.Close()
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			// One byte past maxSize tells "too large" from "exactly
			// maxSize".
			if len(buf) > maxSize {
				return nil, fmt.Errorf("%w: zlib data inflates to more than %d bytes", ErrTooLarge, maxSize)
			}
			next := min(maxSize+1, max(2*cap(buf), 4*len(data)+512))
			if hold != nil {
				if err := hold(next); err != nil {
					return nil, fmt.Errorf("inflating past %d bytes: %w", len(buf), err)
				}
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: zlib: %w", ErrCorrupt, err)
		}
	}
	if len(buf) > maxSize {
		return nil, fmt.Errorf("%w: zlib data inflates to more than %d bytes", ErrTooLarge, maxSize)
	}
	return buf, nil
}

// MemcacheOptions control EncodeMemcache. The zero value reproduces
// pecl/memcache's defaults.
type MemcacheOptions struct {
	// Threshold is the length from which strings are compressed
	// (memcache.compress_threshold, Memcache::setCompressThreshold); 0
	// means DefaultMemcacheThreshold and a negative value never
	// compresses, as a threshold of 0 does in PHP.
	Threshold int
	// MinSavings: the compressed form is kept only if it is at most
	// len × (1 − MinSavings) bytes (setCompressThreshold's second
	// argument, from 0 to 1); 0, above 1 or NaN means
	// DefaultMemcacheMinSavings, and a negative value asks for no savings,
	// as 0 does in PHP.
	MinSavings float64
	// UserFlags go into the flags' bits 16-31.
	UserFlags uint16
}

func (o MemcacheOptions) withDefaults() MemcacheOptions {
	if o.Threshold == 0 {
		o.Threshold = DefaultMemcacheThreshold
	}
	switch {
	case o.MinSavings < 0:
		o.MinSavings = 0
	case !(o.MinSavings > 0 && o.MinSavings <= 1):
		o.MinSavings = DefaultMemcacheMinSavings
	}
	return o
}

// EncodeMemcache returns the payload and flags under which pecl/memcache's
// Memcache::get reads value back as the same PHP string: type 0, user
// flags in bits 16-31, and, from Threshold bytes, a zlib stream with
// COMPRESSED set when it saves at least MinSavings (pecl/memcache gives
// compress() a buffer of len × (1 − savings) bytes and stores the value
// uncompressed when the stream does not fit). When the value is stored
// uncompressed the returned payload is value itself, not a copy.
// EncodeMemcache is safe for concurrent use.
func EncodeMemcache(value []byte, opt MemcacheOptions) (payload []byte, flags uint32) {
	opt = opt.withDefaults()
	flags = uint32(opt.UserFlags) << userFlagsShift
	if opt.Threshold < 0 || len(value) < opt.Threshold {
		return value, flags
	}
	budget := int(math.Floor(float64(len(value)) * (1 - opt.MinSavings)))
	var buf bytes.Buffer
	buf.Grow(budget + 64)
	w := zlib.NewWriter(&buf) // default level, like compress()
	if _, err := w.Write(value); err != nil {
		return value, flags
	}
	if err := w.Close(); err != nil || buf.Len() > budget {
		return value, flags
	}
	return buf.Bytes(), flags | memcacheCompressed
}
