package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
)

// readingCount is how many connections s's poller holds parked
// mid-request.
func readingCount(s *Server) int { return inPoller(s, func(p *poller) int { return len(p.reading) }) }

// TestSilentConnsHoldNoWorker: connections that send nothing, or only
// part of a head, wait in the poller, not on workers, so that with a
// single worker a client that sends a whole request is still served at
// once (issue #16: silent connections stalled every client).
func TestSilentConnsHoldNoWorker(t *testing.T) {
	const n = 50
	s, addr := startH1(t, testHandler(), func(s *Server) {
		s.pollWorkers = 1
		s.ReadHeaderTimeout = time.Minute
	})
	for i := range n {
		c, _ := dial(t, addr)
		if i%2 == 1 {
			io.WriteString(c, "GET /small HTTP/1.1\r\nHo") // part of a head
		}
	}
	if !eventually(func() bool { return readingCount(s) == n }) {
		t.Fatalf("%d connections parked mid-request, want %d", readingCount(s), n)
	}
	for range 3 {
		c, br := dial(t, addr)
		start := time.Now()
		if r := roundTrip(t, c, br, "/small"); r.body != "hello world" {
			t.Fatalf("got %v", r)
		}
		if d := time.Since(start); d > 3*time.Second { // behind them, it would wait for their minute
			t.Errorf("a new connection's request took %v behind %d silent ones", d, n)
		}
	}
}

// TestSlowHeadCompletes: a head sent a few bytes at a time, with the
// connection parked in between, is served whole.
func TestSlowHeadCompletes(t *testing.T) {
	s, addr := startH1(t, testHandler(), func(s *Server) { s.pollWorkers = 1 })
	c, br := dial(t, addr)
	roundTrip(t, c, br, "/small") // the second request is not the first
	head := "GET /small HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("p", 100) + "\r\n\r\n"
	for i := 0; i < len(head); i += 7 {
		io.WriteString(c, head[i:min(i+7, len(head))])
		time.Sleep(2 * time.Millisecond)
	}
	r, err := readWireResponse(br, "GET")
	if err != nil || r.body != "hello world" {
		t.Fatalf("slow head answered %v, %v", r, err)
	}
	if got := readingCount(s); got != 0 {
		t.Errorf("%d connections still parked mid-request", got)
	}
}

// echoLen answers the length of the body it read, or the read's error.
func echoLen() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "read %d: %v", len(b), err)
			return
		}
		fmt.Fprintf(w, "read %d", len(b))
	})
}

// TestReadAhead: a body its handler takes (BodyLimit) is read whole,
// with the connection parked while it trickles in, before the handler
// runs; its bytes are held against the budget until the handler has
// read them.
func TestReadAhead(t *testing.T) {
	var entered atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		echoLen().ServeHTTP(w, r)
	})
	bg := budget.New(1 << 20)
	s, addr := startH1(t, h, func(s *Server) {
		s.pollWorkers = 1
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 256 << 10 }
	})
	const size = 100 << 10
	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
	chunk := strings.Repeat("b", 10<<10)
	for sent := 0; sent < size; sent += len(chunk) {
		io.WriteString(c, chunk)
		if sent == 5*len(chunk) {
			if !eventually(func() bool { return readingCount(s) == 1 }) {
				t.Fatal("the connection did not park while its body came")
			}
			if entered.Load() != 0 {
				t.Fatal("the handler ran before its body came")
			}
			// Another client is served meanwhile by the only worker.
			c2, br2 := dial(t, addr)
			if r := roundTrip(t, c2, br2, "/"); r.body != "read 0" {
				t.Fatalf("other client: %v", r)
			}
		}
	}
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.body != fmt.Sprintf("read %d", size) {
		t.Fatalf("PUT answered %v, %v", r, err)
	}
	if !eventually(func() bool { return bg.Used() == 0 }) {
		t.Errorf("budget holds %d bytes after the request", bg.Used())
	}
	// The connection is still good.
	if r := roundTrip(t, c, br, "/"); r.body != "read 0" {
		t.Errorf("next request: %v", r)
	}
}

// TestReadAheadBudget: a body the budget refuses reaches the handler as
// a read error (the gateway answers 503), the connection closes after
// the response, and the budget holds nothing afterwards; a declared
// Content-Length alone reserves nothing.
func TestReadAheadBudget(t *testing.T) {
	bg := budget.New(64 << 10)
	s, addr := startH1(t, echoLen(), func(s *Server) {
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
	// Declared but not sent: nothing is held for it once its head is
	// read and the connection waits for the body.
	c0, _ := dial(t, addr)
	io.WriteString(c0, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n")
	if !eventually(func() bool {
		return inPoller(s, func(p *poller) bool { return len(p.reading) == 1 && p.reading[0].phase == phaseBody })
	}) {
		t.Fatal("the connection does not wait for its body in the poller")
	}
	if u := bg.Used(); u > aheadChunk {
		t.Errorf("a declared body without bytes holds %d bytes of budget", u)
	}

	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", 200<<10)
	go io.WriteString(c, strings.Repeat("b", 200<<10))
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.status != "HTTP/1.1 503 Service Unavailable" || !strings.Contains(r.body, budget.ErrExhausted.Error()) {
		t.Fatalf("over budget: %v, %v", r, err)
	}
	waitClosed(t, br)
	c0.Close()
	if !eventually(func() bool { return bg.Used() == 0 }) {
		t.Errorf("budget holds %d bytes after the requests", bg.Used())
	}
}

// TestReadAheadBudgetRefusalLingers: a body the budget refuses with
// less than maxDiscard of it still to come, its client still sending, is
// answered 503 and its connection lingers, dropping what comes, holding
// no budget, instead of closing with bytes unread: that resets the
// connection, and a client still sending (curl, PHP) reports the failed
// upload, not the answer (RFC 9112 §9.6).
func TestReadAheadBudgetRefusalLingers(t *testing.T) {
	const size = 200 << 10 // refused at 64 KiB: less than maxDiscard to come
	bg := budget.New(64 << 10)
	s, addr := startH1(t, echoLen(), func(s *Server) {
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
		s.lingerIdle = 5 * time.Second
	})
	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
	if _, err := c.Write(bytes.Repeat([]byte("b"), size-1)); err != nil { // all but one byte: the client is not done
		t.Fatal(err)
	}
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.status != "HTTP/1.1 503 Service Unavailable" || !strings.Contains(r.body, budget.ErrExhausted.Error()) {
		t.Fatalf("over budget: %v, %v", r, err)
	}
	if !eventually(func() bool {
		return inPoller(s, func(p *poller) bool { return len(p.reading) == 1 && p.reading[0].phase == phaseLinger })
	}) {
		t.Fatal("the refused connection does not linger in the poller")
	}
	if u := bg.Used(); u != 0 {
		t.Errorf("the lingering connection holds %d bytes of the budget", u)
	}
	c.Write([]byte("b"))
	c.(*net.TCPConn).CloseWrite() // ends the linger
	waitClosed(t, br)
}

// TestReadAheadBudgetClosedBody: as TestReadAheadBudget, with a handler
// that closes the body it failed to read: the connection, whose place in
// the stream is lost, still closes after the response.
func TestReadAheadBudgetClosedBody(t *testing.T) {
	bg := budget.New(64 << 10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	_, addr := startH1(t, h, func(s *Server) {
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", 200<<10)
	go io.WriteString(c, strings.Repeat("b", 200<<10))
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.status != "HTTP/1.1 503 Service Unavailable" {
		t.Fatalf("over budget: %v, %v", r, err)
	}
	waitClosed(t, br)
}

// TestReadAheadEarlyEOF: a client that stops halfway gets the handler's
// answer to the short body, as from a body read from the connection.
func TestReadAheadEarlyEOF(t *testing.T) {
	_, addr := startH1(t, echoLen(), func(s *Server) {
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
	c, br := dial(t, addr)
	io.WriteString(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
	io.WriteString(c, strings.Repeat("b", 50000))
	c.(*net.TCPConn).CloseWrite()
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.body != "read 50000: unexpected EOF" {
		t.Fatalf("short body answered %v, %v", r, err)
	}
}

// TestBothLengthsRefused: Content-Length with Transfer-Encoding is
// answered 400 and the connection closed, pipelined requests unanswered.
func TestBothLengthsRefused(t *testing.T) {
	_, addr := startH1(t, echoLen(), nil)
	for _, raw := range []string{
		"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\ncontent-length: 0\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		c, br := dial(t, addr)
		io.WriteString(c, raw)
		all, err := io.ReadAll(br)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("read: %v", err)
		}
		if string(all) != guardBothLengths {
			t.Errorf("%q answered %q, want %q", raw, all, guardBothLengths)
		}
	}
}

// TestNewConnHeaderTimeout: a connection that never sends is closed
// after the header timeout, from the poller.
func TestNewConnHeaderTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	_, addr := startH1(t, testHandler(), func(s *Server) { s.ReadHeaderTimeout = timeout })
	start := time.Now() // before the dial: the server's clock starts at the accept
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadByte(); err == nil {
		t.Fatal("read a byte, want the connection closed")
	}
	if d := time.Since(start); d < timeout*3/4 || d > 20*timeout { // generous above (a loaded machine is late), below the 5 s deadline
		t.Errorf("closed after %v, want about %v", d, timeout)
	}
}

// TestReadAheadTurns: a body larger than a worker's turn is read over
// several turns, whole and in order.
func TestReadAheadTurns(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		ok := err == nil && len(b) == 1<<20
		for i := range b {
			ok = ok && b[i] == byte(i%251)
		}
		fmt.Fprint(w, ok)
	})
	_, addr := startH1(t, h, func(s *Server) {
		s.pollWorkers = 1
		s.BodyLimit = func(*http.Request) int64 { return 2 << 20 }
	})
	body := make([]byte, 1<<20)
	for i := range body {
		body[i] = byte(i % 251)
	}
	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", len(body))
	go c.Write(body)
	if r, err := readWireResponse(br, "PUT"); err != nil || r.body != "true" {
		t.Fatalf("1 MiB body: %v, %v", r, err)
	}
}

// TestLingerWhileClientSends: a client refused while it still sends a
// large body, far more than the sockets' buffers, keeps sending and then
// reads the answer: the connection lingers as long as bytes come,
// instead of resetting the client. Each piece the client sends after the
// refusal parks the connection again with its deadline a linger time
// after the piece, not after the refusal: what closes it is the client
// sending nothing for the linger time. The test waits for each park
// (explicit state), so a loaded machine cannot close the connection
// under it: the linger time is longer than any stall and shorter than
// lingerMax, which caps the deadline.
func TestLingerWhileClientSends(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "refused")
	})
	const linger = lingerMax / 3
	s, addr := startH1(t, h, func(s *Server) { s.lingerIdle = linger })
	c, br := dial(t, addr)
	c.SetDeadline(time.Now().Add(lingerMax))
	// lingering is the deadline of the connection the poller holds
	// parked lingering after its answer, zero while there is none.
	lingering := func() time.Time {
		return inPoller(s, func(p *poller) time.Time {
			for _, pc := range p.reading {
				if pc.state.Load() == stateReading && pc.phase == phaseLinger {
					return pc.pf.deadline
				}
			}
			return time.Time{}
		})
	}
	// parkedAfter waits for the connection to be parked lingering with
	// a deadline a linger time after sent, at least.
	parkedAfter := func(sent time.Time, what string) {
		t.Helper()
		var d time.Time
		if !eventually(func() bool { d = lingering(); return !d.Before(sent.Add(linger)) }) {
			t.Fatalf("%s: lingering until %v (zero: not lingering), want a linger time (%v) after %v at least", what, d, linger, sent)
		}
	}
	const size, piece = 2 << 20, 64 << 10
	sent := time.Now()
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
	parkedAfter(sent, "refused")
	for n := 0; n < size; n += piece {
		sent = time.Now()
		if _, err := c.Write([]byte(strings.Repeat("x", piece))); err != nil {
			t.Fatalf("after %d bytes the write failed: %v", n, err)
		}
		parkedAfter(sent, fmt.Sprintf("after %d bytes", n+piece))
	}
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.body != "refused" {
		t.Fatalf("got %v, %v; want the refusal", r, err)
	}
	waitClosed(t, br)
}

// TestLingerTakesTurns: a refused client that keeps sending as fast as it
// can lingers in turns with the other connections (it is queued again
// every aheadTurn bytes): with one worker, another client is served
// meanwhile, and the lingering one keeps being read.
func TestLingerTakesTurns(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "served")
	})
	_, addr := startH1(t, h, func(s *Server) { s.pollWorkers = 1 })
	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", int64(1)<<40)
	stop := make(chan struct{})
	defer close(stop)
	var sent atomic.Int64
	go func() {
		chunk := make([]byte, 256<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := c.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	if r, err := readWireResponse(br, "PUT"); err != nil || r.status != "HTTP/1.1 503 Service Unavailable" {
		t.Fatalf("PUT: %v, %v", r, err)
	}
	// The lingering connection is read: the client sends more than the
	// sockets' buffers hold (a few MiB on loopback).
	const beyondBuffers = 32 << 20
	readOn := func(what string) {
		t.Helper()
		from := sent.Load()
		if !eventually(func() bool { return sent.Load()-from > beyondBuffers }) {
			t.Fatalf("%s: %d bytes sent, want more than %d: the lingering connection is not read", what, sent.Load()-from, beyondBuffers)
		}
	}
	readOn("after the answer")
	c2, br2 := dial(t, addr)
	c2.SetDeadline(time.Now().Add(10 * time.Second))
	if r := roundTrip(t, c2, br2, "/"); r.body != "served" {
		t.Fatalf("other client while one lingers: %v", r)
	}
	readOn("after the other client was served")
}

// TestLingerParks: a connection closed with an unread body waits for the
// client in the poller, not on a worker, and is closed when the client
// closes.
func TestLingerParks(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "not read") })
	s, addr := startH1(t, h, func(s *Server) { s.pollWorkers = 1 })
	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", 1<<20)
	io.WriteString(c, strings.Repeat("x", 300<<10)) // more than net/http drops to keep the connection
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.body != "not read" {
		t.Fatalf("got %v, %v", r, err)
	}
	if !eventually(func() bool { return readingCount(s) == 1 }) {
		t.Fatal("the lingering connection is not parked")
	}
	c2, br2 := dial(t, addr) // the one worker is free
	if r := roundTrip(t, c2, br2, "/"); r.body != "not read" {
		t.Fatalf("other client: %v", r)
	}
	c.Close()
	if !eventually(func() bool { return readingCount(s) == 0 }) {
		t.Error("the lingering connection stayed parked after the client closed")
	}
}

// TestLingerOutlastsPause: a client refused while it sends a large body,
// which pauses for a second and a half mid-body (a slow link, a busy
// client), still reads its answer: a lingering connection waits as long
// as nginx's lingering_timeout for more bytes, not net/http's 500 ms.
func TestLingerOutlastsPause(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "refused")
	})
	_, addr := startH1(t, h, nil)
	c, br := dial(t, addr)
	const size, piece = 4 << 20, 256 << 10
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
	for sent := 0; sent < size; sent += piece {
		if sent == size/2 {
			time.Sleep(1500 * time.Millisecond)
		}
		if _, err := c.Write([]byte(strings.Repeat("x", piece))); err != nil {
			t.Fatalf("after %d bytes and a pause the write failed: %v", sent, err)
		}
	}
	r, err := readWireResponse(br, "PUT")
	if err != nil || !strings.Contains(r.status, " 503 ") || r.body != "refused" {
		t.Fatalf("answer after the pause: %v, %v; want the 503", r, err)
	}
}

// TestReadAheadHoldsWholeBody: once a body's first reserveAfter bytes
// (16 KiB and an eighth of it) have come, it holds the budget for all of
// its Content-Length, or is refused then, before the rest is read:
// bodies that together pass the budget are not each refused halfway
// through. Before that its buffer doubles.
func TestReadAheadHoldsWholeBody(t *testing.T) {
	tests := []struct {
		name   string
		budget int64
		cl     int    // declared
		first  int    // sent before the check
		want   string // "held": the budget holds cl while the rest is awaited; else the status
	}{
		{"fits: held whole", 1 << 20, 300 << 10, 40 << 10, "held"},
		{"does not fit: refused at once", 256 << 10, 1 << 20, 160 << 10, "HTTP/1.1 503 Service Unavailable"},
		{"first bytes only: doubles", 1 << 20, 300 << 10, 1 << 10, "small"},
		{"less than an eighth: doubles", 1 << 20, 1 << 20, 64 << 10, "doubling"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg := budget.New(tt.budget)
			s, addr := startH1(t, echoLen(), func(s *Server) {
				s.Budget = bg
				s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
			})
			c, br := dial(t, addr)
			fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", tt.cl)
			io.WriteString(c, strings.Repeat("b", tt.first))
			switch tt.want {
			case "held":
				if !eventually(func() bool { return bg.Used() >= int64(tt.cl) }) {
					t.Fatalf("budget holds %d bytes after %d of %d came, want all of them", bg.Used(), tt.first, tt.cl)
				}
			case "small", "doubling":
				most := int64(aheadChunk)
				if tt.want == "doubling" {
					most = int64(2 * tt.first) // what doubling buffers hold
				}
				if !eventually(func() bool {
					return inPoller(s, func(p *poller) bool { return len(p.reading) == 1 && p.reading[0].phase == phaseBody })
				}) {
					t.Fatal("the connection does not wait for the rest of its body in the poller")
				}
				if u := bg.Used(); u > most {
					t.Fatalf("budget holds %d bytes after %d of %d came, want at most %d", u, tt.first, tt.cl, most)
				}
			default:
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				r, err := readWireResponse(br, "PUT")
				if err != nil || r.status != tt.want {
					t.Fatalf("with %d of %d bytes sent: %v, %v; want %s before the rest", tt.first, tt.cl, r, err, tt.want)
				}
				c.Close()
				if !eventually(func() bool { return bg.Used() == 0 }) {
					t.Errorf("budget holds %d bytes after the refusal", bg.Used())
				}
				return
			}
			io.WriteString(c, strings.Repeat("b", tt.cl-tt.first))
			if r, err := readWireResponse(br, "PUT"); err != nil || r.body != fmt.Sprintf("read %d", tt.cl) {
				t.Fatalf("got %v, %v", r, err)
			}
			if !eventually(func() bool { return bg.Used() == 0 }) {
				t.Errorf("budget holds %d bytes after the request", bg.Used())
			}
		})
	}
}

// timeoutAnswer answers 408 with the error of a body read that reached
// its deadline, as the gateway does, and 503 with any other.
func timeoutAnswer() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		switch {
		case isTimeout(err):
			w.WriteHeader(http.StatusRequestTimeout)
			fmt.Fprintf(w, "read %d: timeout", len(b))
		case err != nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "read %d: %v", len(b), err)
		default:
			fmt.Fprintf(w, "read %d", len(b))
		}
	})
}

// TestReadAheadTimeoutAnswered: a body read ahead that stops short of
// its Content-Length waits in the poller, holding no worker, until the
// read timeout; a worker then hands its request to the handler with a
// body that fails with a timeout (net.Error), so that the handler
// answers it (the gateway: 408), with Connection: close. The connection
// then lingers, holding none of the budget, and is not counted as a
// header timeout: its request reached a handler.
func TestReadAheadTimeoutAnswered(t *testing.T) {
	bg := budget.New(1 << 20)
	const linger = 300 * time.Millisecond
	s, addr := startH1(t, timeoutAnswer(), func(s *Server) {
		s.pollWorkers = 1
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
		s.ReadTimeout = 300 * time.Millisecond
		s.lingerIdle = linger
	})
	c, br := dial(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.status != "HTTP/1.1 408 Request Timeout" || r.body != "read 10: timeout" {
		t.Fatalf("a body stopped short: %v, %v; want the handler's 408", r, err)
	}
	if !slices.Contains(r.headers, "Connection: close") {
		t.Errorf("408 headers %q, want Connection: close", r.headers)
	}
	// Lingering: parked, holding no budget and no worker.
	if !eventually(func() bool {
		return inPoller(s, func(p *poller) bool {
			return len(p.reading) == 1 && p.reading[0].phase == phaseLinger
		})
	}) {
		t.Fatal("the answered connection does not linger in the poller")
	}
	if u := bg.Used(); u != 0 {
		t.Errorf("the lingering connection holds %d bytes of the budget", u)
	}
	c2, br2 := dial(t, addr) // the one worker is free
	io.WriteString(c2, "PUT /y HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
	if r, err := readWireResponse(br2, "PUT"); err != nil || r.body != "read 3" {
		t.Fatalf("other client: %v, %v", r, err)
	}
	io.WriteString(c, strings.Repeat("x", 90)) // too late: dropped
	waitClosed(t, br)
	if st := s.ConnStats(); st.HeaderTimeouts != 0 {
		t.Errorf("HeaderTimeouts %d, want 0: the request was answered", st.HeaderTimeouts)
	}
}

// TestReadAheadTimeoutTrickle: a body that keeps coming a few bytes at a
// time, never stopping for long, is cut short at the read timeout all
// the same (it counts the whole request, not the gaps between bytes) and
// answered by its handler; what the client sends after is dropped while
// the connection lingers, until the client closes.
func TestReadAheadTimeoutTrickle(t *testing.T) {
	bg := budget.New(1 << 20)
	_, addr := startH1(t, timeoutAnswer(), func(s *Server) {
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
		s.ReadTimeout = 300 * time.Millisecond
	})
	c, br := dial(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
	stop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if _, err := io.WriteString(c, "0123456789"); err != nil {
				return
			}
		}
	}()
	r, err := readWireResponse(br, "PUT")
	close(stop)
	<-sent
	if err != nil || r.status != "HTTP/1.1 408 Request Timeout" || !strings.HasSuffix(r.body, ": timeout") {
		t.Fatalf("a trickling body: %v, %v; want the handler's 408", r, err)
	}
	if !slices.Contains(r.headers, "Connection: close") {
		t.Errorf("408 headers %q, want Connection: close", r.headers)
	}
	c.(*net.TCPConn).CloseWrite()
	waitClosed(t, br)
	if !eventually(func() bool { return bg.Used() == 0 }) {
		t.Errorf("budget holds %d bytes after the request", bg.Used())
	}
}

// TestDeclaredBodiesHoldNoBudget: bodies read ahead hold none of the
// budget, and no buffer, before a first buffer's worth of them has come
// (aheadChunk, or a smaller body whole): heads that declare a body and
// send nothing, a few bytes, or expect 100 Continue and send nothing
// after it wait in the poller holding nothing, and another client's body
// is read and served. Each held 16 KiB of the budget for the read
// timeout: 4,096 of them took the default 64 MiB.
func TestDeclaredBodiesHoldNoBudget(t *testing.T) {
	bg := budget.New(64 << 10)
	s, addr := startH1(t, echoLen(), func(s *Server) {
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
	const each = 6 // 18 × 16 KiB would be 288 KiB
	for i := range 3 * each {
		c, br := dial(t, addr)
		switch i % 3 {
		case 0:
			fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
		case 1:
			fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n%s", strings.Repeat("b", 1000))
		case 2:
			fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n")
			read100(t, br)
		}
	}
	if !eventually(func() bool { return readingCount(s) == 3*each }) {
		t.Errorf("%d connections wait for their bodies in the poller, want %d", readingCount(s), 3*each)
	}
	if u := bg.Used(); u != 0 {
		t.Errorf("bodies that have not come hold %d bytes of the budget", u)
	}
	c, br := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 40000\r\n\r\n")
	go io.WriteString(c, strings.Repeat("b", 40000))
	r, err := readWireResponse(br, "PUT")
	if err != nil || r.body != "read 40000" {
		t.Fatalf("a body beside %d declared ones: %v, %v", 3*each, r, err)
	}
}
