package h1

import (
	"bufio"
	"bytes"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestConnStats checks the counts of connections in each state: a silent
// new one (reading), one between requests (idle), one whose handler runs
// (active), one handed over to Fallback (not counted), and Accepted.
func TestConnStats(t *testing.T) {
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			<-release
		}
	})
	s, addr := startH1(t, h, nil)
	defer close(release)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial() // silent
	idle := dial()
	idle.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	if _, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil {
		t.Fatal(err)
	}
	dial().Write([]byte("GET /block HTTP/1.1\r\nHost: a\r\n\r\n"))
	dial().Write([]byte("PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")) // Fallback's

	want := ConnStats{Reading: 1, Idle: 1, Active: 1, Accepted: 4}
	var got ConnStats
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = s.ConnStats(); got == want {
			return
		}
	}
	t.Fatalf("ConnStats() = %+v, want %+v", got, want)
}

// TestBadRequestsCounted: a request answered 400 and closed before any
// handler, on the fast path or by the guard on a connection handed to
// Fallback, is counted in BadRequests and logged, at most a line a
// second; requests served are not counted.
func TestBadRequestsCounted(t *testing.T) {
	var logged syncBuffer
	s, addr := startH1(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), func(s *Server) {
		s.ErrorLog = log.New(&logged, "", 0)
	})
	const both = "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
	for _, tc := range []struct {
		name, raw string
		want      uint64
	}{
		{"served", "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 0},
		{"fast path", both, 1},
		{"HTTP/1.0 with Transfer-Encoding", "PUT /x HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 2},
		// A chunked body sends the first request to Fallback, and the
		// guard refuses the second on the connection handed over.
		{"handed over", "PUT /e HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n" + both, 3},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte(tc.raw))
		io.ReadAll(c) // until the server closes
		c.Close()
		if got := s.ConnStats().BadRequests; got != tc.want {
			t.Errorf("%s: BadRequests = %d, want %d", tc.name, got, tc.want)
		}
	}
	// One line for the first refusal; the others, within a second of
	// it on any machine but a stalled one, are only counted.
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) == 0 || len(lines) > 3 || !strings.Contains(lines[0], "answered a request 400") || !strings.Contains(lines[0], "(1 such requests so far)") {
		t.Errorf("logged %q, want a line for the first refusal", lines)
	}
	if len(lines) > 1 {
		t.Logf("%d lines: the refusals were more than a second apart", len(lines))
	}
}

// syncBuffer is a bytes.Buffer that a Server's log and a test may use at
// once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
