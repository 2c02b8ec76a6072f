package chunk

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/upstream/op"
)

func TestIndexRoundTrip(t *testing.T) {
	tests := []Index{
		{Version: 1, Size: 1, ChunkSize: 1, Flags: 0},
		{Version: math.MaxUint64, Size: 20 << 20, ChunkSize: 1048000, Flags: 0xffffffff},
		{Version: 42, Size: 0, ChunkSize: 100},
		{Version: 7, Size: int64(MaxChunkSize) * MaxChunks, ChunkSize: MaxChunkSize, Flags: IndexFlags},
	}
	for _, x := range tests {
		got, ok, err := Parse(op.Item{Flags: IndexFlags, Value: x.Encode()})
		if !ok || err != nil || got != x {
			t.Errorf("Parse(Encode(%+v)) = %+v, %v, %v", x, got, ok, err)
		}
	}
}

func TestParse(t *testing.T) {
	good := Index{Version: 9, Size: 2500, ChunkSize: 1000, Flags: 3}.Encode()
	tests := []struct {
		name    string
		flags   uint32
		value   []byte
		ok      bool
		corrupt bool
	}{
		{name: "index", flags: IndexFlags, value: good, ok: true},
		{name: "other flags", flags: 0, value: good},
		{name: "flags one bit off", flags: IndexFlags ^ 1, value: good},
		{name: "plain value with the index flags", flags: IndexFlags, value: []byte("hello, world")},
		{name: "empty value", flags: IndexFlags},
		{name: "magic only", flags: IndexFlags, value: []byte(magic), ok: true, corrupt: true},
		{name: "appended to", flags: IndexFlags, value: append(bytes.Clone(good), "more"...), ok: true, corrupt: true},
		{name: "truncated", flags: IndexFlags, value: good[:len(good)-1], ok: true, corrupt: true},
		{name: "prepended to", flags: IndexFlags, value: append([]byte("x"), good...), ok: true, corrupt: true},
		{name: "prepended and appended to", flags: IndexFlags, value: append(append([]byte("xy"), good...), 'z'), ok: true, corrupt: true},
		{name: "unknown format", flags: IndexFlags, value: append(append([]byte(magic), 2), good[len(magic)+1:]...), ok: true, corrupt: true},
		{name: "chunk size 0", flags: IndexFlags, value: Index{Size: 1, ChunkSize: 0}.Encode(), ok: true, corrupt: true},
		{name: "chunk size too large", flags: IndexFlags, value: Index{Size: 1, ChunkSize: MaxChunkSize + 1}.Encode(), ok: true, corrupt: true},
		{name: "too many chunks", flags: IndexFlags, value: Index{Size: MaxChunks + 1, ChunkSize: 1}.Encode(), ok: true, corrupt: true},
		{name: "negative size", flags: IndexFlags, value: Index{Size: -1, ChunkSize: 1}.Encode(), ok: true, corrupt: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ok, err := Parse(op.Item{Flags: tt.flags, Value: tt.value})
			if ok != tt.ok || (err != nil) != tt.corrupt || err != nil && !errors.Is(err, ErrCorrupt) {
				t.Errorf("Parse = ok %v, err %v; want ok %v, corrupt %v", ok, err, tt.ok, tt.corrupt)
			}
			if IsIndex(tt.flags, tt.value) != tt.ok {
				t.Errorf("IsIndex = %v, want %v", !tt.ok, tt.ok)
			}
		})
	}
}

func TestChunks(t *testing.T) {
	tests := []struct {
		size, chunk int64
		count       int
		last        int
	}{
		{size: 1, chunk: 10, count: 1, last: 1},
		{size: 10, chunk: 10, count: 1, last: 10},
		{size: 11, chunk: 10, count: 2, last: 1},
		{size: 30, chunk: 10, count: 3, last: 10},
		{size: 20 << 20, chunk: 1048000, count: 21, last: 20<<20 - 20*1048000},
	}
	for _, tt := range tests {
		x := Index{Size: tt.size, ChunkSize: int(tt.chunk)}
		if got := x.Count(); got != tt.count {
			t.Errorf("Count(%d in %d) = %d, want %d", tt.size, tt.chunk, got, tt.count)
		}
		if got := x.ChunkLen(tt.count - 1); got != tt.last {
			t.Errorf("ChunkLen(last of %d in %d) = %d, want %d", tt.size, tt.chunk, got, tt.last)
		}
		if tt.count > 1 && x.ChunkLen(0) != int(tt.chunk) {
			t.Errorf("ChunkLen(0 of %d in %d) = %d, want %d", tt.size, tt.chunk, x.ChunkLen(0), tt.chunk)
		}
	}
}

// TestKey: chunk keys are valid memcached keys of at most MaxKeyLen bytes
// for any key (250 bytes, UTF-8, bytes memcached refuses in no key), are
// reserved, and differ by key, version and number.
func TestKey(t *testing.T) {
	keys := []string{"k", strings.Repeat("k", 250), strings.Repeat("é", 125), "a/b:c", KeyPrefix + "x"}
	seen := map[string]string{}
	for _, k := range keys {
		for _, v := range []uint64{0, 1, math.MaxUint64} {
			for _, i := range []int{0, 1, MaxChunks - 1} {
				c := Key(k, v, i)
				if len(c) > MaxKeyLen {
					t.Errorf("Key(%.10q…, %d, %d) is %d bytes, over MaxKeyLen %d", k, v, i, len(c), MaxKeyLen)
				}
				if strings.ContainsFunc(c, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
					t.Errorf("Key(%.10q…, %d, %d) = %q has a byte memcached refuses", k, v, i, c)
				}
				if !Reserved(c) {
					t.Errorf("Key(%.10q…, %d, %d) = %q is not Reserved", k, v, i, c)
				}
				if prev, dup := seen[c]; dup {
					t.Errorf("Key %q for both %s and %.10q…/%d/%d", c, prev, k, v, i)
				}
				seen[c] = k
			}
		}
	}
}

func TestReserved(t *testing.T) {
	for key, want := range map[string]bool{"%~": true, "%~abc": true, "%": false, "%7E": false, "~%": false, "a%~": false, "": false} {
		if got := Reserved(key); got != want {
			t.Errorf("Reserved(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestExpiration(t *testing.T) {
	const now = 1_800_000_000
	tests := []struct {
		name       string
		exp, grace int32
		want       int32
	}{
		{"never", 0, 60, 0},
		{"at once", -1, 60, -1},
		{"relative", 100, 60, 160},
		{"relative at 30 days", relativeMax - 60, 60, relativeMax},
		{"relative past 30 days", relativeMax - 10, 60, now + relativeMax + 50},
		{"absolute", now + 100, 60, now + 160},
		{"absolute near the end of time", math.MaxInt32 - 10, 60, math.MaxInt32},
	}
	for _, tt := range tests {
		if got := expiration(tt.exp, tt.grace, now); got != tt.want {
			t.Errorf("%s: expiration(%d, %d) = %d, want %d", tt.name, tt.exp, tt.grace, got, tt.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(uint32(IndexFlags), Index{Version: 1, Size: 10, ChunkSize: 3}.Encode())
	f.Add(uint32(0), []byte("value"))
	f.Add(uint32(IndexFlags), []byte(magic+"\x01"))
	f.Fuzz(func(t *testing.T, flags uint32, value []byte) {
		x, ok, err := Parse(op.Item{Flags: flags, Value: value})
		if !ok || err != nil {
			return
		}
		if x.ChunkSize < 1 || x.ChunkSize > MaxChunkSize || x.Size < 0 || x.Count() > MaxChunks {
			t.Fatalf("Parse accepted %+v", x)
		}
		if !bytes.Equal(x.Encode(), value) {
			t.Fatalf("Encode(Parse(%x)) = %x", value, x.Encode())
		}
	})
}
