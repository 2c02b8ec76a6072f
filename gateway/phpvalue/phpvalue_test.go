package phpvalue

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
)

// prefixed returns the 4-byte little-endian n followed by data.
func prefixed[N int | uint32](n N, data []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(nil, uint32(n)), data...)
}

func fastlzPayload(b []byte, level int) []byte {
	return prefixed(len(b), fastlzAppend(nil, b, level))
}

func zlibData(b []byte) []byte {
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func zlibPayload(b []byte) []byte { return prefixed(len(b), zlibData(b)) }

func TestTypeNames(t *testing.T) {
	tests := []struct {
		t           Type
		name, ctype string
	}{
		{String, "string", "application/octet-stream"},
		{Long, "long", "text/plain; charset=utf-8"},
		{Double, "double", "text/plain; charset=utf-8"},
		{Bool, "bool", "text/plain; charset=utf-8"},
		{Serialized, "serialized", "application/vnd.php.serialized"},
		{Igbinary, "igbinary", "application/x-igbinary"},
		{JSON, "json", "application/json"},
		{Msgpack, "msgpack", "application/msgpack"},
		{Type(9), "type(9)", "application/octet-stream"},
	}
	for _, tt := range tests {
		if got := tt.t.String(); got != tt.name {
			t.Errorf("Type(%d).String() = %q, want %q", tt.t, got, tt.name)
		}
		if got := tt.t.ContentType(); got != tt.ctype {
			t.Errorf("Type(%d).ContentType() = %q, want %q", tt.t, got, tt.ctype)
		}
	}
}

func TestDecodeAllFlagCombinations(t *testing.T) {
	body := []byte(strings.Repeat("php-memcached value, ", 200))
	encodings := []struct {
		name    string
		flags   uint32
		payload []byte
	}{
		{"plain", 0, body},
		{"fastlz level 1", flagCompressed | flagFastLZ, fastlzPayload(body, 1)},
		{"fastlz level 2", flagCompressed | flagFastLZ, fastlzPayload(body, 2)},
		{"zlib", flagCompressed | flagZlib, zlibPayload(body)},
		// PHP tries FastLZ first when both bits are set.
		{"fastlz and zlib bits", flagCompressed | flagFastLZ | flagZlib, fastlzPayload(body, 1)},
		// This php-memcached has no zstd and ignores the bit next to a known one.
		{"zlib and zstd bits", flagCompressed | flagZlib | flagZstd, zlibPayload(body)},
		// Without the compressed bit the type bits mean nothing.
		{"type bits without compressed", flagZlib | flagFastLZ | flagZstd, body},
		{"unused internal bits", 0xff00, body},
	}
	for typ := String; typ <= Msgpack; typ++ {
		for _, enc := range encodings {
			for _, uf := range []uint16{0, 1, 1234, 0xffff} {
				flags := uint32(typ) | enc.flags | uint32(uf)<<16
				t.Run(fmt.Sprintf("%s/%s/uf%d", typ, enc.name, uf), func(t *testing.T) {
					v, err := Decode(flags, enc.payload, 0)
					if err != nil {
						t.Fatalf("Decode(%#x) error: %v", flags, err)
					}
					if v.Type != typ || v.UserFlags != uf || !bytes.Equal(v.Body, body) {
						t.Errorf("Decode(%#x) = {%v, %d bytes, uf %d}, want {%v, %d bytes, uf %d}",
							flags, v.Type, len(v.Body), v.UserFlags, typ, len(body), uf)
					}
				})
			}
		}
	}
}

func TestDecodeScalars(t *testing.T) {
	tests := []struct {
		name     string
		flags    uint32
		payload  string
		wantType Type
		wantText string
	}{
		{"empty string", 0, "", String, ""},
		{"long", 1, "42", Long, "42"},
		{"negative long", 1, "-9223372036854775808", Long, "-9223372036854775808"},
		{"double", 2, ".1", Double, ".1"},
		{"double infinity", 2, "-Infinity", Double, "-Infinity"},
		{"true", 3, "1", Bool, "true"},
		{"false", 3, "", Bool, "false"},
		{"bool other", 3, "2", Bool, "false"},
		{"serialized", 4, `a:1:{s:1:"a";i:1;}`, Serialized, `a:1:{s:1:"a";i:1;}`},
		{"json", 6, `{"a":1}`, JSON, `{"a":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Decode(tt.flags, []byte(tt.payload), 100)
			if err != nil {
				t.Fatalf("Decode(%d, %q) error: %v", tt.flags, tt.payload, err)
			}
			if v.Type != tt.wantType || v.Text() != tt.wantText || string(v.Body) != tt.payload {
				t.Errorf("Decode(%d, %q) = %v %q (text %q), want %v %q (text %q)",
					tt.flags, tt.payload, v.Type, v.Body, v.Text(), tt.wantType, tt.payload, tt.wantText)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	body := []byte(strings.Repeat("abcdefghij", 300))
	fl := uint32(flagCompressed | flagFastLZ)
	zl := uint32(flagCompressed | flagZlib)
	flz := fastlzAppend(nil, body, 1)
	zd := zlibData(body)
	garbage := []byte("this is not compressed data at all, not at all")
	tests := []struct {
		name    string
		flags   uint32
		payload []byte
		maxSize int
		want    error
	}{
		{"fastlz empty payload", fl, nil, 0, ErrCorrupt},
		{"fastlz 3-byte prefix", fl, []byte{1, 2, 3}, 0, ErrCorrupt},
		{"zlib 1-byte prefix", zl, []byte{1}, 0, ErrCorrupt},
		{"fastlz prefix only", fl, prefixed(len(body), nil), 0, ErrCorrupt},
		{"zlib prefix only", zl, prefixed(len(body), nil), 0, ErrCorrupt},
		{"fastlz stored length too big", fl, prefixed(len(body)+10, flz), 0, ErrCorrupt},
		{"fastlz stored length too small", fl, prefixed(len(body)-10, flz), 0, ErrCorrupt},
		{"zlib stored length too big", zl, prefixed(len(body)+10, zd), 0, ErrCorrupt},
		{"zlib stored length too small", zl, prefixed(len(body)-10, zd), 0, ErrCorrupt},
		{"fastlz truncated data", fl, prefixed(len(body), flz[:len(flz)-3]), 0, ErrCorrupt},
		{"zlib truncated data", zl, prefixed(len(body), zd[:len(zd)-6]), 0, ErrCorrupt},
		{"zlib bad checksum", zl, prefixed(len(body), append(zd[:len(zd)-1:len(zd)-1], zd[len(zd)-1]^1)), 0, ErrCorrupt},
		{"fastlz garbage", fl, prefixed(len(body), garbage), 0, ErrCorrupt},
		{"zlib garbage", zl, prefixed(len(body), garbage), 0, ErrCorrupt},
		{"zlib data under fastlz bit", fl | flagZlib, zlibPayload(body), 0, ErrCorrupt},
		{"compressed without type (old HHVM)", flagCompressed, zlibPayload(body), 0, ErrUnknownCompression},
		{"compressed without type, short payload", flagCompressed, nil, 0, ErrUnknownCompression},
		{"zstd", flagCompressed | flagZstd, prefixed(3, []byte{0x28, 0xb5, 0x2f, 0xfd}), 0, ErrUnknownCompression},
		{"fastlz stored length over limit", fl, fastlzPayload(body, 1), len(body) - 1, ErrTooLarge},
		{"zlib stored length over limit", zl, zlibPayload(body), len(body) - 1, ErrTooLarge},
		{"stored length 4 GiB - 1", fl, prefixed(uint32(math.MaxUint32), flz), 0, ErrTooLarge},
		{"plain over limit", 0, body, len(body) - 1, ErrTooLarge},
		{"type 8", 8, body, 0, ErrUnknownType},
		{"type 15 compressed", 15 | fl, fastlzPayload(body, 1), 0, ErrUnknownType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Decode(tt.flags, tt.payload, tt.maxSize)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decode(%#x, %d bytes, %d) = %d bytes, %v; want %v", tt.flags, len(tt.payload), tt.maxSize, len(v.Body), err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "phpvalue: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestDecodeZstdErrorNamesZstd(t *testing.T) {
	_, err := Decode(flagCompressed|flagZstd, prefixed(1, []byte{0}), 0)
	if !errors.Is(err, ErrUnknownCompression) || !strings.Contains(err.Error(), "zstd") {
		t.Errorf("Decode(zstd) error = %v, want ErrUnknownCompression naming zstd", err)
	}
}

func TestDecodeLimitIsInclusive(t *testing.T) {
	body := []byte(strings.Repeat("x", 5000))
	for _, p := range [][]byte{fastlzPayload(body, 1), zlibPayload(body)} {
		flags := uint32(flagCompressed | flagFastLZ)
		if p[4] == 0x78 {
			flags = flagCompressed | flagZlib
		}
		if _, err := Decode(flags, p, len(body)); err != nil {
			t.Errorf("Decode(%#x, maxSize = len) error: %v", flags, err)
		}
	}
}

func TestEncode(t *testing.T) {
	text := func(n int) []byte { return testData("text", n, 1) }
	random := testData("random", 10_000, 1)
	tests := []struct {
		name      string
		value     []byte
		opt       EncodeOptions
		wantFlags uint32
		wantLevel int // FastLZ level marker, 0 when not FastLZ
	}{
		{"empty", nil, EncodeOptions{}, 0, 0},
		{"small", []byte("hello"), EncodeOptions{}, 0, 0},
		{"below threshold", text(1999), EncodeOptions{}, 0, 0},
		{"at threshold", text(2000), EncodeOptions{}, 0x50, 1},
		{"10 KB text", text(10_000), EncodeOptions{}, 0x50, 1},
		{"65535 bytes", text(65535), EncodeOptions{}, 0x50, 1},
		{"65536 bytes", text(65536), EncodeOptions{}, 0x50, 2},
		{"300 KB", testData("blocks", 300*1024, 1), EncodeOptions{}, 0x50, 2},
		{"incompressible", random, EncodeOptions{}, 0, 0},
		{"incompressible zlib", random, EncodeOptions{Compression: CompressZlib}, 0, 0},
		{"zlib", text(10_000), EncodeOptions{Compression: CompressZlib}, 0x30, 0},
		{"none", text(10_000), EncodeOptions{Compression: CompressNone}, 0, 0},
		{"unknown compression", text(10_000), EncodeOptions{Compression: 9}, 0, 0},
		{"custom threshold", bytes.Repeat([]byte("abc"), 40), EncodeOptions{Threshold: 50}, 0x50, 1},
		{"custom threshold not reached", text(3000), EncodeOptions{Threshold: 5000}, 0, 0},
		{"factor too demanding", text(10_000), EncodeOptions{Factor: 100}, 0, 0},
		{"factor NaN means default", text(10_000), EncodeOptions{Factor: math.NaN()}, 0x50, 1},
		{"user flags", []byte("x"), EncodeOptions{UserFlags: 1234}, 1234 << 16, 0},
		{"user flags compressed", text(10_000), EncodeOptions{UserFlags: 0xffff}, 0xffff0050, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload, flags := Encode(tt.value, tt.opt)
			if flags != tt.wantFlags {
				t.Errorf("Encode(%d bytes, %+v) flags = %#x, want %#x", len(tt.value), tt.opt, flags, tt.wantFlags)
			}
			if flags&flagCompressed == 0 && !bytes.Equal(payload, tt.value) {
				t.Errorf("Encode(%d bytes) uncompressed payload differs from the value", len(tt.value))
			}
			if flags&flagCompressed != 0 {
				if n := binary.LittleEndian.Uint32(payload); int(n) != len(tt.value) {
					t.Errorf("Encode(%d bytes) length prefix = %d", len(tt.value), n)
				}
				if ratio := float64(len(tt.value)) / float64(len(payload)-4); ratio <= DefaultFactor {
					t.Errorf("Encode(%d bytes) kept a compression ratio of %.2f", len(tt.value), ratio)
				}
			}
			if tt.wantLevel != 0 {
				if got := int(payload[4]>>5) + 1; got != tt.wantLevel {
					t.Errorf("Encode(%d bytes) FastLZ level = %d, want %d", len(tt.value), got, tt.wantLevel)
				}
			}
			if flags&flagZlib != 0 && (payload[4] != 0x78 || payload[5] != 0x9c) {
				t.Errorf("Encode zlib header = %x, want 789c (default level, as compress2)", payload[4:6])
			}
			v, err := Decode(flags, payload, 0)
			if err != nil {
				t.Fatalf("Decode(Encode(%d bytes)) error: %v", len(tt.value), err)
			}
			if v.Type != String || v.UserFlags != tt.opt.UserFlags || !bytes.Equal(v.Body, tt.value) {
				t.Errorf("Decode(Encode(%d bytes)) = {%v, %d bytes, uf %d}, want the value back", len(tt.value), v.Type, len(v.Body), v.UserFlags)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	body := testData("mixed", 2500, 1)
	f.Add(uint32(0), []byte("hello"), 100)
	f.Add(uint32(3), []byte(""), 0)
	f.Add(uint32(flagCompressed|flagFastLZ), fastlzPayload(body, 1), 5000)
	f.Add(uint32(flagCompressed|flagFastLZ|4), fastlzPayload(body, 2), 4000)
	f.Add(uint32(flagCompressed|flagZlib), zlibPayload(body), 10000)
	f.Add(uint32(flagCompressed|flagZlib), zlibPayload(body), 100)
	f.Add(uint32(flagCompressed), []byte{1, 2, 3, 4, 5}, 10)
	f.Add(uint32(flagCompressed|flagFastLZ), []byte{0xff, 0xff, 0xff, 0xff, 0x20, 'a', 0xe0, 0xff, 0xff}, 1<<20)
	f.Fuzz(func(t *testing.T, flags uint32, payload []byte, maxSize int) {
		maxSize %= 1 << 20 // keep the fuzzer from asking for huge outputs
		v, err := Decode(flags, payload, maxSize)
		// Held, the same answer, byte for byte.
		hv, herr := DecodeHeld(flags, payload, maxSize, func(int) error { return nil })
		if (err == nil) != (herr == nil) || !bytes.Equal(v.Body, hv.Body) || v.Type != hv.Type {
			t.Fatalf("Decode = %d bytes, %v; DecodeHeld = %d bytes, %v", len(v.Body), err, len(hv.Body), herr)
		}
		limit := maxSize
		if limit <= 0 {
			limit = DefaultMaxSize
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownCompression) &&
				!errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrUnknownType) {
				t.Fatalf("Decode error %v wraps no package error", err)
			}
			return
		}
		if len(v.Body) > limit {
			t.Fatalf("Decode returned %d bytes, limit %d", len(v.Body), limit)
		}
		if v.Type > Msgpack || v.UserFlags != uint16(flags>>16) {
			t.Fatalf("Decode(%#x) = type %d, user flags %d", flags, v.Type, v.UserFlags)
		}
		if flags&flagCompressed != 0 && len(v.Body) != int(binary.LittleEndian.Uint32(payload)) {
			t.Fatalf("Decode(%#x) body %d bytes, stored length %d", flags, len(v.Body), binary.LittleEndian.Uint32(payload))
		}
	})
}

// TestDecodeHeld: DecodeHeld asks hold for the stored length once, before
// anything is decompressed, and answers as Decode does; a refusal is
// returned wrapped, with nothing decompressed.
func TestDecodeHeld(t *testing.T) {
	body := bytes.Repeat([]byte("held "), 20000)
	refused := errors.New("no room")
	for _, tt := range []struct {
		name    string
		payload []byte
		flags   uint32
	}{
		{"fastlz", fastlzPayload(body, 2), 0x50},
		{"zlib", zlibPayload(body), 0x30},
		{"zlib exactly", zlibPayload(nil), 0x30},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want, err := Decode(tt.flags, tt.payload, 0)
			if err != nil {
				t.Fatal(err)
			}
			var asked []int
			got, err := DecodeHeld(tt.flags, tt.payload, 0, func(n int) error { asked = append(asked, n); return nil })
			if err != nil || !bytes.Equal(got.Body, want.Body) || len(asked) != 1 || asked[0] != len(want.Body) {
				t.Fatalf("DecodeHeld = %d bytes, %v, held %v; want %d bytes, held once for them", len(got.Body), err, asked, len(want.Body))
			}
			if cap(got.Body) != len(got.Body) {
				t.Errorf("body of %d bytes in a buffer of %d: want it allocated at its length", len(got.Body), cap(got.Body))
			}
			if _, err := DecodeHeld(tt.flags, tt.payload, 0, func(int) error { return refused }); !errors.Is(err, refused) {
				t.Errorf("refused: %v, want the refusal", err)
			}
		})
	}
	// A stored length the data does not match is still corrupt.
	for _, p := range [][]byte{prefixed(len(body)+1, zlibData(body)), prefixed(len(body)-1, zlibData(body))} {
		if _, err := DecodeHeld(0x30, p, 0, func(int) error { return nil }); !errors.Is(err, ErrCorrupt) {
			t.Errorf("stored length %d for %d bytes: %v, want ErrCorrupt", binary.LittleEndian.Uint32(p), len(body), err)
		}
	}
}

// TestDecodedLen: where DecodedLen answers ok, its type and length are
// those of Decode's Value for the same value, read from the prefix alone;
// where it does not, Decode refuses the value too. A prefix its data does
// not decode to is ok for DecodedLen (it reads no data) and an error for
// Decode.
func TestDecodedLen(t *testing.T) {
	body := bytes.Repeat([]byte{0}, 1<<20)
	fl := uint32(flagCompressed | flagFastLZ)
	zl := uint32(flagCompressed | flagZlib)
	tests := []struct {
		name       string
		flags      uint32
		payload    []byte
		wantType   Type
		wantN      int
		wantOK     bool
		decodeFail bool // DecodedLen reads the prefix only; Decode finds the data wrong
	}{
		{"plain string", 0, []byte("hello"), String, 5, true, false},
		{"plain long with user flags", 7<<16 | uint32(Long), []byte("42"), Long, 2, true, false},
		{"empty", 0, nil, String, 0, true, false},
		{"fastlz level 2", fl, fastlzPayload(body, 2), String, len(body), true, false},
		{"fastlz level 1 serialized", fl | uint32(Serialized), fastlzPayload(body[:5000], 1), Serialized, 5000, true, false},
		{"zlib json", zl | uint32(JSON), zlibPayload(body), JSON, len(body), true, false},
		{"both bits", fl | flagZlib, fastlzPayload(body, 2), String, len(body), true, false},
		{"compression bits without the compressed bit", flagFastLZ | flagZlib, []byte("abc"), String, 3, true, false},
		{"prefix past the data", fl, prefixed(len(body)+1, fastlzAppend(nil, body, 2)), String, len(body) + 1, true, true},
		// On a 32-bit platform an int cannot hold the length: not ok.
		{"prefix 4 GiB - 1", fl, prefixed(uint32(math.MaxUint32), nil), String, math.MaxUint32 & math.MaxInt, math.MaxInt >= math.MaxUint32, true},
		{"short prefix", fl, []byte{1, 2, 3}, String, 0, false, true},
		{"no compression type", flagCompressed, zlibPayload(body), String, 0, false, true},
		{"zstd", flagCompressed | flagZstd, prefixed(3, []byte{0x28, 0xb5, 0x2f, 0xfd}), String, 0, false, true},
		{"type 9", 9, []byte("x"), 9, 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ, n, ok := DecodedLen(tt.flags, tt.payload)
			if ok != tt.wantOK || typ != tt.wantType || (ok && n != tt.wantN) {
				t.Fatalf("DecodedLen(%#x, %d bytes) = %v, %d, %v; want %v, %d, %v", tt.flags, len(tt.payload), typ, n, ok, tt.wantType, tt.wantN, tt.wantOK)
			}
			v, err := Decode(tt.flags, tt.payload, 0)
			switch {
			case tt.decodeFail && err == nil:
				t.Errorf("Decode = %d bytes, want an error", len(v.Body))
			case !tt.decodeFail && err != nil:
				t.Errorf("Decode: %v", err)
			case !tt.decodeFail && (v.Type != typ || len(v.Body) != n):
				t.Errorf("Decode = %v, %d bytes; DecodedLen said %v, %d", v.Type, len(v.Body), typ, n)
			}
		})
	}
}

// TestZlibErrorsWrapTheCause: a zlib stream that does not inflate is
// ErrCorrupt, and zlib's own error stays in the chain, in the exact
// (DecodeHeld) and growing (Decode) reads of php-memcached values and in
// pecl/memcache's (DecodeMemcache).
func TestZlibErrorsWrapTheCause(t *testing.T) {
	body := []byte(strings.Repeat("abcdefghij", 300))
	zd := zlibData(body)
	badSum := append(zd[:len(zd)-1:len(zd)-1], zd[len(zd)-1]^1)
	garbage := []byte("this is not compressed data at all, not at all")
	zl := uint32(flagCompressed | flagZlib)
	held := func(flags uint32, p []byte, max int) (Value, error) {
		return DecodeHeld(flags, p, max, func(int) error { return nil })
	}
	decoders := []struct {
		name    string
		decode  func(flags uint32, p []byte, max int) (Value, error)
		flags   uint32
		payload func(zlib []byte) []byte
	}{
		{"Decode", Decode, zl, func(z []byte) []byte { return prefixed(len(body), z) }},
		{"DecodeHeld", held, zl, func(z []byte) []byte { return prefixed(len(body), z) }},
		{"DecodeMemcache", DecodeMemcache, 0x2, func(z []byte) []byte { return z }},
	}
	streams := []struct {
		name  string
		zlib  []byte
		cause error
	}{
		{"garbage", garbage, zlib.ErrHeader},
		{"bad checksum", badSum, zlib.ErrChecksum},
		{"truncated", zd[:len(zd)-6], io.ErrUnexpectedEOF},
	}
	for _, d := range decoders {
		for _, s := range streams {
			t.Run(d.name+"/"+s.name, func(t *testing.T) {
				_, err := d.decode(d.flags, d.payload(s.zlib), 0)
				if !errors.Is(err, ErrCorrupt) || !errors.Is(err, s.cause) {
					t.Errorf("%s(%s) = %v; want ErrCorrupt wrapping %v", d.name, s.name, err, s.cause)
				}
			})
		}
	}
	// A whole stream shorter than its stored length, read exactly.
	if _, err := held(zl, prefixed(len(body)+10, zd), 0); !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("DecodeHeld(stored length past the stream) = %v; want ErrCorrupt wrapping %v", err, io.ErrUnexpectedEOF)
	}
}
