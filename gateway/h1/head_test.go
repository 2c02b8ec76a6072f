package h1

import (
	"strings"
	"testing"
	"time"
)

// TestHeadScanLongLine: a head whose one long line comes a byte at a
// time is searched once, not once per read. A 1 MiB line (a limit an
// operator may set, net/http's default) so scanned took 6 s when each
// read searched the line again from its start, and takes milliseconds.
// The scan must still find the head's end where it is.
func TestHeadScanLongLine(t *testing.T) {
	head := []byte("GET /" + strings.Repeat("a", 1<<20) + " HTTP/1.1\r\nHost: a\r\n\r\n")
	var s headScan
	start := time.Now()
	n := 0
	for w := 1; w <= len(head) && n == 0; w++ {
		var ok bool
		if n, ok = s.scan(head[:w]); !ok {
			t.Fatalf("refused after %d bytes", w)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("scanning a 1 MiB line a byte at a time took %v: each read searches the line again", took)
	}
	if n != len(head) {
		t.Errorf("head length %d, want %d", n, len(head))
	}
}
