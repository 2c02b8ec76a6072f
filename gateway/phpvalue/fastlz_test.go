package phpvalue

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// testData returns n bytes of the named kind, deterministically.
func testData(kind string, n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	b := make([]byte, n)
	switch kind {
	case "random":
		for i := range b {
			b[i] = byte(r.Uint32())
		}
	case "run": // one byte repeated: matches at distance 1, very long
		for i := range b {
			b[i] = 'a'
		}
	case "text": // random words: short matches at varied distances
		words := strings.Fields("the quick brown fox jumps over a lazy dog while memcached serves php values to the gateway")
		b = b[:0]
		for len(b) < n {
			b = append(b, words[r.IntN(len(words))]...)
			b = append(b, ' ')
		}
		b = b[:n]
	case "period": // a short random period: overlapping matches
		p := 1 + r.IntN(40)
		for i := range b {
			if i < p {
				b[i] = byte(r.Uint32())
			} else {
				b[i] = b[i-p]
			}
		}
	case "blocks": // a 20000-byte random block repeated: level-2 far matches
		const blk = 20000
		for i := range b {
			if i < blk {
				b[i] = byte(r.Uint32())
			} else {
				b[i] = b[i-blk]
			}
		}
	case "mixed": // random stretches and copies from the recent past
		for i := 0; i < n; {
			k := min(n-i, 1+r.IntN(300))
			if i > 0 && r.IntN(2) == 0 {
				d := 1 + r.IntN(min(i, 80000))
				for j := range k {
					b[i+j] = b[i+j-d]
				}
			} else {
				for j := range k {
					b[i+j] = byte(r.Uint32())
				}
			}
			i += k
		}
	default:
		panic("unknown kind " + kind)
	}
	return b
}

func TestFastLZRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 2, 3, 4, 5, 12, 13, 31, 32, 33, 64, 100, 263, 264, 265, 266, 267, 1000,
		8191, 8192, 8193, 8194, 65535, 65536, 73727, 73728, 100_000, 300 * 1024}
	kinds := []string{"random", "run", "text", "period", "blocks", "mixed"}
	for _, level := range []int{1, 2} {
		for _, kind := range kinds {
			for _, n := range sizes {
				t.Run(fmt.Sprintf("level%d/%s/%d", level, kind, n), func(t *testing.T) {
					src := testData(kind, n, 7)
					c := fastlzAppend(nil, src, level)
					if len(c) > fastlzBound(n) {
						t.Errorf("compressed %d bytes to %d, bound %d", n, len(c), fastlzBound(n))
					}
					if n > 0 && int(c[0]>>5)+1 != level {
						t.Errorf("level marker = %d, want %d", c[0]>>5+1, level)
					}
					got, err := fastlzDecompress(c, n, false)
					if err != nil {
						t.Fatalf("fastlzDecompress(compress(%d bytes)) error: %v", n, err)
					}
					if !bytes.Equal(got, src) {
						t.Fatalf("fastlzDecompress(compress(%d bytes)) differs from input", n)
					}
					if (kind == "run" || kind == "period") && n >= 1000 && len(c) > n/10 {
						t.Errorf("%s data: %d bytes compressed to %d, want under a tenth", kind, n, len(c))
					}
				})
			}
		}
	}
}

// TestFastLZRandomized compresses many random inputs of random sizes and
// kinds, checking the round trip.
func TestFastLZRandomized(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 42))
	kinds := []string{"random", "run", "text", "period", "blocks", "mixed"}
	for i := range 200 {
		n := r.IntN(300*1024 + 1)
		if i%2 == 0 {
			n = r.IntN(5000)
		}
		kind := kinds[r.IntN(len(kinds))]
		level := 1 + r.IntN(2)
		src := testData(kind, n, uint64(i))
		got, err := fastlzDecompress(fastlzAppend(nil, src, level), n, false)
		if err != nil || !bytes.Equal(got, src) {
			t.Fatalf("round trip of %d %s bytes at level %d: err %v, equal %v", n, kind, level, err, bytes.Equal(got, src))
		}
	}
}

func TestFastLZFarMatch(t *testing.T) {
	src := testData("blocks", 100_000, 3)
	c := fastlzAppend(nil, src, 2)
	if len(c) > 25_000 {
		t.Errorf("repeated 20000-byte block: %d bytes compressed to %d, want far matches (< 25000)", len(src), len(c))
	}
}

func TestFastLZDecompressVectors(t *testing.T) {
	// 8192 literal bytes, then a 3-byte match reaching back exactly 8192.
	lits8192 := testData("random", 8192, 5)
	dist8192 := append(flzLiterals(nil, lits8192), 0x3f, 0xff)
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"literal", []byte{0x02, 'a', 'b', 'c'}, "abc"},
		{"level1 match", []byte{0x02, 'a', 'b', 'c', 0x20, 0x02}, "abcabc"},
		{"level1 run", []byte{0x00, 'x', 0xe0, 0x00, 0x00}, "x" + string(bytes.Repeat([]byte("x"), 9))},
		{"level1 long", []byte{0x00, 'x', 0xe0, 0xff, 0x00}, string(bytes.Repeat([]byte("x"), 1+264))},
		{"level1 distance 8192", dist8192, string(lits8192) + string(lits8192[:3])},
		{"level2 literal", []byte{0x22, 'a', 'b', 'c'}, "abc"},
		{"level2 long", []byte{0x20, 'x', 0xe0, 0xff, 0x01, 0x00}, string(bytes.Repeat([]byte("x"), 1+9+256))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fastlzDecompress(tt.in, len(tt.want), false)
			if err != nil {
				t.Fatalf("fastlzDecompress(%.40x…) error: %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Errorf("fastlzDecompress(%.40x…) = %.40q…, want %.40q…", tt.in, got, tt.want)
			}
		})
	}
}

func TestFastLZDecompressErrors(t *testing.T) {
	far := []byte{0x20, 'x', 0x3f, 0xff, 0x00, 0x00} // level-2 far match: distance 8192 after 1 byte
	tests := []struct {
		name string
		in   []byte
		want int
	}{
		{"empty with length", nil, 1},
		{"level 3", []byte{0x40, 'a'}, 1},
		{"level 8", []byte{0xe0, 'a'}, 1},
		{"truncated literal", []byte{0x05, 'a', 'b'}, 6},
		{"match without offset", []byte{0x00, 'a', 0x20}, 4},
		{"level1 long match without extension", []byte{0x00, 'a', 0xe0}, 20},
		{"level1 long match without offset", []byte{0x00, 'a', 0xe0, 0x01}, 20},
		{"level2 length run truncated", []byte{0x20, 'a', 0xe0, 0xff, 0xff}, 1000},
		{"level2 far truncated", []byte{0x20, 'a', 0x3f, 0xff, 0x00}, 10},
		{"level2 far before start", far, 4},
		{"match before start", []byte{0x00, 'a', 0x20, 0x05}, 4},
		{"level1 distance 8192 before start", append(append([]byte{0x1f}, bytes.Repeat([]byte("y"), 32)...), 0x3f, 0xff), 35},
		{"longer than stored", []byte{0x02, 'a', 'b', 'c'}, 2},
		{"match longer than stored", []byte{0x00, 'a', 0x20, 0x00}, 3},
		{"shorter than stored", []byte{0x02, 'a', 'b', 'c'}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fastlzDecompress(tt.in, tt.want, false)
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("fastlzDecompress(%x, %d) = %q, %v; want ErrCorrupt", tt.in, tt.want, got, err)
			}
		})
	}
}

func FuzzFastLZRoundTrip(f *testing.F) {
	f.Add([]byte(""), false)
	f.Add([]byte("a"), true)
	f.Add([]byte("abcabcabcabcabcabcabc"), false)
	f.Add(testData("mixed", 1000, 1), true)
	f.Add(testData("period", 1000, 2), false)
	f.Fuzz(func(t *testing.T, src []byte, level2 bool) {
		level := 1
		if level2 {
			level = 2
		}
		c := fastlzAppend(nil, src, level)
		if len(c) > fastlzBound(len(src)) {
			t.Fatalf("compressed %d bytes to %d, bound %d", len(src), len(c), fastlzBound(len(src)))
		}
		got, err := fastlzDecompress(c, len(src), false)
		if err != nil {
			t.Fatalf("fastlzDecompress(compress(%x)) error: %v", src, err)
		}
		if !bytes.Equal(got, src) {
			t.Fatalf("fastlzDecompress(compress(%x)) = %x", src, got)
		}
	})
}

func FuzzFastLZDecompress(f *testing.F) {
	f.Add([]byte{0x02, 'a', 'b', 'c', 0x20, 0x02}, uint16(6))
	f.Add([]byte{0x20, 'x', 0xe0, 0xff, 0x01, 0x00}, uint16(266))
	f.Add(fastlzAppend(nil, testData("blocks", 300, 1), 2), uint16(300))
	f.Fuzz(func(t *testing.T, src []byte, want uint16) {
		got, err := fastlzDecompress(src, int(want), false)
		if exact, eerr := fastlzDecompress(src, int(want), true); (err == nil) != (eerr == nil) || !bytes.Equal(got, exact) {
			t.Fatalf("fastlzDecompress = %d bytes, %v; exact = %d bytes, %v", len(got), err, len(exact), eerr)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("fastlzDecompress error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if len(got) != int(want) {
			t.Fatalf("fastlzDecompress returned %d bytes, want %d", len(got), want)
		}
	})
}

// TestAppendBackref: a back-reference, copied a whole number of periods
// at a time, appends what copying it byte by byte does, for distances
// shorter than, equal to and longer than the match.
func TestAppendBackref(t *testing.T) {
	tests := []struct {
		name    string
		prefix  string
		dist, n int
	}{
		{"run of one byte", "ab", 1, 1 << 20},
		{"period 2", "xab", 2, 1001},
		{"period 3, not a whole number of periods", "abc", 3, 10},
		{"period 7 from inside the prefix", "0123456789", 7, 300},
		{"distance equal to length", "abcdef", 3, 3},
		{"distance longer than length", "abcdefgh", 8, 3},
		{"one byte", "a", 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := []byte(tt.prefix)
			for range tt.n {
				want = append(want, want[len(want)-tt.dist])
			}
			got := appendBackref([]byte(tt.prefix), tt.dist, tt.n)
			if !bytes.Equal(got, want) {
				t.Errorf("appendBackref(%q, %d, %d) differs from a byte-by-byte copy", tt.prefix, tt.dist, tt.n)
			}
		})
	}
}

// BenchmarkFastLZDecodeZeros decodes a megabyte of zeros as php-memcached
// stores it (FastLZ level 2: runs at distance 1).
func BenchmarkFastLZDecodeZeros(b *testing.B) {
	p, f := Encode(make([]byte, 1<<20), EncodeOptions{})
	b.SetBytes(1 << 20)
	for b.Loop() {
		if _, err := Decode(f, p, 0); err != nil {
			b.Fatal(err)
		}
	}
}
