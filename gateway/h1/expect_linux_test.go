package h1

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
)

// expectHead is the head of a PUT of size bytes whose client waits for
// 100 Continue before it sends them, as curl -T and PHP's CURLOPT_PUT do.
func expectHead(path string, size int) string {
	return "PUT " + path + " HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: " + itoa(size) + "\r\n\r\n"
}

func itoa(n int) string { return strconv.Itoa(n) }

// read100 reads "100 Continue" off br, failing the test if anything else
// comes first.
func read100(t *testing.T, br *bufio.Reader) {
	t.Helper()
	const want = "HTTP/1.1 100 Continue\r\n\r\n"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

// TestExpectContinue: a request with "Expect: 100-continue" stays on the
// fast path, whether its body is read ahead (BodyLimit) or by its
// handler: its client, waiting for 100 Continue before it sends the
// body, gets it, then its answer, and the connection serves the next
// request. A body the handler does not take gets no 100 Continue: its
// answer comes first, with Connection: close, and the connection closes.
func TestExpectContinue(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refuse" {
			http.Error(w, "refused", http.StatusForbidden)
			return
		}
		echoLen().ServeHTTP(w, r)
	})
	for _, tc := range []struct {
		name      string
		bodyLimit func(*http.Request) int64
	}{
		{"read ahead", func(r *http.Request) int64 {
			if r.URL.Path == "/refuse" {
				return 0
			}
			return 1 << 20
		}},
		{"read by the handler", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, addr := startH1(t, h, func(s *Server) {
				s.BodyLimit = tc.bodyLimit
				s.Fallback = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					t.Errorf("%s %s handed over to Fallback", r.Method, r.URL)
				}), MaxHeaderBytes: testMaxHeader, ErrorLog: quietLog()}
			})
			c, br := dial(t, addr)
			for i, size := range []int{5, 100 << 10} {
				io.WriteString(c, expectHead("/x", size))
				read100(t, br)
				io.WriteString(c, strings.Repeat("b", size))
				r, err := readWireResponse(br, "PUT")
				if err != nil || r.status != "HTTP/1.1 200 OK" || r.body != "read "+itoa(size) {
					t.Fatalf("PUT %d: %v, %v", i, r, err)
				}
			}
			if r := roundTrip(t, c, br, "/"); r.body != "read 0" {
				t.Fatalf("GET after the PUTs: %v", r)
			}

			c, br = dial(t, addr)
			io.WriteString(c, expectHead("/refuse", 5))
			r, err := readWireResponse(br, "PUT")
			if err != nil || r.status != "HTTP/1.1 403 Forbidden" || !strings.Contains(r.String(), "Connection: close") {
				t.Fatalf("refused PUT: %v, %v; want 403 without 100 Continue, Connection: close", r, err)
			}
			c.(*net.TCPConn).CloseWrite() // ends the linger
			waitClosed(t, br)
			if st := s.ConnStats(); st.HandoversRefused != 0 {
				t.Errorf("HandoversRefused = %d", st.HandoversRefused)
			}
		})
	}
}

// TestExpectHeldHeadsRefuseNoOne: connections that send an Expect head
// and never their body, more of them than Fallback may hold
// (handedLimit), wait on the fast path: another client's Expect PUT still
// gets its 100 Continue and its answer, not 503. Handed to Fallback, each
// held a goroutine and a place of handedLimit for the read timeout, and
// 64 of them (a thirty-second of the connection cap) refused every
// curl -T and PHP CURLOPT_PUT upload.
func TestExpectHeldHeadsRefuseNoOne(t *testing.T) {
	s, addr := startH1(t, echoLen(), func(s *Server) {
		s.MaxConns = 200 // handedLimit: 64
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
	limit := int(s.handedLimit())
	for range limit + 8 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, expectHead("/held", 1000))
	}
	// Every head is read: its connection waits for the body in the
	// poller, or (handed over) in Fallback, which takes limit at most.
	if !eventually(func() bool { return readingCount(s)+int(s.handed.Load()) >= limit }) {
		t.Fatalf("%d connections wait in the poller and %d in Fallback, want %d in all", readingCount(s), s.handed.Load(), limit+8)
	}
	c, br := dial(t, addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, expectHead("/x", 5))
	read100(t, br)
	io.WriteString(c, "hello")
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.body != "read 5" {
		t.Fatalf("PUT beside %d held Expect heads: %v, %v", limit+8, r, err)
	}
	eventually(func() bool { return readingCount(s) == limit+8 })
	if st := s.ConnStats(); st.HandoversRefused != 0 || s.handed.Load() != 0 || readingCount(s) != limit+8 {
		t.Errorf("HandoversRefused = %d, handed = %d, waiting in the poller %d; want 0, 0, %d", st.HandoversRefused, s.handed.Load(), readingCount(s), limit+8)
	}
}

// TestExpectRefusedByBudget: a body read ahead that the budget has no
// room for gets its answer (the handler's 503) without 100 Continue,
// with Connection: close, and the connection closes: its client has not
// been asked for the body.
func TestExpectRefusedByBudget(t *testing.T) {
	bg := budget.New(8 << 10) // less than a body's first buffer (aheadChunk)
	_, addr := startH1(t, echoLen(), func(s *Server) {
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
	c, br := dial(t, addr)
	io.WriteString(c, expectHead("/x", 100<<10))
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.status != "HTTP/1.1 503 Service Unavailable" || !strings.Contains(r.String(), "Connection: close") {
		t.Fatalf("%v, %v; want 503 without 100 Continue, Connection: close", r, err)
	}
	c.(*net.TCPConn).CloseWrite() // ends the linger
	waitClosed(t, br)
	if !eventually(func() bool { return bg.Used() == 0 }) {
		t.Errorf("budget holds %d bytes after the request", bg.Used())
	}
}
