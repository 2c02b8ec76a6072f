package h1

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pollerCounts reports how many connections s's poller has parked and
// registered, and how many connections s tracks.
func pollerCounts(t *testing.T, s *Server) (parked, registered, conns int) {
	t.Helper()
	s.mu.Lock()
	p := s.poller
	conns = len(s.conns)
	s.mu.Unlock()
	if p == nil {
		t.Fatal("no poller on Linux")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := p.oldest; c != nil; c = c.pf.newer {
		parked++
	}
	return parked, len(p.conns), conns
}

// inPoller returns f's result on s's poller, under the poller's lock, or
// T's zero value while s has no poller yet (Serve makes it).
func inPoller[T any](s *Server, f func(p *poller) T) T {
	s.mu.Lock()
	p := s.poller
	s.mu.Unlock()
	if p == nil {
		var zero T
		return zero
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return f(p)
}

// waitNoConns waits until s tracks, parks and registers no connection,
// and fails the test, saying when (what), if that does not come.
func waitNoConns(t *testing.T, s *Server, what string) {
	t.Helper()
	var parked, registered, conns int
	if !eventually(func() bool {
		parked, registered, conns = pollerCounts(t, s)
		return parked+registered+conns == 0
	}) {
		t.Errorf("%s: %d parked, %d registered, %d tracked; want none", what, parked, registered, conns)
	}
}

// takenCount reports how many connections workers of s have taken from
// the poller's queue.
func takenCount(s *Server) uint64 { return inPoller(s, func(p *poller) uint64 { return p.taken }) }

// blockingMux serves "ok" for every path but /block, which counts the
// requests in entered and answers "released" once release is closed.
func blockingMux() (mux *http.ServeMux, entered *atomic.Int32, release chan struct{}) {
	entered, release = new(atomic.Int32), make(chan struct{})
	mux = http.NewServeMux()
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		<-release
		io.WriteString(w, "released")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	return mux, entered, release
}

// parkedConns opens n connections to addr that have each had two
// requests answered, the second by a worker after a park, and returns
// their readers.
func parkedConns(t *testing.T, addr string, n int) []*bufio.Reader {
	t.Helper()
	var brs []*bufio.Reader
	for range n {
		c, br := dial(t, addr)
		roundTrip(t, c, br, "/small")
		roundTrip(t, c, br, "/small")
		brs = append(brs, br)
	}
	return brs
}

// TestParkedConnsHoldNoGoroutine: keep-alive connections between
// requests cost no goroutine, and every one of them is served again when
// its next request comes, however many come at once.
func TestParkedConnsHoldNoGoroutine(t *testing.T) {
	const n = 300
	s, addr := startH1(t, testHandler(), nil)
	base := runtime.NumGoroutine()
	type client struct {
		c  net.Conn
		br *bufio.Reader
	}
	clients := make([]client, n)
	for i := range clients {
		c, br := dial(t, addr)
		clients[i] = client{c, br}
		roundTrip(t, c, br, "/small") // on the connection's own goroutine
		roundTrip(t, c, br, "/small") // on a worker, after a park
	}
	var parked, registered, conns int
	if !eventually(func() bool {
		parked, registered, conns = pollerCounts(t, s)
		return parked == n
	}) {
		t.Fatalf("parked %d of %d idle connections", parked, n)
	}
	if registered != n || conns != n {
		t.Errorf("registered %d, tracked %d, want %d each", registered, conns, n)
	}
	// A few workers may wait for the next ready connection; a goroutine
	// per connection would be n more.
	if extra := runtime.NumGoroutine() - base; extra > 20 {
		t.Errorf("%d goroutines more than before %d idle connections, want at most 20", extra, n)
	}

	// All at once: each request wakes its connection.
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, cl := range clients {
		wg.Go(func() {
			if _, err := io.WriteString(cl.c, "GET /small HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
				errs <- err
				return
			}
			if r, err := readWireResponse(cl.br, "GET"); err != nil || r.body != "hello world" {
				errs <- fmt.Errorf("response %v, %v", r, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestParkedIdleTimeout: the idle timeout of a parked connection runs
// from its last response, each connection on its own clock. Each close
// is checked against the time before the request it follows, which it
// cannot precede however slow the machine. The two checks that depend on
// the machine's speed have half the timeout to spare: that the second's
// request comes before its first clock ends, and that the first closes
// before the second's request could have restarted its clock.
func TestParkedIdleTimeout(t *testing.T) {
	const idle = time.Second
	_, addr := startH1(t, testHandler(), func(s *Server) { s.IdleTimeout = idle })
	early, earlyBR := dial(t, addr)
	late, lateBR := dial(t, addr)
	for _, c := range []net.Conn{early, late} {
		c.SetDeadline(time.Now().Add(idle + 10*time.Second)) // a close, however slow
	}
	earlySent := time.Now()
	roundTrip(t, early, earlyBR, "/small")
	roundTrip(t, late, lateBR, "/small")
	time.Sleep(idle / 2)
	lateSent := time.Now()
	roundTrip(t, late, lateBR, "/small") // its clock starts again

	waitClosed(t, earlyBR)
	earlyClosed := time.Now()
	if d := earlyClosed.Sub(earlySent); d < idle {
		t.Errorf("first connection closed %v after its last request, want %v or more", d, idle)
	}
	if d := earlyClosed.Sub(lateSent); d >= idle {
		t.Errorf("first connection closed %v after the second's last request, want before its %v idle timeout: the second's request restarted its clock", d, idle)
	}
	waitClosed(t, lateBR)
	if d := time.Since(lateSent); d < idle {
		t.Errorf("second connection closed %v after its last request, want %v or more", d, idle)
	}
}

// TestPollerStall: when every worker waits in a handler, ready
// connections beyond the worker cap still get workers, within
// milliseconds, instead of waiting for the handlers.
func TestPollerStall(t *testing.T) {
	const workers, blocked = 2, 6
	mux, entered, release := blockingMux()
	_, addr := startH1(t, mux, func(s *Server) { s.pollWorkers = workers })
	defer close(release)

	type client struct {
		c  net.Conn
		br *bufio.Reader
	}
	var clients []client
	for range blocked + 1 {
		c, br := dial(t, addr)
		roundTrip(t, c, br, "/") // then parked
		clients = append(clients, client{c, br})
	}
	for _, cl := range clients[:blocked] {
		io.WriteString(cl.c, "GET /block HTTP/1.1\r\nHost: a\r\n\r\n")
	}
	if !eventually(func() bool { return entered.Load() == blocked }) {
		t.Fatalf("%d of %d blocking requests reached the handler with %d workers", entered.Load(), blocked, workers)
	}
	last := clients[blocked]
	start := time.Now()
	if r := roundTrip(t, last.c, last.br, "/"); r.body != "ok" {
		t.Errorf("response while every worker is blocked = %v, want ok", r)
	}
	if d := time.Since(start); d > 3*time.Second { // waiting for a worker, it would wait for the test's end
		t.Errorf("response while every worker is blocked took %v", d)
	}
}

// TestParkedClientClose: connections that the client closes while parked
// are closed and forgotten by the server.
func TestParkedClientClose(t *testing.T) {
	const n = 50
	s, addr := startH1(t, testHandler(), nil)
	for range n {
		c, br := dial(t, addr)
		roundTrip(t, c, br, "/small")
		c.Close()
	}
	waitNoConns(t, s, "after the clients closed")
}

// TestParkedHandover: a parked connection whose next request the fast
// path does not take goes to Fallback, and the poller lets go of it.
func TestParkedHandover(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, fast := w.(*response)
		fmt.Fprint(w, fast)
	})
	s, addr := startH1(t, h, nil)
	c, br := dial(t, addr)
	for _, tt := range []struct {
		raw, want string
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "true"},
		{"PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "false"},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "false"}, // Fallback keeps it
	} {
		io.WriteString(c, tt.raw)
		if r, err := readWireResponse(br, "GET"); err != nil || r.body != tt.want {
			t.Fatalf("%q: response %v, %v; want %s", tt.raw, r, err, tt.want)
		}
	}
	if parked, registered, conns := pollerCounts(t, s); parked+registered+conns != 0 {
		t.Errorf("after the handover: %d parked, %d registered, %d tracked; want none", parked, registered, conns)
	}
}

// TestCloseParked: Close closes parked connections at once and leaves
// no worker behind.
func TestCloseParked(t *testing.T) {
	s, addr := startH1(t, testHandler(), nil)
	brs := parkedConns(t, addr, 20)
	s.Close()
	for _, br := range brs {
		if d := waitClosed(t, br); d > 3*time.Second { // within dial's 5 s deadline: left open, it would fail there
			t.Errorf("parked connection closed %v after Close", d)
		}
	}
	s.mu.Lock()
	p := s.poller
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { p.close(true); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("poller workers still running 5s after Close")
	}
}

// TestParkedWakeReadsAll: what arrives at a parked connection in one
// go is all served, even past one read buffer or with the client's FIN
// right behind it: the wake that a burst causes is the only one it gets.
func TestParkedWakeReadsAll(t *testing.T) {
	const req = "GET /small HTTP/1.1\r\nHost: a\r\n\r\n"
	tests := []struct {
		name      string
		n         int  // requests in the burst
		halfClose bool // FIN right after them
	}{
		{"burst of 3 read buffers", 3 * readBufSize / len(req), false},
		{"one request then FIN", 1, true},
		{"burst then FIN", 2 * readBufSize / len(req), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 5 { // the FIN case raced a read in 2 of 3 runs when it failed
				_, addr := startH1(t, testHandler(), nil)
				c, br := dial(t, addr)
				roundTrip(t, c, br, "/small") // then parked
				time.Sleep(10 * time.Millisecond)
				if _, err := io.WriteString(c, strings.Repeat(req, tt.n)); err != nil {
					t.Fatal(err)
				}
				if tt.halfClose {
					c.(*net.TCPConn).CloseWrite()
				}
				for i := range tt.n {
					if r, err := readWireResponse(br, "GET"); err != nil || r.body != "hello world" {
						t.Fatalf("response %d of %d: %v, %v", i+1, tt.n, r, err)
					}
				}
				if tt.halfClose {
					waitClosed(t, br)
				}
			}
		})
	}
}

// TestPollerAbandon: if the poller's epoll instance fails, the parked
// connections are closed (no event would wake them) and later
// connections are served with a goroutine each.
func TestPollerAbandon(t *testing.T) {
	s, addr := startH1(t, testHandler(), nil)
	brs := parkedConns(t, addr, 5)
	if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == 5 }) {
		t.Fatal("connections not parked")
	}
	s.mu.Lock()
	p := s.poller
	s.mu.Unlock()
	p.file.Close() // epoll_wait fails from now on
	for i, br := range brs {
		if d := waitClosed(t, br); d > 3*time.Second { // within dial's 5 s deadline: left open, it would fail there
			t.Errorf("parked connection %d closed %v after the poller failed", i, d)
		}
	}
	c, br := dial(t, addr)
	for range 3 {
		if r := roundTrip(t, c, br, "/small"); r.body != "hello world" {
			t.Errorf("response after the poller failed = %v", r)
		}
	}
	if parked, _, _ := pollerCounts(t, s); parked != 0 {
		t.Errorf("%d connections parked after the poller failed, want 0", parked)
	}
}

// TestIdleWorkers checks that the worker that went idle last serves the
// next connection, and that workers idle for workerTTL end.
func TestIdleWorkers(t *testing.T) {
	const n = 8
	mux, entered, release := blockingMux()
	s, addr := startH1(t, mux, nil)
	idle := func() (top, bottom *idleWorker, idlers, live int) {
		s.mu.Lock()
		p := s.poller // made once the server serves
		s.mu.Unlock()
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.idlers) > 0 {
			top, bottom = p.idlers[len(p.idlers)-1], p.idlers[0]
		}
		return top, bottom, len(p.idlers), p.live
	}

	// A burst: n requests at once, each on a worker of its own.
	type client struct {
		c  net.Conn
		br *bufio.Reader
	}
	var cls []client
	for range n {
		c, br := dial(t, addr)
		roundTrip(t, c, br, "/")
		roundTrip(t, c, br, "/") // served by a worker after a park
		cls = append(cls, client{c, br})
	}
	for _, cl := range cls {
		io.WriteString(cl.c, "GET /block HTTP/1.1\r\nHost: a\r\n\r\n")
	}
	if !eventually(func() bool { return entered.Load() == n }) {
		t.Fatalf("%d of %d blocking requests reached the handler", entered.Load(), n)
	}
	close(release)
	for _, cl := range cls {
		if r, err := readWireResponse(cl.br, "GET"); err != nil || r.body != "released" {
			t.Fatalf("blocked request answered %v, %v; want released", r, err)
		}
	}
	if !eventually(func() bool { _, _, idlers, live := idle(); return idlers == live && live >= n }) {
		_, _, idlers, live := idle()
		t.Fatalf("after the burst %d workers, %d of them idle; want at least %d, all idle", live, idlers, n)
	}

	// Requests one at a time go to the worker that went idle last.
	top, bottom, _, _ := idle()
	for i := range 3 {
		if r := roundTrip(t, cls[i].c, cls[i].br, "/"); r.body != "ok" {
			t.Fatalf("request %d answered %v", i, r)
		}
		if !eventually(func() bool { gotTop, _, idlers, live := idle(); return gotTop == top && idlers == live }) {
			t.Fatalf("request %d: the worker idle last did not serve it and go back to the top", i)
		}
	}
	if _, gotBottom, _, _ := idle(); gotBottom != bottom {
		t.Errorf("the longest idle worker was woken; want it left waiting")
	}

	// Once they have waited for workerTTL, the next worker to go idle
	// ends them.
	s.mu.Lock()
	p := s.poller
	s.mu.Unlock()
	p.mu.Lock()
	p.workerTTL = 50 * time.Millisecond
	p.mu.Unlock()
	if !eventually(func() bool {
		return inPoller(s, func(p *poller) bool {
			return len(p.idlers) > 0 && time.Since(p.idlers[len(p.idlers)-1].since) >= p.workerTTL
		})
	}) {
		t.Fatal("the workers did not wait for workerTTL")
	}
	if r := roundTrip(t, cls[0].c, cls[0].br, "/"); r.body != "ok" {
		t.Fatalf("request after the TTL answered %v", r)
	}
	if !eventually(func() bool { _, _, _, live := idle(); return live == 1 }) {
		_, _, idlers, live := idle()
		t.Errorf("after workerTTL %d workers (%d idle), want 1", live, idlers)
	}
}

// TestIdleWorkersEndWithoutTraffic: the workers a burst started end once
// they have waited for workerTTL even when no request comes after it and
// no connection is left to park, so that an idle server goes back to the
// goroutines it started with.
func TestIdleWorkersEndWithoutTraffic(t *testing.T) {
	const n = 8
	mux, entered, release := blockingMux()
	s, addr := startH1(t, mux, nil)
	c0, br0 := dial(t, addr)
	roundTrip(t, c0, br0, "/")
	roundTrip(t, c0, br0, "/") // the poller serves it: it exists
	inPoller(s, func(p *poller) bool { p.workerTTL = 100 * time.Millisecond; return true })
	c0.Close()

	var cls []net.Conn
	for range n {
		c, br := dial(t, addr)
		roundTrip(t, c, br, "/") // parked, then served by a worker
		io.WriteString(c, "GET /block HTTP/1.1\r\nHost: a\r\n\r\n")
		cls = append(cls, c)
	}
	if !eventually(func() bool { return entered.Load() == n }) {
		t.Fatalf("%d of %d blocking requests reached the handler", entered.Load(), n)
	}
	close(release)
	for _, c := range cls {
		c.Close()
	}
	if !eventually(func() bool { return inPoller(s, func(p *poller) bool { return p.live == 0 && p.oldest == nil }) }) {
		live, idlers := inPoller(s, func(p *poller) int { return p.live }), inPoller(s, func(p *poller) int { return len(p.idlers) })
		t.Errorf("with no connection left, %d workers (%d idle) well past workerTTL, want 0", live, idlers)
	}
}

// TestNewConnsOnWorkers: new connections are served by the poller's
// workers, not by a goroutine each, and still all get served when more
// arrive at once than there are workers, all of them blocked.
func TestNewConnsOnWorkers(t *testing.T) {
	const workers, n = 4, 20
	mux, entered, release := blockingMux()
	s, addr := startH1(t, mux, func(s *Server) { s.pollWorkers = workers })

	var brs []*bufio.Reader
	for range n {
		c, br := dial(t, addr)
		io.WriteString(c, "GET /block HTTP/1.1\r\nHost: a\r\n\r\n")
		brs = append(brs, br)
	}
	if !eventually(func() bool { return entered.Load() == n }) {
		t.Fatalf("%d of %d new connections' requests reached the handler with %d workers", entered.Load(), n, workers)
	}
	if got := takenCount(s); got < n {
		t.Errorf("the poller's workers took %d connections, want all %d new ones", got, n)
	}
	close(release)
	for i, br := range brs {
		if r, err := readWireResponse(br, "GET"); err != nil || r.body != "released" {
			t.Errorf("connection %d answered %v, %v; want released", i, r, err)
		}
	}
}

// TestUnixSocket: a connection accepted from a Unix socket takes the TCP
// connections' path: answered by detached responses, and parked between
// requests with no goroutine.
func TestUnixSocket(t *testing.T) {
	var detached atomic.Int32
	s, addr := startH1On(t, listen(t, "unix"), detachMux(&detached, nil), nil)
	c, br := dialOn(t, "unix", addr)
	for _, path := range []string{"/later/one", "/later/two"} {
		if r := roundTrip(t, c, br, path); r.body != "detached "+path {
			t.Errorf("GET %s = %v, want the detached response", path, r)
		}
	}
	if got := detached.Load(); got != 2 {
		t.Errorf("%d Detaches succeeded, want 2", got)
	}
	if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == 1 }) {
		t.Error("the idle Unix socket connection was not parked")
	}
}

// TestParkedPeerClose: an idle connection whose client closes is closed
// by the poller without a worker; one whose client sends a request and
// then half-closes is still answered.
func TestParkedPeerClose(t *testing.T) {
	for _, tt := range []struct {
		name    string
		request bool
	}{
		{"close", false},
		{"request then half-close", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, addr := startH1(t, testHandler(), nil)
			c, br := dial(t, addr)
			roundTrip(t, c, br, "/small")
			if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == 1 }) {
				t.Fatal("the connection was not parked after its response")
			}
			before := takenCount(s)
			if tt.request {
				io.WriteString(c, "GET /small HTTP/1.1\r\nHost: a\r\n\r\n")
			}
			c.(*net.TCPConn).CloseWrite()
			if tt.request {
				if r, err := readWireResponse(br, "GET"); err != nil || r.status != "HTTP/1.1 200 OK" {
					t.Fatalf("request sent with the close: %v, %v; want it answered", r, err)
				}
			}
			waitClosed(t, br)
			waitNoConns(t, s, "after the client closed")
			if got := takenCount(s) - before; !tt.request && got != 0 {
				t.Errorf("a worker took the closed connection %d times, want none", got)
			}
		})
	}
}

// TestLatePollerServesWhatCameInTime: a request that reaches a parked
// connection before its idle deadline is served even when the poller
// runs only after that deadline. The poller is held (its lock) across
// the first connection's deadline, then the second connection's request
// comes, then its deadline passes, then the poller goes on.
func TestLatePollerServesWhatCameInTime(t *testing.T) {
	// The second connection must be parked within idle - gap of the
	// first, and each sleep below overrun by less than gap/4: two
	// seconds, and half a second, for a loaded machine.
	const idle, gap = 4 * time.Second, 2 * time.Second
	s, addr := startH1(t, testHandler(), func(s *Server) { s.IdleTimeout = idle })
	first, firstBR := dial(t, addr)
	second, secondBR := dial(t, addr)
	for _, c := range []net.Conn{first, second} {
		c.SetDeadline(time.Now().Add(idle + gap + 10*time.Second))
	}
	roundTrip(t, first, firstBR, "/small")
	time.Sleep(gap)
	roundTrip(t, second, secondBR, "/small")

	var firstAt, secondAt time.Time
	if !eventually(func() bool {
		return inPoller(s, func(p *poller) bool {
			if p.oldest == nil || p.oldest.pf.newer == nil {
				return false
			}
			firstAt, secondAt = p.oldest.pf.parkedAt.Add(idle), p.oldest.pf.newer.pf.parkedAt.Add(idle)
			return true
		})
	}) {
		t.Fatal("the two connections were not parked")
	}
	time.Sleep(time.Until(firstAt.Add(-gap / 4)))
	inPoller(s, func(p *poller) struct{} {
		time.Sleep(time.Until(firstAt.Add(gap / 4))) // the poller waits for its lock
		if _, err := io.WriteString(second, "GET /small HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(secondAt.Add(gap / 4)))
		return struct{}{}
	})
	waitClosed(t, firstBR)
	second.SetReadDeadline(time.Now().Add(5 * time.Second))
	if r, err := readWireResponse(secondBR, "GET"); err != nil || r.status != "HTTP/1.1 200 OK" {
		t.Errorf("request sent before its connection's idle deadline: %v, %v; want 200", r, err)
	}
}
