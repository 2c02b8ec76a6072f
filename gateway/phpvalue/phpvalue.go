// Package phpvalue decodes memcached values written by PHP's Memcached
// extension (php-memcached 3.x; Decode) and by the older Memcache extension
// (pecl/memcache; DecodeMemcache), and encodes strings so that each reads
// them back unchanged (Encode, EncodeMemcache). It owns both flag layouts,
// the 4-byte length prefix and the FastLZ and zlib compression they use; it
// does no I/O and does not unserialize PHP, igbinary, JSON or msgpack
// bodies. The rest of this comment is about php-memcached; memcache.go
// describes pecl/memcache's layout.
//
// php-memcached splits the 32-bit memcached flags three ways: bits 0-3 hold
// the value type, bits 4-15 internal flags (0x10 compressed, 0x20 zlib,
// 0x40 FastLZ, 0x80 zstd) and bits 16-31 the user flags set with
// Memcached::OPT_USER_FLAGS. A compressed payload is the original length as
// a 4-byte little-endian integer followed by the compressed bytes.
//
// zstd is not supported: Debian's php-memcached 3.2.0 (the build we verify
// against) is compiled without it, ignores the 0x80 bit and cannot read
// such values either, so Decode reports them as ErrUnknownCompression.
package phpvalue

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Errors returned by Decode, wrapped with details; match them with
// errors.Is.
var (
	// ErrCorrupt means the payload cannot be what php-memcached wrote: a
	// truncated length prefix, compressed data that does not decode, or a
	// decoded length different from the stored one.
	ErrCorrupt = errors.New("phpvalue: corrupt value")
	// ErrUnknownCompression means the flags say compressed but name no
	// compression this package (and Debian's php-memcached) can read:
	// no type bit at all, as old HHVM wrote, or only the zstd bit.
	ErrUnknownCompression = errors.New("phpvalue: unknown compression")
	// ErrTooLarge means the decoded value would exceed the caller's limit.
	ErrTooLarge = errors.New("phpvalue: value too large")
	// ErrUnknownType means the low 4 bits of the flags are not a type
	// php-memcached writes (8-15); PHP refuses such values too.
	ErrUnknownType = errors.New("phpvalue: unknown value type")
)

// Type is the PHP type of a value: the low 4 bits of the memcached flags.
type Type uint8

// The types php-memcached stores, with their flag values.
const (
	String     Type = 0 // a PHP string, stored as its bytes
	Long       Type = 1 // an int, stored as decimal ASCII
	Double     Type = 2 // a float, as shortest round-trip text without a leading zero: ".1", "-1.5", "1e+100", "-Infinity", "NaN"
	Bool       Type = 3 // a bool: "1" for true, empty for false
	Serialized Type = 4 // an array or object in PHP serialize() format
	Igbinary   Type = 5 // an array or object in igbinary format
	JSON       Type = 6 // an array or object as JSON (SERIALIZER_JSON and SERIALIZER_JSON_ARRAY)
	Msgpack    Type = 7 // an array or object as msgpack
)

// Flag bits, as php-memcached defines them (MEMC_VAL_*).
const (
	typeMask       = 0x0000000F
	flagCompressed = 0x10
	flagZlib       = 0x20
	flagFastLZ     = 0x40
	flagZstd       = 0x80
	userFlagsShift = 16
	prefixLen      = 4 // the uint32 original length before compressed data
)

// Compressed reports whether Decode of a value with these flags
// decompresses it: its cost then depends on the original size, up to
// Decode's maxSize, not on the payload's.
func Compressed(flags uint32) bool { return flags&flagCompressed != 0 }

// Defaults of php-memcached's ini settings, used where EncodeOptions and
// Decode are given zero values.
const (
	// DefaultThreshold is memcached.compression_threshold: values shorter
	// than this are stored uncompressed.
	DefaultThreshold = 2000
	// DefaultFactor is memcached.compression_factor: the compressed form
	// is kept only if the original is more than Factor times longer.
	DefaultFactor = 1.3
	// DefaultMaxSize is the decoded size limit Decode applies when given
	// maxSize <= 0.
	DefaultMaxSize = 64 << 20
)

// fastlzLevel2Min is the input length from which php-memcached's bundled
// fastlz_compress switches from level 1 to level 2.
const fastlzLevel2Min = 65536

// String returns the lowercase name of t ("string", "long", "double",
// "bool", "serialized", "igbinary", "json", "msgpack"), suitable for a
// response header, or "type(N)" for a value outside the known range.
func (t Type) String() string {
	switch t {
	case String:
		return "string"
	case Long:
		return "long"
	case Double:
		return "double"
	case Bool:
		return "bool"
	case Serialized:
		return "serialized"
	case Igbinary:
		return "igbinary"
	case JSON:
		return "json"
	case Msgpack:
		return "msgpack"
	default:
		return "type(" + strconv.Itoa(int(t)) + ")"
	}
}

// ContentType returns the HTTP Content-Type for a body of type t. PHP
// strings are byte strings of unknown encoding, so String (and any unknown
// type) is application/octet-stream; long, double and bool bodies are
// ASCII text.
func (t Type) ContentType() string {
	switch t {
	case Long, Double, Bool:
		return "text/plain; charset=utf-8"
	case Serialized:
		return "application/vnd.php.serialized"
	case Igbinary:
		return "application/x-igbinary"
	case JSON:
		return "application/json"
	case Msgpack:
		return "application/msgpack"
	default:
		return "application/octet-stream"
	}
}

// Value is a decoded php-memcached value.
type Value struct {
	Type Type
	// Body is the payload after decompression, in the type's storage form
	// (see the Type constants). For an uncompressed value it aliases the
	// payload given to Decode.
	Body []byte
	// UserFlags are the upper 16 bits of the flags (OPT_USER_FLAGS).
	UserFlags uint16
}

// Text returns the body as text, spelling a bool as "true" or "false"
// (PHP's test: true when the body starts with '1'). Other types return
// the body unchanged.
func (v Value) Text() string {
	if v.Type == Bool {
		if len(v.Body) > 0 && v.Body[0] == '1' {
			return "true"
		}
		return "false"
	}
	return string(v.Body)
}

// Decode interprets a value php-memcached stored with the given flags. It
// decompresses FastLZ and zlib payloads (FastLZ wins when both bits are
// set, as in PHP) and ignores the compression bits when the compressed bit
// is clear, as PHP does. maxSize bounds len(Body); maxSize <= 0 means
// DefaultMaxSize. The stored length is checked before anything is
// allocated, so a small payload cannot make Decode allocate more than
// maxSize.
//
// Errors wrap ErrCorrupt, ErrUnknownCompression, ErrTooLarge or
// ErrUnknownType. Decode is stricter than PHP about a stored length larger
// than the data: PHP then returns the shorter string for zlib and, for
// FastLZ, a string of the stored length ending in uninitialised memory;
// Decode reports ErrCorrupt for both.
// Decode never panics and is safe for concurrent use.
func Decode(flags uint32, payload []byte, maxSize int) (Value, error) {
	return DecodeHeld(flags, payload, maxSize, nil)
}

// Hold is asked for memory before a decoder allocates a decompressed
// body: n bytes more than it asked for before. An error stops decoding,
// and the decoder returns it wrapped: a caller with a byte budget refuses
// a value that would pass it before it is decompressed, not after.
type Hold func(n int) error

// DecodeHeld is Decode with the decompressed body's memory asked of hold
// (nil: nothing asked): once, for the stored length, before anything is
// decompressed, and the body is then allocated at that length, once. A
// payload of a few kilobytes that claims MaxSize bytes is refused by hold
// before it costs memory or time.
func DecodeHeld(flags uint32, payload []byte, maxSize int, hold Hold) (Value, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	t := Type(flags & typeMask)
	if t > Msgpack {
		return Value{}, fmt.Errorf("%w: %d in flags %#x", ErrUnknownType, t, flags)
	}
	v := Value{Type: t, UserFlags: uint16(flags >> userFlagsShift)}
	if flags&flagCompressed == 0 {
		if len(payload) > maxSize {
			return Value{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(payload), maxSize)
		}
		v.Body = payload
		return v, nil
	}
	body, err := decompress(flags, payload, maxSize, hold)
	if err != nil {
		return Value{}, err
	}
	v.Body = body
	return v, nil
}

// DecodedLen reads, without decompressing anything, what Decode's Value
// for flags and payload would be: its type, and n, the length of its Body
// (for a compressed value, the 4-byte little-endian length prefix
// php-memcached stores before the compressed bytes). ok is false when the
// flags name a type or a compression Decode refuses, or the payload is
// shorter than the prefix. ok does not mean that Decode succeeds: the
// compressed bytes are not read, so data that does not decode to n bytes
// is found only by decoding, and n is not checked against any maxSize.
// It lets a caller that needs the length alone (an HTTP HEAD) answer
// without inflating a value that may decompress to megabytes.
func DecodedLen(flags uint32, payload []byte) (t Type, n int, ok bool) {
	t = Type(flags & typeMask)
	switch {
	case t > Msgpack:
		return t, 0, false
	case flags&flagCompressed == 0:
		return t, len(payload), true
	case flags&(flagFastLZ|flagZlib) == 0, len(payload) < prefixLen:
		return t, 0, false
	}
	stored := binary.LittleEndian.Uint32(payload)
	if uint64(stored) > math.MaxInt {
		return t, 0, false // a 32-bit int cannot hold it; Decode refuses it as too large
	}
	return t, int(stored), true
}

func decompress(flags uint32, payload []byte, maxSize int, hold Hold) ([]byte, error) {
	fastlz := flags&flagFastLZ != 0
	zlibBit := flags&flagZlib != 0
	if !fastlz && !zlibBit {
		if flags&flagZstd != 0 {
			return nil, fmt.Errorf("%w: zstd (flags %#x) is not supported: php-memcached here is built without it", ErrUnknownCompression, flags)
		}
		return nil, fmt.Errorf("%w: compressed flag without a compression type (flags %#x)", ErrUnknownCompression, flags)
	}
	if len(payload) < prefixLen {
		return nil, fmt.Errorf("%w: %d-byte payload is shorter than the length prefix", ErrCorrupt, len(payload))
	}
	stored := binary.LittleEndian.Uint32(payload)
	if uint64(stored) > uint64(maxSize) {
		return nil, fmt.Errorf("%w: stored length %d, limit %d", ErrTooLarge, stored, maxSize)
	}
	data := payload[prefixLen:]
	exact := hold != nil
	if exact {
		if err := hold(int(stored)); err != nil {
			return nil, fmt.Errorf("decompressing %d bytes: %w", stored, err)
		}
	}
	if fastlz {
		return fastlzDecompress(data, int(stored), exact)
	}
	return inflate(data, int(stored), exact)
}

// inflate decodes an RFC 1950 zlib stream (zlib's compress2 output) that
// must expand to exactly want bytes. exact: the body is allocated at want
// bytes at once (its memory is held already); else it grows with what
// the stream produces.
func inflate(data []byte, want int, exact bool) ([]byte, error) {
	r, err := zlib.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: zlib: %w", ErrCorrupt, err)
	}
	defer r.Close()
	if exact {
		buf := make([]byte, want)
		if n, err := io.ReadFull(r, buf); err != nil {
			return nil, fmt.Errorf("%w: zlib data decodes to %d bytes, stored length is %d (%w)", ErrCorrupt, n, want, err)
		}
		// One byte past want tells "too long" from "exactly want", and
		// reading to the end checks the stream's checksum.
		var one [1]byte
		switch _, err := io.ReadFull(r, one[:]); {
		case err == nil:
			return nil, fmt.Errorf("%w: zlib data decodes to more than %d bytes, the stored length", ErrCorrupt, want)
		case err != io.EOF:
			return nil, fmt.Errorf("%w: zlib: %w", ErrCorrupt, err)
		}
		return buf, nil
	}
	var buf bytes.Buffer
	// Grow by what the input can plausibly produce, not by the claim.
	buf.Grow(min(want, 8*len(data)+512))
	// One byte past want tells "too long" from "exactly want".
	if _, err := io.Copy(&buf, io.LimitReader(r, int64(want)+1)); err != nil {
		return nil, fmt.Errorf("%w: zlib: %w", ErrCorrupt, err)
	}
	if buf.Len() != want {
		return nil, fmt.Errorf("%w: zlib data decodes to %s bytes, stored length is %d", ErrCorrupt, lenDesc(buf.Len(), want), want)
	}
	return buf.Bytes(), nil
}

func lenDesc(got, want int) string {
	if got > want {
		return "more than " + strconv.Itoa(want)
	}
	return strconv.Itoa(got)
}

// Compression selects how Encode compresses large values.
type Compression uint8

// Compression choices. The zero value is php-memcached's default, FastLZ.
const (
	CompressFastLZ Compression = iota // FastLZ, level 1 below 65536 bytes and level 2 above
	CompressZlib                      // zlib (RFC 1950) at the default level, like compress2
	CompressNone                      // never compress
)

// EncodeOptions control Encode. The zero value reproduces php-memcached's
// default settings.
type EncodeOptions struct {
	// Threshold is the length from which values are compressed;
	// <= 0 means DefaultThreshold.
	Threshold int
	// Factor: the compressed form is kept only if
	// len(value) > compressed length × Factor; <= 0 (or NaN) means
	// DefaultFactor.
	Factor float64
	// Compression is the algorithm; values other than the constants
	// mean CompressNone.
	Compression Compression
	// UserFlags go into the upper 16 bits of the flags.
	UserFlags uint16
}

func (o EncodeOptions) withDefaults() EncodeOptions {
	if o.Threshold <= 0 {
		o.Threshold = DefaultThreshold
	}
	if !(o.Factor > 0) {
		o.Factor = DefaultFactor
	}
	return o
}

// Encode returns the payload and flags under which php-memcached reads
// value back as the same PHP string, compressing it the way php-memcached
// does with the given options. When the value is stored uncompressed the
// returned payload is value itself, not a copy. Encode is safe for
// concurrent use.
func Encode(value []byte, opt EncodeOptions) (payload []byte, flags uint32) {
	opt = opt.withDefaults()
	flags = uint32(opt.UserFlags)<<userFlagsShift | uint32(String)
	if len(value) < opt.Threshold || uint64(len(value)) > math.MaxUint32 {
		return value, flags
	}
	var packed []byte
	var bit uint32
	switch opt.Compression {
	case CompressFastLZ:
		level := 1
		if len(value) >= fastlzLevel2Min {
			level = 2
		}
		packed = make([]byte, prefixLen, prefixLen+fastlzBound(len(value)))
		packed = fastlzAppend(packed, value, level)
		bit = flagFastLZ
	case CompressZlib:
		var buf bytes.Buffer
		buf.Write(make([]byte, prefixLen))
		w := zlib.NewWriter(&buf) // default level, like compress()
		if _, err := w.Write(value); err != nil {
			return value, flags
		}
		if err := w.Close(); err != nil {
			return value, flags
		}
		packed = buf.Bytes()
		bit = flagZlib
	default:
		return value, flags
	}
	if !(float64(len(value)) > float64(len(packed)-prefixLen)*opt.Factor) {
		return value, flags
	}
	binary.LittleEndian.PutUint32(packed, uint32(len(value)))
	return packed, flags | flagCompressed | bit
}
