package phpvalue

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"
)

func TestDecodeMemcacheTypes(t *testing.T) {
	tests := []struct {
		name     string
		flags    uint32
		payload  string
		wantType Type
		wantBody string
		wantText string
	}{
		{"string", 0, "héllo", String, "héllo", "héllo"},
		{"empty string", 0, "", String, "", ""},
		{"long", 0x300, "42", Long, "42", "42"},
		{"negative long", 0x300, "-7", Long, "-7", "-7"},
		{"double", 0x700, "0.1", Double, "0.1", "0.1"},
		{"double exponent", 0x700, "1.0e+100", Double, "1.0e+100", "1.0e+100"},
		{"double -INF", 0x700, "-INF", Double, "-INF", "-INF"},
		{"true", 0x100, "1", Bool, "1", "true"},
		{"false", 0x100, "0", Bool, "", "false"},
		// PHP: true only for the one-byte body "1".
		{"bool 10", 0x100, "10", Bool, "", "false"},
		{"bool empty", 0x100, "", Bool, "", "false"},
		{"serialized array", 0x1, `a:1:{s:1:"a";i:1;}`, Serialized, `a:1:{s:1:"a";i:1;}`, `a:1:{s:1:"a";i:1;}`},
		{"serialized null", 0x1, "N;", Serialized, "N;", "N;"},
		// SERIALIZED wins over the type byte, as in mmc_unpack_value.
		{"serialized with long type", 0x301, "i:5;", Serialized, "i:5;", "i:5;"},
		// Unused type values and low-byte bits read as strings.
		{"type 0x0200", 0x200, "x", String, "x", "x"},
		{"type 0x0f00", 0xf00, "x", String, "x", "x"},
		{"high type bits ignored", 0xf000 | 0x300, "9", Long, "9", "9"},
		{"unused low bits", 0xfc, "x", String, "x", "x"},
		{"user flags", 0xabcd0000 | 0x300, "1", Long, "1", "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := DecodeMemcache(tt.flags, []byte(tt.payload), 100)
			if err != nil {
				t.Fatalf("DecodeMemcache(%#x, %q) error: %v", tt.flags, tt.payload, err)
			}
			if v.Type != tt.wantType || string(v.Body) != tt.wantBody || v.Text() != tt.wantText || v.UserFlags != uint16(tt.flags>>16) {
				t.Errorf("DecodeMemcache(%#x, %q) = %v %q (text %q, uf %d), want %v %q (text %q, uf %d)",
					tt.flags, tt.payload, v.Type, v.Body, v.Text(), v.UserFlags, tt.wantType, tt.wantBody, tt.wantText, tt.flags>>16)
			}
		})
	}
}

func TestDecodeMemcacheCompressed(t *testing.T) {
	body := []byte(strings.Repeat("pecl/memcache value, ", 300))
	for _, flags := range []uint32{0x2, 0x3, 0x302, 0x702, 0x102, 0x10002, 0xffff0003} {
		for _, payload := range [][]byte{zlibData(body), zlibLevel(body, zlib.BestSpeed), zlibLevel(body, zlib.NoCompression)} {
			v, err := DecodeMemcache(flags, payload, 0)
			if err != nil {
				t.Fatalf("DecodeMemcache(%#x, %d bytes) error: %v", flags, len(payload), err)
			}
			want := body
			if v.Type == Bool {
				want = nil // not "1": false
			}
			if v.Type != memcacheType(flags) || !bytes.Equal(v.Body, want) {
				t.Errorf("DecodeMemcache(%#x) = %v, %d bytes; want %v, %d bytes", flags, v.Type, len(v.Body), memcacheType(flags), len(want))
			}
		}
	}
	// A compressed "1" is still true.
	if v, err := DecodeMemcache(0x102, zlibData([]byte("1")), 0); err != nil || v.Text() != "true" {
		t.Errorf("DecodeMemcache(compressed true) = %q, %v; want true", v.Text(), err)
	}
}

func zlibLevel(b []byte, level int) []byte {
	var buf bytes.Buffer
	w, _ := zlib.NewWriterLevel(&buf, level)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func TestDecodeMemcacheErrors(t *testing.T) {
	body := []byte(strings.Repeat("abcdefghij", 300))
	zd := zlibData(body)
	tests := []struct {
		name    string
		flags   uint32
		payload []byte
		maxSize int
		want    error
	}{
		{"empty compressed", 0x2, nil, 0, ErrCorrupt},
		{"garbage", 0x2, []byte("not zlib at all, not at all"), 0, ErrCorrupt},
		{"truncated", 0x2, zd[:len(zd)-6], 0, ErrCorrupt},
		{"bad checksum", 0x2, append(zd[:len(zd)-1:len(zd)-1], zd[len(zd)-1]^1), 0, ErrCorrupt},
		// php-memcached's layout: a 4-byte length before the stream.
		{"php-memcached zlib payload", 0x2, zlibPayload(body), 0, ErrCorrupt},
		{"inflates past the limit", 0x2, zd, len(body) - 1, ErrTooLarge},
		{"plain past the limit", 0, body, len(body) - 1, ErrTooLarge},
		{"serialized past the limit", 0x1, body, 10, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := DecodeMemcache(tt.flags, tt.payload, tt.maxSize)
			if !errors.Is(err, tt.want) {
				t.Fatalf("DecodeMemcache(%#x, %d bytes, %d) = %d bytes, %v; want %v", tt.flags, len(tt.payload), tt.maxSize, len(v.Body), err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "phpvalue: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
	if _, err := DecodeMemcache(0x2, zd, len(body)); err != nil {
		t.Errorf("DecodeMemcache(maxSize = inflated length) error: %v; the limit is inclusive", err)
	}
}

// TestDecodeMemcacheBomb: a zlib stream of about 100 KB that inflates
// to 100 MB stops at the limit, without inflating (or allocating) the
// rest.
func TestDecodeMemcacheBomb(t *testing.T) {
	bomb := zeroBomb(t, 100)
	const limit = 1 << 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := DecodeMemcache(0x2, bomb, limit)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("DecodeMemcache(%d-byte bomb, limit %d) error = %v, want ErrTooLarge", len(bomb), limit, err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 8*limit {
		t.Errorf("DecodeMemcache of the bomb allocated %d bytes, want at most a few times the %d limit", grown, limit)
	}
}

// zeroBomb returns a zlib stream that inflates to mib MiB of zeros,
// built without compressing them all: one MiB
// deflated by a fresh compressor, so that it starts with a literal and
// refers back only within itself, and ended by a sync flush, which
// leaves it on a byte boundary and not final, repeated mib times; then
// an empty final block and the Adler-32 of the zeros (its sum A stays 1,
// B counts the bytes). Compressing 100 MiB under the race detector took
// 30 s, most of the package's time.
func zeroBomb(t *testing.T, mib int) []byte {
	t.Helper()
	var chunk bytes.Buffer
	fw, err := flate.NewWriter(&chunk, flate.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := fw.Flush(); err != nil {
		t.Fatal(err)
	}
	out := bytes.NewBuffer([]byte{0x78, 0xda}) // zlib's header for deflate, best compression
	for range mib {
		out.Write(chunk.Bytes())
	}
	end, err := flate.NewWriter(out, flate.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if err := end.Close(); err != nil {
		t.Fatal(err)
	}
	return binary.BigEndian.AppendUint32(out.Bytes(), uint32(mib<<20)%65521<<16|1)
}

// TestZeroBomb checks TestDecodeMemcacheBomb's stream: zlib reads it
// whole, checksum included, as mib MiB of zeros.
func TestZeroBomb(t *testing.T) {
	r, err := zlib.NewReader(bytes.NewReader(zeroBomb(t, 3)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || len(got) != 3<<20 || bytes.ContainsFunc(got, func(r rune) bool { return r != 0 }) {
		t.Fatalf("the bomb of 3 MiB inflates to %d bytes (all zeros: %v), %v", len(got), !bytes.ContainsFunc(got, func(r rune) bool { return r != 0 }), err)
	}
}

func TestEncodeMemcache(t *testing.T) {
	text := func(n int) []byte { return testData("text", n, 1) }
	littleSavings := append(testData("random", 26000, 3), make([]byte, 4000)...)
	tests := []struct {
		name       string
		value      []byte
		opt        MemcacheOptions
		wantFlags  uint32
		compressed bool
	}{
		{"empty", nil, MemcacheOptions{}, 0, false},
		{"small", []byte("hello"), MemcacheOptions{}, 0, false},
		{"below threshold", text(19999), MemcacheOptions{}, 0, false},
		{"at threshold", text(20000), MemcacheOptions{}, 0x2, true},
		{"300 KB", text(300 * 1024), MemcacheOptions{}, 0x2, true},
		{"incompressible", testData("random", 30000, 1), MemcacheOptions{}, 0, false},
		{"custom threshold", text(200), MemcacheOptions{Threshold: 100}, 0x2, true},
		{"threshold off", text(30000), MemcacheOptions{Threshold: -1}, 0, false},
		{"savings too demanding", text(30000), MemcacheOptions{MinSavings: 0.99}, 0, false},
		// 13% zeros: zlib saves about that much, less than the default 20%.
		{"no savings keeps any fit", littleSavings, MemcacheOptions{MinSavings: -1}, 0x2, true},
		{"savings 0 means default", littleSavings, MemcacheOptions{MinSavings: 0}, 0, false},
		{"savings 0.1", littleSavings, MemcacheOptions{MinSavings: 0.1}, 0x2, true},
		{"savings NaN means default", text(30000), MemcacheOptions{MinSavings: math.NaN()}, 0x2, true},
		{"savings > 1 means default", text(30000), MemcacheOptions{MinSavings: 2}, 0x2, true},
		{"user flags", []byte("x"), MemcacheOptions{UserFlags: 1}, 0x10000, false},
		{"user flags compressed", text(30000), MemcacheOptions{UserFlags: 0xffff}, 0xffff0002, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload, flags := EncodeMemcache(tt.value, tt.opt)
			if flags != tt.wantFlags {
				t.Errorf("EncodeMemcache(%d bytes, %+v) flags = %#x, want %#x", len(tt.value), tt.opt, flags, tt.wantFlags)
			}
			if !tt.compressed && !bytes.Equal(payload, tt.value) {
				t.Errorf("EncodeMemcache(%d bytes) uncompressed payload differs from the value", len(tt.value))
			}
			if tt.compressed {
				savings := tt.opt.withDefaults().MinSavings
				if float64(len(payload)) > float64(len(tt.value))*(1-savings) {
					t.Errorf("EncodeMemcache(%d bytes) kept %d compressed bytes, more than %.0f%% of the value", len(tt.value), len(payload), 100*(1-savings))
				}
				if payload[0] != 0x78 || payload[1] != 0x9c {
					t.Errorf("EncodeMemcache zlib header = %x, want 789c (default level, as compress)", payload[:2])
				}
			}
			v, err := DecodeMemcache(flags, payload, 0)
			if err != nil {
				t.Fatalf("DecodeMemcache(EncodeMemcache(%d bytes)) error: %v", len(tt.value), err)
			}
			if v.Type != String || v.UserFlags != tt.opt.UserFlags || !bytes.Equal(v.Body, tt.value) {
				t.Errorf("DecodeMemcache(EncodeMemcache(%d bytes)) = {%v, %d bytes, uf %d}, want the value back", len(tt.value), v.Type, len(v.Body), v.UserFlags)
			}
		})
	}
}

func FuzzDecodeMemcache(f *testing.F) {
	body := testData("mixed", 2500, 1)
	f.Add(uint32(0), []byte("hello"), 100)
	f.Add(uint32(0x100), []byte("1"), 0)
	f.Add(uint32(0x300), []byte("-42"), 0)
	f.Add(uint32(0x1), []byte(`a:1:{i:0;s:1:"x";}`), 0)
	f.Add(uint32(0x2), zlibData(body), 5000)
	f.Add(uint32(0x2), zlibData(body), 100)
	f.Add(uint32(0x10103), zlibData([]byte("1")), 10)
	f.Add(uint32(0x2), []byte{0x78, 0x9c, 1, 2, 3}, 10)
	f.Fuzz(func(t *testing.T, flags uint32, payload []byte, maxSize int) {
		maxSize %= 1 << 20 // keep the fuzzer from asking for huge outputs
		v, err := DecodeMemcache(flags, payload, maxSize)
		held := 0
		hv, herr := DecodeMemcacheHeld(flags, payload, maxSize, func(n int) error { held += n; return nil })
		if (err == nil) != (herr == nil) || !bytes.Equal(v.Body, hv.Body) || v.Type != hv.Type {
			t.Fatalf("DecodeMemcache = %d bytes, %v; DecodeMemcacheHeld = %d bytes, %v", len(v.Body), err, len(hv.Body), herr)
		}
		if flags&memcacheCompressed != 0 && err == nil && held < len(v.Body) {
			t.Fatalf("held %d bytes for a %d-byte body", held, len(v.Body))
		}
		limit := maxSize
		if limit <= 0 {
			limit = DefaultMaxSize
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("DecodeMemcache error %v wraps no package error", err)
			}
			return
		}
		if len(v.Body) > limit {
			t.Fatalf("DecodeMemcache returned %d bytes, limit %d", len(v.Body), limit)
		}
		if v.Type != memcacheType(flags) || v.UserFlags != uint16(flags>>16) {
			t.Fatalf("DecodeMemcache(%#x) = type %v, user flags %d", flags, v.Type, v.UserFlags)
		}
		if v.Type == Bool && v.Text() != fmt.Sprint(string(v.Body) == "1") {
			t.Fatalf("DecodeMemcache(%#x) bool body %q reads as %s", flags, v.Body, v.Text())
		}
		if flags&memcacheCompressed == 0 && v.Type != Bool && !bytes.Equal(v.Body, payload) {
			t.Fatalf("DecodeMemcache(%#x) changed an uncompressed body", flags)
		}
	})
}

// TestDecodeMemcacheHeld: every buffer an unsized zlib value grows into
// is asked of hold first, about twice the body in all, and a refusal
// stops the inflating there.
func TestDecodeMemcacheHeld(t *testing.T) {
	body := bytes.Repeat([]byte("pecl "), 200000) // 1 MB
	payload := zlibData(body)
	held := 0
	got, err := DecodeMemcacheHeld(0x2, payload, 0, func(n int) error { held += n; return nil })
	if err != nil || !bytes.Equal(got.Body, body) {
		t.Fatalf("DecodeMemcacheHeld = %d bytes, %v; want the %d-byte body", len(got.Body), err, len(body))
	}
	if held < len(body) || held > 4*len(body) {
		t.Errorf("held %d bytes for a %d-byte body, want between once and four times it", held, len(body))
	}
	refused := errors.New("no room")
	held = 0
	_, err = DecodeMemcacheHeld(0x2, payload, 0, func(n int) error {
		if held+n > 256<<10 {
			return refused
		}
		held += n
		return nil
	})
	if !errors.Is(err, refused) || held > 256<<10 {
		t.Errorf("refused past 256 KiB: %v, held %d; want the refusal", err, held)
	}
}
