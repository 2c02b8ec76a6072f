package gateway

import (
	"math"
	"testing"
)

// FuzzParseRange: whatever the header and the value's size, a range
// answered 206 lies within the value and is not empty, and a 416 has no
// bytes; no header makes parseRange panic. A last byte too large for
// int64 is capped at its maximum, whose +1 must not overflow end.
func FuzzParseRange(f *testing.F) {
	for _, h := range []string{"bytes=0-0", "bytes=-1", "bytes=5-", "bytes=0-1,3-4", "bytes=10-5", "bytes=-0",
		"bytes=99999999999999999999-", "bytes=0-99999999999999999999", "bytes=-99999999999999999999", "items=0-1", "bytes="} {
		f.Add(h, int64(5017))
		f.Add(h, int64(0))
	}
	f.Fuzz(func(t *testing.T, h string, size int64) {
		if size < 0 {
			size = -(size + 1)
		}
		size = min(size, math.MaxInt64/2)
		kind, off, end := parseRange(h, size)
		switch kind {
		case rangePartial:
			if off < 0 || off >= end || end > size {
				t.Fatalf("parseRange(%q, %d) = 206 [%d, %d): not a range of the value", h, size, off, end)
			}
		case rangeUnsatisfiable:
			if off != 0 || end != 0 {
				t.Fatalf("parseRange(%q, %d) = 416 [%d, %d)", h, size, off, end)
			}
		case rangeNone:
			if off != 0 || end != size {
				t.Fatalf("parseRange(%q, %d) = 200 [%d, %d), want the whole value", h, size, off, end)
			}
		}
	})
}
