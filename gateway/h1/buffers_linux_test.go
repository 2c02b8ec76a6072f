package h1

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/bufpool/bufpooltest"
)

// startLending serves h with read ahead up to 1 MiB into buffers from
// l, with one worker, under bg, with the read timeout rt (0: none).
func startLending(t *testing.T, h http.Handler, l *bufpooltest.Lender, bg *budget.Budget, rt time.Duration) (*Server, string) {
	return startH1(t, h, func(s *Server) {
		s.pollWorkers = 1
		s.ReadTimeout = rt
		s.Budget = bg
		s.Buffers = l
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
}

// sendParked sends head and the first part of its body, waits until the
// connection is parked reading the rest, and then sends rest in one
// write: the read ahead then finds whatever follows the body in the
// same read.
func sendParked(t *testing.T, s *Server, c net.Conn, head, part, rest string) {
	t.Helper()
	io.WriteString(c, head+part)
	if !eventually(func() bool { return readingCount(s) == 1 }) {
		t.Fatal("the connection did not park while its body came")
	}
	io.WriteString(c, rest)
}

// TestReadAheadStopsAtBodyEnd: a body read ahead into a lent buffer
// larger than the body ends at its Content-Length: the request pipelined
// after it is served, not swallowed into the body's buffer.
func TestReadAheadStopsAtBodyEnd(t *testing.T) {
	tests := []struct {
		name string
		size int
		take bool // the handler takes the body (TakeAhead) rather than read it
	}{
		{"read, small class", 5000, false},
		{"read, large class", 100_000, false},
		{"taken, small class", 5000, true},
		{"taken, large class", 100_000, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := bufpooltest.New()
			bg := budget.New(4 << 20)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var b []byte
				if tt.take && r.ContentLength > 0 {
					if b = TakeAhead(r); b == nil {
						fmt.Fprint(w, "not taken")
						return
					}
					defer l.Put(b)
				} else {
					var err error
					if b, err = io.ReadAll(r.Body); err != nil {
						fmt.Fprintf(w, "read %d: %v", len(b), err)
						return
					}
				}
				fmt.Fprintf(w, "read %d %s", len(b), bytes.Trim(b, "b"))
			})
			s, addr := startLending(t, h, l, bg, 0)
			c, br := dial(t, addr)
			head := fmt.Sprintf("PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", tt.size)
			body := strings.Repeat("b", tt.size)
			sendParked(t, s, c, head, body[:1000], body[1000:]+"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
			r, err := readWireResponse(br, "PUT")
			if want := fmt.Sprintf("read %d ", tt.size); err != nil || r.body != want {
				t.Errorf("PUT answered %q, %v; want %q", r.body, err, want)
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			r, err = readWireResponse(br, "GET")
			if err != nil || r.body != "read 0 " {
				t.Errorf("the GET pipelined after the body: %v, %v; want \"read 0 \"", r, err)
			}
			if !eventually(func() bool { return bg.Used() == 0 && l.Lent() == 0 }) {
				t.Errorf("after the requests: budget holds %d bytes, %d buffers not given back", bg.Used(), l.Lent())
			}
			l.Check(t)
		})
	}
}

// TestBodyBuffersGoBack: the connection gives back the buffer of a body
// it read ahead once nothing can read it (read out, dropped unread, or a
// body cut short at the read timeout, once its handler answered), never
// one a handler took, and never twice; after a body its client cut
// short, which its handler saw, it leaves the buffer to the garbage
// collector. The budget the connection held is given back every time.
func TestBodyBuffersGoBack(t *testing.T) {
	const size = 50_000
	body := strings.Repeat("b", size)
	head := fmt.Sprintf("PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
	tests := []struct {
		name     string
		read     int  // bytes the handler reads; -1: all of it
		take     bool // the handler takes the body and keeps it over the next request
		timeout  bool // the body does not come within the read timeout
		cut      bool // the client ends its side before the body is whole
		wantLent int  // buffers left out after the request
	}{
		{name: "read out", read: -1},
		{name: "left unread", read: 0},
		{name: "partly read", read: 10},
		{name: "taken", take: true},
		{name: "timed out mid-body", read: -1, timeout: true},
		{name: "cut short", read: -1, cut: true, wantLent: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := bufpooltest.New()
			bg := budget.New(4 << 20)
			kept := make(chan []byte, 2)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.take {
					b := TakeAhead(r)
					l.Hold(b)
					kept <- b
					fmt.Fprintf(w, "took %d", len(b))
					return
				}
				var err error
				n := 0
				if tt.read < 0 {
					var b []byte
					b, err = io.ReadAll(r.Body)
					n = len(b)
				} else {
					n, err = io.ReadFull(r.Body, make([]byte, tt.read))
				}
				fmt.Fprintf(w, "read %d %v", n, err)
			})
			var rt time.Duration
			if tt.timeout {
				rt = 100 * time.Millisecond
			}
			s, addr := startLending(t, h, l, bg, rt)
			c, br := dial(t, addr)
			switch {
			case tt.timeout:
				sendParked(t, s, c, head, body[:1000], "")
				r, err := readWireResponse(br, "PUT")
				if want := "read 1000 " + errBodyTimeout.Error(); err != nil || r.body != want {
					t.Errorf("PUT answered %q, %v; want %q", r.body, err, want)
				}
				c.(*net.TCPConn).CloseWrite() // ends the linger
				waitClosed(t, br)
			case tt.cut:
				sendParked(t, s, c, head, body[:1000], body[1000:2000])
				c.(*net.TCPConn).CloseWrite()
				r, err := readWireResponse(br, "PUT")
				if want := "read 2000 unexpected EOF"; err != nil || r.body != want {
					t.Errorf("PUT answered %q, %v; want %q", r.body, err, want)
				}
			default:
				// Twice on one connection: a buffer given back too early,
				// or twice, is lent for the second body.
				for _, fill := range []string{"b", "c"} {
					sendParked(t, s, c, head, strings.Repeat(fill, 1000), strings.Repeat(fill, size-1000))
					r, err := readWireResponse(br, "PUT")
					want := fmt.Sprintf("read %d <nil>", max(tt.read, 0))
					switch {
					case tt.take:
						want = fmt.Sprintf("took %d", size)
					case tt.read < 0:
						want = fmt.Sprintf("read %d <nil>", size)
					}
					if err != nil || r.body != want {
						t.Errorf("PUT answered %q, %v; want %q", r.body, err, want)
					}
				}
			}
			if tt.take {
				for _, fill := range []byte("bc") {
					b := <-kept
					if i := bytes.IndexFunc(b, func(r rune) bool { return r != rune(fill) }); i >= 0 {
						t.Errorf("a taken body changed while its handler kept it: byte %d is %#x, want %q", i, b[i], fill)
					}
					l.Release(b)
					l.Put(b)
				}
			}
			if !eventually(func() bool { return bg.Used() == 0 && l.Lent() == tt.wantLent }) {
				t.Errorf("after the requests: budget holds %d bytes, %d buffers not given back, want %d", bg.Used(), l.Lent(), tt.wantLent)
			}
			l.Check(t)
		})
	}
}

// TestSpillBuffersGoBack: what a detached response's client does not
// take at once is kept in a buffer lent by Server.Buffers (grown from the
// pool if more is spilled), and given back once written; the client gets
// every byte.
func TestSpillBuffersGoBack(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16) // twice: more than socket buffers hold
	finished := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		finish := w.(detacher).Detach()
		if finish == nil {
			t.Error("Detach declined")
			close(finished)
			return
		}
		go func() {
			w.Header().Set("Content-Length", strconv.Itoa(2*len(big)))
			w.Write(big) // spilled, mostly
			w.Write(big) // the spill grows
			finish()
			close(finished)
		}()
	})
	l := bufpooltest.New()
	_, addr := startLending(t, h, l, budget.New(64<<20), 0)
	c, br := dial(t, addr)
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
	<-finished // all written while the client read nothing: the socket filled, the rest spilled
	r, err := readWireResponse(br, "GET")
	if want := string(big) + string(big); err != nil || r.status != "HTTP/1.1 200 OK" || r.body != want {
		t.Fatalf("spilled response: %s, %d bytes, %v; want 200 with %d bytes", r.status, len(r.body), err, len(want))
	}
	if l.Lends() == 0 {
		t.Error("no buffer lent: the spill did not borrow")
	}
	if !eventually(func() bool { return l.Lent() == 0 }) {
		t.Errorf("%d buffers not given back", l.Lent())
	}
	l.Check(t)
}
