package gateway

import (
	"fmt"

	"github.com/memcgate/memcgate/gateway/phpvalue"
	"github.com/memcgate/memcgate/upstream"
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

// typed reports whether c decodes PHP types, and so whether ?flags= are
// 16-bit user flags rather than memcached's 32-bit flags.
func (c ValueCodec) typed() bool { return c == CodecPHP || c == CodecPeclMemcache }

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

// decoded is an item as the client sees it.
type decoded struct {
	body        []byte
	contentType []string
	phpType     string // "" in raw mode
}

// present turns a stored item into what GET serves.
func (h *handler) present(it upstream.Item) (decoded, error) {
	var v phpvalue.Value
	var err error
	maxSize := int(h.opts.MaxValueBytes) * 64
	switch h.opts.Codec {
	case CodecPHP:
		v, err = phpvalue.Decode(it.Flags, it.Value, maxSize)
	case CodecPeclMemcache:
		v, err = phpvalue.DecodeMemcache(it.Flags, it.Value, maxSize)
	default:
		return decoded{body: it.Value, contentType: octetStream}, nil
	}
	if err != nil {
		return decoded{}, &valueError{err}
	}
	d := decoded{body: v.Body, contentType: []string{v.Type.ContentType()}, phpType: v.Type.String()}
	if v.Type == phpvalue.Bool {
		d.body = []byte(v.Text())
	}
	return d, nil
}

// prepare turns a written value into what memcached stores.
func (h *handler) prepare(it *upstream.Item) error {
	switch h.opts.Codec {
	case CodecPHP:
		if it.Flags > 0xffff {
			return badRequest(fmt.Sprintf("flags %d: with MEMCGATE_VALUE_CODEC=php, flags are php-memcached user flags from 0 to 65535", it.Flags))
		}
		opts := h.opts.PHP
		opts.UserFlags = uint16(it.Flags)
		it.Value, it.Flags = phpvalue.Encode(it.Value, opts)
	case CodecPeclMemcache:
		if it.Flags > 0xffff {
			return badRequest(fmt.Sprintf("flags %d: with MEMCGATE_VALUE_CODEC=pecl-memcache, flags are pecl/memcache application flags from 0 to 65535, stored in bits 16-31", it.Flags))
		}
		opts := h.opts.PeclMemcache
		opts.UserFlags = uint16(it.Flags)
		it.Value, it.Flags = phpvalue.EncodeMemcache(it.Value, opts)
	}
	return nil
}

// valueError is a stored value the codec cannot read: memcached answered,
// but with something broken, which makes it a bad gateway answer.
type valueError struct{ err error }

func (e *valueError) Error() string { return "stored value cannot be decoded: " + e.err.Error() }
func (e *valueError) Unwrap() error { return e.err }
