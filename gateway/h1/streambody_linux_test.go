package h1

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Bodies no BodyLimit takes are read by their handler from the
// connection itself (streamed), not ahead of it. These tests check that
// the read timeout bounds them as it bounds a body read ahead: counted
// from the request's start, answered by the handler, and lingered after.

// streamListeners are the two ways the fast path serves a connection:
// parked in the poller while it waits, or (plainListener: no RawConn)
// waiting in reads on its goroutine.
var streamListeners = []struct {
	name   string
	listen func(t *testing.T) net.Listener
}{
	{"poller", func(t *testing.T) net.Listener { return listen(t, "tcp") }},
	{"no poller", func(t *testing.T) net.Listener { return plainListener{listen(t, "tcp")} }},
}

// streamTimeoutHandler reads the body whole and answers what it read;
// one cut short by the read timeout gets 408, with Connection: close if
// closeConn, as the gateway answers it.
func streamTimeoutHandler(closeConn bool, started chan<- struct{}, proceed <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if started != nil {
			started <- struct{}{}
			<-proceed
		}
		b, err := io.ReadAll(r.Body)
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			if closeConn {
				w.Header().Set("Connection", "close")
			}
			w.WriteHeader(http.StatusRequestTimeout)
			fmt.Fprintf(w, "read %d: timeout", len(b))
		case err != nil:
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, "read %d: %v", len(b), err)
		default:
			fmt.Fprintf(w, "read %d", len(b))
		}
	})
}

// connCreated waits for s to track one connection and returns when it
// was accepted: the start of its first request, from which the header
// and read timeouts count.
func connCreated(t *testing.T, s *Server) time.Time {
	t.Helper()
	var created time.Time
	if !eventually(func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.conns {
			created = c.created
		}
		return !created.IsZero()
	}) {
		t.Fatal("the server tracks no connection")
	}
	return created
}

// TestStreamedBodyReadTimeoutFromRequestStart: the read timeout of a
// body its handler reads from the connection counts from the start of
// the request, not from the end of its head: a request whose head took
// the whole read timeout (within a longer header timeout) has no time
// left for its body, and the handler's first read of it fails with a
// timeout, as net/http's does. Counted from the head's end, a client
// could take the header timeout and the read timeout in all, and a
// handler streaming its body would be held that long. A chunked body,
// whose connection is handed over to Fallback after the fast path read
// its head, is counted from the same start, though net/http counts its
// own ReadTimeout from when it begins to read.
func TestStreamedBodyReadTimeoutFromRequestStart(t *testing.T) {
	const rt = 200 * time.Millisecond
	framings := []struct {
		name       string
		head, body string
	}{
		{"Content-Length", "Content-Length: 10\r\n\r\n", "0123456789"},
		{"chunked, handed over", "Transfer-Encoding: chunked\r\n\r\n", "a\r\n0123456789\r\n0\r\n\r\n"},
	}
	for _, l := range streamListeners {
		for _, f := range framings {
			t.Run(l.name+"/"+f.name, func(t *testing.T) {
				started, proceed := make(chan struct{}, 1), make(chan struct{})
				s, addr := startH1On(t, l.listen(t), streamTimeoutHandler(true, started, proceed), func(s *Server) {
					s.ReadHeaderTimeout, s.ReadTimeout = 10*time.Second, rt
					s.Fallback.ReadHeaderTimeout, s.Fallback.ReadTimeout = 10*time.Second, rt
				})
				t.Cleanup(func() { // before the server's, so that a failed test's handler ends
					select {
					case <-proceed:
					default:
						close(proceed)
					}
				})
				c, br := dial(t, addr)
				io.WriteString(c, "PUT /x HTTP/1.1\r\nHost: a\r\n")
				end := connCreated(t, s).Add(rt)
				for now := time.Now(); !now.After(end); now = time.Now() {
					time.Sleep(end.Sub(now) + time.Millisecond) // the head is not done by the read timeout
				}
				io.WriteString(c, f.head)
				<-started // the head is read: the body is the handler's to read
				io.WriteString(c, f.body)
				close(proceed)
				r, err := readWireResponse(br, "PUT")
				if err != nil || !strings.Contains(r.status, "408") || r.body != "read 0: timeout" {
					t.Fatalf("PUT whose head took the read timeout: %q %q, %v; want a 408 before any of its body is read", r.status, r.body, err)
				}
			})
		}
	}
}

// TestStreamedBodyTimeoutLingers: a body its handler reads from the
// connection, cut short at the read timeout and answered 408, with more
// or less than maxDiscard of it still to come and with or without the
// handler asking to close, leaves its connection lingering: a client
// still sending gets the answer, and a clean close once it stops, not a
// reset that loses the answer (RFC 9112 §9.6), as after a body read
// ahead cut short (0041).
func TestStreamedBodyTimeoutLingers(t *testing.T) {
	// Long enough for all that is sent to be read before it on a loaded
	// machine (what is left to come decides the case); the cases run in
	// parallel, so that it is waited for about once.
	const rt = 2 * time.Second
	sizes := []struct {
		name       string
		size, sent int
	}{
		{"more than maxDiscard to come", 4 * maxDiscard, 1000},
		{"less than maxDiscard to come", 2 * maxDiscard, maxDiscard + 1000},
	}
	for _, l := range streamListeners {
		for _, sz := range sizes {
			for _, closeConn := range []bool{true, false} {
				name := fmt.Sprintf("%s/%s/close=%v", l.name, sz.name, closeConn)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					s, addr := startH1On(t, l.listen(t), streamTimeoutHandler(closeConn, nil, nil), func(s *Server) {
						s.ReadTimeout, s.lingerIdle = rt, 5*time.Second
					})
					c, br := dial(t, addr)
					c.SetDeadline(time.Now().Add(rt + 10*time.Second))
					fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", sz.size)
					if _, err := c.Write(bytes.Repeat([]byte("b"), sz.sent)); err != nil {
						t.Fatal(err)
					}
					r, err := readWireResponse(br, "PUT")
					if want := fmt.Sprintf("read %d: timeout", sz.sent); err != nil || !strings.Contains(r.status, "408") || r.body != want {
						t.Fatalf("PUT cut at the read timeout: %q %q, %v; want a 408 saying %q", r.status, r.body, err, want)
					}
					if !hasHeader(r, "Connection: close") {
						t.Errorf("the 408 has headers %q, want Connection: close", r.headers)
					}
					if l.name == "poller" && !eventually(func() bool {
						return inPoller(s, func(p *poller) bool { return len(p.reading) == 1 && p.reading[0].phase == phaseLinger })
					}) {
						t.Fatal("the connection does not linger in the poller after its 408")
					}
					// The client goes on sending, then stops: the server
					// drops what comes and closes cleanly.
					if _, err := c.Write(bytes.Repeat([]byte("b"), 64<<10)); err != nil {
						t.Fatalf("sending after the 408: %v", err)
					}
					c.(*net.TCPConn).CloseWrite()
					if b, err := br.ReadByte(); err != io.EOF {
						t.Errorf("after the 408: read %q, %v; want the connection closed cleanly (EOF), not reset", b, err)
					}
				})
			}
		}
	}
}

// hasHeader reports whether r has the header line h.
func hasHeader(r wireResponse, h string) bool {
	for _, l := range r.headers {
		if l == h {
			return true
		}
	}
	return false
}

// TestHandedOverKeepsAliveAfterReadTimeout: the read deadline of the
// request a connection was handed over in bounds that request only: once
// it is served, the connection waits for its next one as long as
// Fallback's idle timeout allows, well past the first one's read
// timeout.
func TestHandedOverKeepsAliveAfterReadTimeout(t *testing.T) {
	const rt = 200 * time.Millisecond
	for _, l := range streamListeners {
		t.Run(l.name, func(t *testing.T) {
			_, addr := startH1On(t, l.listen(t), streamTimeoutHandler(true, nil, nil), func(s *Server) {
				s.ReadTimeout, s.IdleTimeout = rt, 10*time.Second
				s.Fallback.ReadTimeout, s.Fallback.IdleTimeout = rt, 10*time.Second
			})
			c, br := dial(t, addr)
			io.WriteString(c, "PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n0\r\n\r\n")
			if r, err := readWireResponse(br, "PUT"); err != nil || r.body != "read 10" {
				t.Fatalf("chunked PUT: %q %q, %v; want it read", r.status, r.body, err)
			}
			end := time.Now().Add(rt) // the first request began before its answer came
			for now := time.Now(); !now.After(end); now = time.Now() {
				time.Sleep(end.Sub(now) + time.Millisecond) // idle past the first request's read timeout
			}
			io.WriteString(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
			if r, err := readWireResponse(br, "PUT"); err != nil || r.body != "read 3" {
				t.Fatalf("second PUT after idling: %q %q, %v; want it read", r.status, r.body, err)
			}
		})
	}
}

// TestReadAheadAfterStreamedBody: a body read ahead (BodyLimit) behind
// one its handler streamed, pipelined so that its head is in the read
// buffer when the first answer is out, is read in its own read timeout:
// the deadline the streamed body left, passed while its handler worked
// on, does not cut it short.
func TestReadAheadAfterStreamedBody(t *testing.T) {
	const rt = 200 * time.Millisecond
	started := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 1000 {
			start := time.Now()
			started <- struct{}{}
			b, err := io.ReadAll(r.Body)
			if err != nil {
				w.WriteHeader(http.StatusRequestTimeout)
				return
			}
			for time.Since(start) <= rt { // the handler works past the body's deadline
				time.Sleep(rt - time.Since(start) + time.Millisecond)
			}
			fmt.Fprintf(w, "read %d", len(b))
			return
		}
		echoLen().ServeHTTP(w, r)
	})
	_, addr := startH1(t, h, func(s *Server) {
		s.ReadTimeout = rt
		s.BodyLimit = func(*http.Request) int64 { return 1000 }
	})
	c, br := dial(t, addr)
	io.WriteString(c, "PUT /streamed HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n"+strings.Repeat("s", 10))
	<-started // the head is read, the body not all there: the handler reads it from the connection
	io.WriteString(c, strings.Repeat("s", 1990)+"PUT /ahead HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n"+strings.Repeat("a", 10))
	if r, err := readWireResponse(br, "PUT"); err != nil || r.body != "read 2000" {
		t.Fatalf("streamed PUT: %q %q, %v; want it read", r.status, r.body, err)
	}
	io.WriteString(c, strings.Repeat("a", 90))
	if r, err := readWireResponse(br, "PUT"); err != nil || r.body != "read 100" {
		t.Fatalf("PUT read ahead after it: %q %q, %v; want it read", r.status, r.body, err)
	}
}
