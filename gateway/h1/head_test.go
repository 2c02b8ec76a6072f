package h1

import (
	"strings"
	"testing"
)

// TestHeadScanLongLine: a head whose one long line comes a byte at a
// time is searched once, not once per read, so that its cost is linear
// in its length (a 1 MiB line, net/http's default limit, took seconds
// when each read searched the line again from its start). The test
// counts no time: after each read it turns the bytes the scan has
// searched into line ends, which a scan that searched them again would
// find and refuse the request line for; only when a line's own end comes
// are its bytes put back, as the scan checks the complete line then. The
// scan must still find the head's end where it is.
func TestHeadScanLongLine(t *testing.T) {
	head := []byte("GET /" + strings.Repeat("a", 64<<10) + " HTTP/1.1\r\nHost: a\r\n\r\n")
	b := make([]byte, len(head))
	var s headScan
	n := 0
	for w := 1; w <= len(head) && n == 0; w++ {
		b[w-1] = head[w-1]
		if head[w-1] == '\n' {
			copy(b[:w], head[:w]) // the complete line, checked once
		}
		var ok bool
		if n, ok = s.scan(b[:w]); !ok {
			t.Fatalf("refused after %d bytes: the scan searched bytes it had searched before", w)
		}
		if n != 0 && n != w {
			t.Fatalf("head of %d bytes found after %d: the scan searched bytes it had searched before", n, w)
		}
		if head[w-1] != '\n' {
			b[w-1] = '\n' // searched: a scan that looks again finds a line end here
		}
	}
	if n != len(head) {
		t.Errorf("head length %d, want %d", n, len(head))
	}
}
