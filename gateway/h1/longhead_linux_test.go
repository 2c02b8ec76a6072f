package h1

import (
	"bufio"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// longHead returns a request head of exactly n bytes (at least 40),
// without its final CRLF when !whole: one long header line after the
// request line and Host.
func longHead(n int, whole bool) string {
	const start, end = "GET /echo HTTP/1.1\r\nHost: a\r\nX-Big: ", "\r\n\r\n"
	h := start + strings.Repeat("b", n-len(start)-len(end)) + end
	if !whole {
		h = h[:len(h)-2]
	}
	return h
}

// heapInuse returns the heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestLongHeadsHoldTheirBytes: connections sending a request head
// longer than the read buffer, slowly, wait in the poller holding about
// the head's bytes each and no goroutine, as short heads do, instead of
// being handed to net/http while incomplete, where each held a goroutine
// and about 75 KB (finding F4, a slowloris of 15 KB heads). Once its head
// is complete a connection is answered as net/http answers it.
func TestLongHeadsHoldTheirBytes(t *testing.T) {
	const (
		n        = 200
		size     = 15_000 // of the head sent: under net/http's limit, 20 KiB here
		perConn  = 24 << 10
		maxExtra = 20 // goroutines besides the poller's workers: the test's own
	)
	s, addr := startH1(t, testHandler(), func(s *Server) {
		s.MaxHeaderBytes, s.Fallback.MaxHeaderBytes = 16<<10, 16<<10
		s.ReadHeaderTimeout, s.Fallback.ReadHeaderTimeout = time.Minute, time.Minute
		// Few workers, so that what the goroutine count shows is
		// what connections hold, not the pool a burst of them starts.
		s.pollWorkers = 4
	})
	head := longHead(size+2, true)[:size] // no empty line yet
	// Workers are counted apart: on a loaded machine the stall check
	// starts a batch of them past pollWorkers, which is not what a
	// connection holds.
	workers := func() int { return inPoller(s, func(p *poller) int { return p.live }) }
	baseG, baseHeap := runtime.NumGoroutine()-workers(), heapInuse()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
		if _, err := io.WriteString(c, head[:size-1]); err != nil {
			t.Fatal(err)
		}
	}
	// A byte more each once parked: the slow part of the head, which
	// grows a buffer that was full.
	waitReading(t, s, n)
	for _, c := range conns {
		if _, err := io.WriteString(c, head[size-1:]); err != nil {
			t.Fatal(err)
		}
	}
	if !eventually(func() bool { return parkedWith(s, size) == n }) {
		t.Fatalf("%d connections parked holding the %d bytes of their head, want %d", parkedWith(s, size), size, n)
	}
	if extra := runtime.NumGoroutine() - workers() - baseG; extra > maxExtra {
		t.Errorf("%d goroutines more than before %d connections sending a long head, want at most %d", extra, n, maxExtra)
	}
	grown := int64(heapInuse()) - int64(baseHeap)
	t.Logf("heap grew by %d bytes per connection", grown/n)
	if grown > n*perConn {
		t.Errorf("heap grew by %d bytes (%d per connection) for %d heads of %d bytes, want at most %d per connection",
			grown, grown/n, n, size, perConn)
	}

	// The rest of one head: it is answered as net/http answers it.
	c := conns[0]
	io.WriteString(c, "\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r, err := readWireResponse(bufio.NewReader(c), "GET")
	if err != nil || r.status != "HTTP/1.1 200 OK" || !strings.Contains(r.body, "X-Big") {
		t.Errorf("completed long head answered %q (%d body bytes), %v; want 200 with the header echoed", r.status, len(r.body), err)
	}
}

// parkedWith is how many connections s's poller holds parked mid-request
// with n bytes buffered. (A parked connection's inbuf is the poller's, and
// was last written before it parked, under p.mu.)
func parkedWith(s *Server, n int) int {
	return inPoller(s, func(p *poller) int {
		k := 0
		for _, c := range p.reading {
			if c.in.Buffered() == n {
				k++
			}
		}
		return k
	})
}

// waitReading waits until s's poller holds n connections parked
// mid-request.
func waitReading(t *testing.T, s *Server, n int) {
	t.Helper()
	if !eventually(func() bool { return readingCount(s) == n }) {
		t.Fatalf("%d connections parked mid-request, want %d", readingCount(s), n)
	}
}

// TestLongHeadLengths: heads around the read buffer's size and around
// net/http's limit (MaxHeaderBytes+4096) are answered as net/http answers
// them, whether they come at once or in parts with the connection parked
// in between.
func TestLongHeadLengths(t *testing.T) {
	const limit = testMaxHeader + 4096
	tests := []struct {
		name   string
		n      int
		status string
	}{
		{"a byte under the buffer", readBufSize - 1, "HTTP/1.1 200 OK"},
		{"the buffer", readBufSize, "HTTP/1.1 200 OK"},
		{"a byte over the buffer", readBufSize + 1, "HTTP/1.1 200 OK"},
		{"two buffers and a bit", 2*readBufSize + 100, "HTTP/1.1 200 OK"},
		{"MaxHeaderBytes", testMaxHeader, "HTTP/1.1 200 OK"},
		{"a byte under the limit", limit - 1, "HTTP/1.1 200 OK"},
		{"the limit", limit, "HTTP/1.1 200 OK"},
		{"a byte over the limit", limit + 1, "HTTP/1.1 431 Request Header Fields Too Large"},
		{"far over the limit", 2 * limit, "HTTP/1.1 431 Request Header Fields Too Large"},
	}
	h := testHandler()
	_, fast := startH1(t, h, nil)
	std := startNetHTTP(t, listen(t, "tcp"), h)
	for _, tt := range tests {
		raw := longHead(tt.n, true)
		t.Run("at once/"+tt.name, func(t *testing.T) {
			testConformance(t, conformanceCase{name: tt.name, raw: raw, status: tt.status}, std, fast)
		})
		t.Run("in parts/"+tt.name, func(t *testing.T) {
			s, fast := startH1(t, h, nil)
			want := partsExchange(t, std, raw, nil)
			got := partsExchange(t, fast, raw, func() bool {
				// Parked with the head so far, or handed over.
				return eventually(func() bool { return readingCount(s) == 1 || openConns(s) == 0 })
			})
			if want.status != tt.status {
				t.Fatalf("net/http answered %v, want status %q", want, tt.status)
			}
			if got.String() != want.String() {
				t.Errorf("got  %v\nwant %v", got, want)
			}
		})
	}
}

// partsExchange sends raw to addr in parts of 3000 bytes, calling
// between them wait, if not nil, until it reports false, and returns the
// response.
func partsExchange(t *testing.T, addr, raw string, wait func() bool) wireResponse {
	t.Helper()
	c := dialFor(t, addr, 10*time.Second)
	defer c.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for p := raw; len(p) > 0; {
			k := min(len(p), 3000)
			if _, err := io.WriteString(c, p[:k]); err != nil {
				return // answered and closed
			}
			if p = p[k:]; len(p) > 0 && wait != nil && !wait() {
				wait = nil
			}
		}
	}()
	r, _ := readWireResponse(bufio.NewReader(c), "GET")
	c.Close()
	<-done
	return r
}

// openConns is how many connections s serves on the fast path.
func openConns(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// TestSlowFallbackHeads: a slow head with a line outside the fast path's
// grammar that net/http reads on past (a request line it takes, a bare
// LF) waits in the poller until it is whole, as a fast one does, so that
// such a line is no way around the bound on slow heads; one that net/http
// answers at once is handed over at once and answered as net/http
// answers it, before the rest of the head comes.
func TestSlowFallbackHeads(t *testing.T) {
	big := strings.Repeat("b", 6000)
	tests := []struct {
		name        string
		first, rest string
		waits       bool // the fast path keeps the connection until the head is whole
	}{
		{"absolute form", "GET http://a/echo HTTP/1.1\r\nHost: a\r\nX-Big: " + big, "\r\n\r\n", true},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: a\r\nX-A: 1", "\r\n\r\n", true},
		{"HTTP/1.2", "GET /echo HTTP/1.2\r\nHost: a\r\nX-A: 1", "\r\n\r\n", true},
		{"CONNECT", "CONNECT a:443 HTTP/1.1\r\nHost: a\r\nX-A: 1", "\r\n\r\n", true},
		{"bare LF", "GET /echo HTTP/1.1\nHost: a\nX-Big: " + big, "\n\n", true},
		{"bare LF at the end", "GET /echo HTTP/1.1\r\nHost: a\r\n", "\n", true},
		{"bad request line", "GARBAGE\r\nX-A: 1", "\r\n\r\n", false},
		{"bad target", "GET /a\x01b HTTP/1.1\r\nHost: a", "\r\n\r\n", false},
		{"bad version", "GET /echo HTTP/1.1.1\r\nHost: a", "\r\n\r\n", false},
		{"CONNECT to a bad authority", "CONNECT a b:1 HTTP/1.1\r\nHost: a", "\r\n\r\n", false},
		{"header line without a colon", "GET /echo HTTP/1.1\r\nHost: a\r\nX-A 1\r\nX-B: 2", "\r\n\r\n", false},
	}
	h := testHandler()
	std := startNetHTTP(t, listen(t, "tcp"), h)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, fast := startH1(t, h, nil)
			want := twoPartExchange(t, std, tt.first, tt.rest, tt.waits, nil)
			got := twoPartExchange(t, fast, tt.first, tt.rest, tt.waits, func() {
				if !eventually(func() bool { return readingCount(s) == 1 && openConns(s) == 1 }) {
					t.Errorf("the connection is not parked with its head (%d parked mid-request, %d on the fast path), want it parked",
						readingCount(s), openConns(s))
				}
			})
			if got.String() != want.String() {
				t.Errorf("got  %v\nwant %v", got, want)
			}
		})
	}
}

// twoPartExchange sends first to addr and then, with more, calls wait (if
// not nil) and sends rest, and returns the response; without more the
// response must come before rest is sent.
func twoPartExchange(t *testing.T, addr, first, rest string, more bool, wait func()) wireResponse {
	t.Helper()
	c := dialFor(t, addr, 5*time.Second)
	defer c.Close()
	io.WriteString(c, first)
	if more {
		if wait != nil {
			wait()
		}
		io.WriteString(c, rest)
	}
	r, err := readWireResponse(bufio.NewReader(c), "GET")
	if r.status == "" {
		t.Errorf("no response from %s: %v", addr, err)
	}
	return r
}
