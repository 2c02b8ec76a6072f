//go:build linux

package abuse

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tally counts outcomes by kind: an HTTP status ("503") or what happened
// instead ("timeout", "reset", "eof", "open" …). It is safe for concurrent
// use.
type tally struct {
	mu sync.Mutex // guards n
	n  map[string]int
}

func (t *tally) add(kind string, n int) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = map[string]int{}
	}
	t.n[kind] += n
}

// total returns the count of every kind.
func (t *tally) total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, v := range t.n {
		n += v
	}
	return n
}

// String lists the kinds, most frequent first: "202×1,234 503×17", or
// "none".
func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.n) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(t.n))
	for k := range t.n {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if t.n[kinds[i]] != t.n[kinds[j]] {
			return t.n[kinds[i]] > t.n[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = k + "×" + thousands(t.n[k])
	}
	return strings.Join(parts, " ")
}

// errKind names what went wrong on a socket in a word, for tallies:
// timeout, reset, refused, eof, broken pipe, emfile (descriptors
// exhausted), no ports (ephemeral ports exhausted), or the errno.
func errKind(err error) string {
	var ne net.Error
	var errno syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return "emfile"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no ports"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &errno):
		return errno.Error()
	}
	return "error"
}

// thousands formats n with commas: 12,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// size formats a byte count in binary units: 412 MiB, 3.9 GiB.
func size(b int64) string {
	switch {
	case b >= 10<<30:
		return fmt.Sprintf("%.0f GiB", float64(b)/(1<<30))
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// dur formats a latency for the table: 0.4 ms, 12 ms, 5.61 s.
func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// row is one attack's line of the report; every field is preformatted.
type row struct {
	attack    string
	size      string
	setup     string // time to open the attacker's connections
	peakRSS   string // VmHWM of the gateway, and the largest Go heap in use sampled
	keepAlive string // canary on a keep-alive connection: p50 / p99 / max
	newConn   string // canary on a new connection per request
	canaryBad string // canary answers that were not 200 within the bound
	got       string // what the attacker got
	lost      string // 202s never applied, of those accepted
	recovery  string
	notes     string
}

// table renders rows as a markdown table.
func table(rows []row) string {
	var b strings.Builder
	b.WriteString("| attack | size | setup | peak RSS (heap in use, sampled max) | canary keep-alive p50 / p99 / max | canary new conn p50 / p99 / max | canary not 200 in 1 s | attacker got | lost 202s | recovery | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.attack, r.size, r.setup, r.peakRSS, r.keepAlive, r.newConn, r.canaryBad, r.got, r.lost, r.recovery, r.notes)
	}
	return b.String()
}
