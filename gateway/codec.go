package gateway

import (
	"context"
	"fmt"

	"github.com/memcgate/memcgate/gateway/phpvalue"
	"github.com/memcgate/memcgate/upstream/op"
)

// ValueCodec says how values are stored in memcached.
type ValueCodec string

const (
	// CodecRaw stores request bodies as they are, with the client's flags.
	CodecRaw ValueCodec = "raw"
	// CodecPHP reads and writes values as php-memcached does: GET decodes
	// its type flags and compression, PUT writes strings PHP reads back as
	// the same string (compressed like php-memcached for large values), and
	// ?flags= are php-memcached's 16-bit user flags.
	CodecPHP ValueCodec = "php"
	// CodecPeclMemcache reads and writes values as the older Memcache
	// extension (pecl/memcache) does: GET decodes its serialized, type and
	// zlib-compressed flags, PUT writes strings Memcache::get reads back as
	// the same string (zlib-compressed from its compress_threshold), and
	// ?flags= are 16 application flags stored in bits 16-31.
	CodecPeclMemcache ValueCodec = "pecl-memcache"
)

// PHPOptions configure CodecPHP's writes; the zero value is
// php-memcached's default (FastLZ from 2000 bytes, kept if 1.3× smaller).
type PHPOptions = phpvalue.EncodeOptions

// PeclMemcacheOptions configure CodecPeclMemcache's writes; the zero value
// is pecl/memcache's default (zlib from 20000 bytes, kept if it saves 20%).
type PeclMemcacheOptions = phpvalue.MemcacheOptions

// compressed reports whether reading a value stored with these flags
// decompresses it, so that its cost depends on the decompressed size.
func (c ValueCodec) compressed(flags uint32) bool {
	switch c {
	case CodecPHP:
		return phpvalue.Compressed(flags)
	case CodecPeclMemcache:
		return phpvalue.MemcacheCompressed(flags)
	}
	return false
}

// codec reads and writes values as Options.Codec says.
type codec struct {
	kind       ValueCodec
	php        PHPOptions
	pecl       PeclMemcacheOptions
	maxDecoded int // the most a decompressed value may grow to: 64 × Options.MaxValueBytes
	// turns are taken to compress or decompress a large value (nil:
	// none are): the handler's, shared with its batches' decoding.
	turns cpuTurns
}

// octetStream is the Content-Type of every value; net/http never modifies
// header values, so the slice is shared read-only.
var octetStream = []string{"application/octet-stream"}

// decoded is an item as the client sees it.
type decoded struct {
	body        []byte
	contentType []string
	phpType     string // "" in raw mode
}

// present turns a stored item into what GET serves. A compressed value's
// body is held through hold before it is decompressed (phpvalue.Hold): a
// value a few kilobytes long that inflates to maxDecoded is refused
// first, with hold's error as it is, not after it is in memory. Once what
// it inflates to reaches turnBytes it is decompressed with a turn
// (cpuTurns) waited for within ctx: a value of 1 MB of one letter, 1 KB
// stored, costs milliseconds to inflate, however little of it a Range
// or HEAD sends. hold may be nil only for an item without a value (its
// flags alone).
func (c *codec) present(ctx context.Context, it op.Item, hold phpvalue.Hold) (decoded, error) {
	var v phpvalue.Value
	var err, refused error
	asked, took := 0, false
	defer func() {
		if took {
			c.turns.done()
		}
	}()
	held := func(n int) error {
		// The turn first: waiting for it holds no more of the budget
		// than the request held already.
		if asked += n; !took {
			if took, refused = c.turns.take(ctx, asked, "decompress a value of"); refused != nil {
				return refused
			}
		}
		refused = hold(n)
		return refused
	}
	switch c.kind {
	case CodecPHP:
		v, err = phpvalue.DecodeHeld(it.Flags, it.Value, c.maxDecoded, held)
	case CodecPeclMemcache:
		v, err = phpvalue.DecodeMemcacheHeld(it.Flags, it.Value, c.maxDecoded, held)
	default:
		return decoded{body: it.Value, contentType: octetStream}, nil
	}
	switch {
	case refused != nil:
		return decoded{}, refused
	case err != nil:
		return decoded{}, &valueError{err}
	}
	d := decoded{body: v.Body, contentType: []string{v.Type.ContentType()}, phpType: v.Type.String()}
	if v.Type == phpvalue.Bool {
		d.body = []byte(v.Text())
	}
	return d, nil
}

// presentSize is present for an item known by its flags and its value's
// size alone (op.Head): ok is false when what GET would serve depends on
// the value's bytes, which must then be read: a compressed value (its
// size is the decompressed one's), a boolean (served as its text), a
// value past maxDecoded (an error), or flags the codec refuses.
func (c *codec) presentSize(flags uint32, size uint64) (d decoded, ok bool) {
	switch c.kind {
	case CodecPHP, CodecPeclMemcache:
		if c.kind.compressed(flags) || size > uint64(c.maxDecoded) {
			return decoded{}, false
		}
	default:
		return decoded{contentType: octetStream}, true
	}
	d, err := c.present(context.Background(), op.Item{Flags: flags}, nil)
	if err != nil || d.phpType == phpvalue.Bool.String() {
		return decoded{}, false
	}
	d.body = nil
	return d, true
}

// presentHead is present for a HEAD of an item read whole, without
// decompressing it: the headers of a php-memcached compressed value, and
// n, its decompressed length, from the length prefix stored before the
// compressed bytes (phpvalue.DecodedLen). ok is false for every other
// item and for one whose GET answers an error or a body the prefix does
// not tell: a boolean (served as its text), a prefix past maxDecoded
// (GET refuses it), or past the byte budget's limit, budget (GET can never
// hold it; 0: no limit); present then answers as GET does. The compressed
// bytes are not checked: data that does not decode to n bytes is a 502
// for GET and a 200 for HEAD. A pecl/memcache compressed value records no
// length, so its HEAD inflates it (under the budget, as GET does).
func (c *codec) presentHead(it op.Item, budget int64) (d decoded, n int, ok bool) {
	if c.kind != CodecPHP || !phpvalue.Compressed(it.Flags) {
		return decoded{}, 0, false
	}
	t, n, ok := phpvalue.DecodedLen(it.Flags, it.Value)
	if !ok || t == phpvalue.Bool || n > c.maxDecoded || (budget > 0 && int64(n) > budget) {
		return decoded{}, 0, false
	}
	return decoded{contentType: []string{t.ContentType()}, phpType: t.String()}, n, true
}

// codecWrites reports whether the codec encodes the value of verb v: the
// writes of a whole value (append and prepend add raw bytes to what is
// stored).
func codecWrites(v op.Verb) bool { return v == op.Set || v == op.Add || v == op.Replace || v == op.CAS }

// check refuses now an item prepare would refuse, for a write that is
// applied later: the typed codecs take 16-bit user flags.
func (c *codec) check(it *op.Item) error {
	if it.Flags <= 0xffff {
		return nil
	}
	switch c.kind {
	case CodecPHP:
		return badRequest(fmt.Sprintf("flags %d: with MEMCGATE_VALUE_CODEC=php, flags are php-memcached user flags from 0 to 65535", it.Flags))
	case CodecPeclMemcache:
		return badRequest(fmt.Sprintf("flags %d: with MEMCGATE_VALUE_CODEC=pecl-memcache, flags are pecl/memcache application flags from 0 to 65535, stored in bits 16-31", it.Flags))
	}
	return nil
}

// prepare turns a written value into what memcached stores. A value the
// codec compresses is compressed with a turn (cpuTurns) when it is large,
// waited for within ctx.
func (c *codec) prepare(ctx context.Context, it *op.Item) error {
	if err := c.check(it); err != nil {
		return err
	}
	if c.compresses(len(it.Value)) {
		took, err := c.turns.take(ctx, len(it.Value), "compress a value of")
		if err != nil {
			return err
		}
		if took {
			defer c.turns.done()
		}
	}
	switch c.kind {
	case CodecPHP:
		opts := c.php
		opts.UserFlags = uint16(it.Flags)
		it.Value, it.Flags = phpvalue.Encode(it.Value, opts)
	case CodecPeclMemcache:
		opts := c.pecl
		opts.UserFlags = uint16(it.Flags)
		it.Value, it.Flags = phpvalue.EncodeMemcache(it.Value, opts)
	}
	return nil
}

// compresses reports whether prepare tries to compress a value of n
// bytes, as phpvalue's encoders decide it (their thresholds).
func (c *codec) compresses(n int) bool {
	switch c.kind {
	case CodecPHP:
		t := c.php.Threshold
		if t <= 0 {
			t = phpvalue.DefaultThreshold
		}
		return (c.php.Compression == phpvalue.CompressFastLZ || c.php.Compression == phpvalue.CompressZlib) && n >= t
	case CodecPeclMemcache:
		t := c.pecl.Threshold
		if t == 0 {
			t = phpvalue.DefaultMemcacheThreshold
		}
		return t > 0 && n >= t
	}
	return false
}

// chunkFlags are the flags a value written in chunks is stored with (in
// its index), for a write's ?flags=: those of the same value stored whole
// and uncompressed. Chunks are never compressed, so that they can be
// streamed as they are.
func (c *codec) chunkFlags(flags uint32) (uint32, error) {
	if err := c.check(&op.Item{Flags: flags}); err != nil {
		return 0, err
	}
	switch c.kind {
	case CodecPHP:
		opts := c.php
		opts.Compression, opts.UserFlags = phpvalue.CompressNone, uint16(flags)
		_, flags = phpvalue.Encode(nil, opts)
	case CodecPeclMemcache:
		opts := c.pecl
		opts.Threshold, opts.UserFlags = -1, uint16(flags)
		_, flags = phpvalue.EncodeMemcache(nil, opts)
	}
	return flags, nil
}

// presentChunked is how GET serves a value stored in chunks with these
// flags: its bytes as they are, with the content type and PHP type the
// flags give. Flags that say compressed cannot be served so.
func (c *codec) presentChunked(flags uint32) (decoded, error) {
	if c.kind.compressed(flags) {
		return decoded{}, &valueError{fmt.Errorf("flags %#x say compressed, but values in chunks are stored uncompressed", flags)}
	}
	d, err := c.present(context.Background(), op.Item{Flags: flags}, nil)
	d.body = nil
	return d, err
}
