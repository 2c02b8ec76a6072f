package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestMaxConnsRefusalRead: a client over the cap reads its 503, not a
// broken pipe or a reset, when its request comes some time after it
// connected (it was accepted, and refused, before: a Unix socket, or TCP
// without TCP_DEFER_ACCEPT) or has a body larger than the socket takes at
// once, as curl sends them.
func TestMaxConnsRefusalRead(t *testing.T) {
	body := strings.Repeat("b", 4<<20)
	tests := []struct {
		name    string
		delay   time.Duration // between connecting and sending
		request string
	}{
		{"request at once", 0, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"request later", 50 * time.Millisecond, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"large body", 0, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body},
		{"large body later", 50 * time.Millisecond, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body},
	}
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			s, addr, _ := atCap(t, network)
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					// The last refusal is over: MaxConns/16 are answered so.
					if !eventually(func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.refusals) == 0 }) {
						t.Fatal("a refusal still lingers")
					}
					c, err := net.Dial(network, addr)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(5 * time.Second))
					time.Sleep(tt.delay)
					if _, err := io.WriteString(c, tt.request); err != nil {
						t.Errorf("sending the request: %v", err)
					}
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
						t.Fatalf("over the cap: %v, %v; want 503", resp, err)
					}
				})
			}
		})
	}
}

// TestSetMaxConns changes the cap of a running Server: lowered under the
// connections open, a new connection is refused (none is idle: each is
// sending a body); lifted, it is served.
func TestSetMaxConns(t *testing.T) {
	s, addr := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}), nil)
	status := func() int {
		t.Helper()
		c, resp := getOnce(t, "tcp", addr)
		defer c.Close()
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab")
	}
	for deadline := time.Now().Add(5 * time.Second); s.ConnStats().Active != 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ConnStats() = %+v, want 3 active", s.ConnStats())
		}
	}
	for _, tc := range []struct {
		max, want int
	}{{2, http.StatusServiceUnavailable}, {0, http.StatusOK}, {4, http.StatusOK}, {3, http.StatusServiceUnavailable}, {-1, http.StatusOK}} {
		// The last case's connection must be gone first: an idle one
		// would make room.
		waitOpen(t, s, 3)
		s.SetMaxConns(tc.max)
		if got := status(); got != tc.want {
			t.Errorf("SetMaxConns(%d) with 3 connections busy: a new one got %d, want %d", tc.max, got, tc.want)
		}
	}
}

// getOnce connects to addr and sends one GET, and returns the connection,
// for the caller to close, and the response.
func getOnce(t *testing.T, network, addr string) (net.Conn, *http.Response) {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c, resp
}

// TestShutdownEndsRefusals: Shutdown closes a connection refused over
// MaxConns whose client keeps it lingering (a byte every 50 ms, for up
// to lingerMax), and returns once its goroutine has ended.
func TestShutdownEndsRefusals(t *testing.T) {
	s, addr, release := atCap(t, "tcp")
	c := dialOver(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("over the cap: %v, %v; want 503", resp, err)
	}
	stop := make(chan struct{})
	defer close(stop)
	var sent atomic.Int32
	go func() { // keeps the refusal lingering
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
				sent.Add(1)
			}
		}
	}()
	// Lingering on bytes that keep coming: answered, and more sent since.
	if !eventually(func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for r := range s.refusals {
			if r.answered.Load() {
				return sent.Load() >= 3
			}
		}
		return false
	}) {
		t.Fatalf("the refusal does not linger (%d bytes sent)", sent.Load())
	}
	release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v after %v", err, time.Since(start))
	}
	s.mu.Lock()
	left := len(s.refusals)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("Shutdown returned with %d refusals still answered", left)
	}
	if _, err := io.Copy(io.Discard, br); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the refused client: %v, want its connection closed", err)
	}
	t.Logf("Shutdown took %v", time.Since(start))
}

// TestShutdownAnswersRefusals: a connection refused over MaxConns whose
// request has not come when Shutdown begins still gets its 503 when the
// request comes, and Shutdown then returns.
func TestShutdownAnswersRefusals(t *testing.T) {
	s, addr, release := atCap(t, "tcp")
	c := dialOver(t, addr)
	if !eventually(func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.refusals) == 1 }) {
		t.Fatal("the second connection is not being refused")
	}
	release()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	if !eventually(s.inShutdown.Load) {
		t.Fatal("Shutdown did not begin")
	}
	// Shutdown closing the refused connection unanswered is what must not
	// happen: the wait gives its loop the chance to.
	time.Sleep(50 * time.Millisecond)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("refused before Shutdown, its request sent after: %v, %v; want 503", resp, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// atCap starts a Server on network with MaxConns 1 and its one connection
// busy in the handler until release is called (at the test's end at the
// latest), so that the next connection is refused.
func atCap(t *testing.T, network string) (s *Server, addr string, release func()) {
	t.Helper()
	ch := make(chan struct{})
	release = sync.OnceFunc(func() { close(ch) })
	t.Cleanup(release)
	s, addr = startH1On(t, listen(t, network), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-ch
	}), func(s *Server) { s.MaxConns = 1 })
	busy, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	io.WriteString(busy, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if !eventually(func() bool { return s.ConnStats().Active == 1 }) {
		t.Fatal("the first connection is not served")
	}
	return s, addr, release
}

// dialOver opens a connection to a Server (at its cap, say: atCap),
// closed at the test's end, with 10 s to do its work.
func dialOver(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// TestHandedLimit hands over as many connections as handedLimit allows,
// each a chunked PUT whose body's first 64 KiB come and the rest never
// does (net/http waits for it; working above minHandedRate for a minute,
// none of them may be closed for room):
// the next request that needs Fallback is answered 503 with Retry-After
// and closed, a request the fast path serves is not, and once a handed
// connection closes, the next one is handed over and served again.
func TestHandedLimit(t *testing.T) {
	s, addr, limit := startHanded(t)
	if limit != 64 {
		t.Fatalf("handedLimit() = %d with MaxConns 100, want 64", limit)
	}
	const chunkedHead = "PUT /k HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
	dial := func() net.Conn { return dialOver(t, addr) }
	held := make([]net.Conn, limit)
	for i := range held {
		held[i] = dial()
		if _, err := io.WriteString(held[i], chunkedHead+"10000\r\n"+strings.Repeat("a", 1<<16)+"\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); s.handed.Load() < int64(limit); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections handed over, want %d", s.handed.Load(), limit)
		}
	}
	over := dial()
	if _, err := io.WriteString(over, chunkedHead+"2\r\nab\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(over), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !resp.Close || string(body) != handedBody+"\n" {
		t.Fatalf("a request for Fallback over the limit: %s %v %q, want 503 with Retry-After saying TooManyHanded, closed", resp.Status, resp.Header, body)
	}
	if st := s.ConnStats(); st.HandoversRefused != 1 {
		t.Errorf("HandoversRefused = %d, want 1", st.HandoversRefused)
	}
	c, got := getOnce(t, "tcp", addr)
	c.Close()
	if got.StatusCode != 200 {
		t.Fatalf("a GET the fast path serves, with Fallback full: %s", got.Status)
	}
	held[0].Close()
	for deadline := time.Now().Add(5 * time.Second); s.handed.Load() >= int64(limit); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections handed over after one closed", s.handed.Load())
		}
	}
	next := dial()
	if _, err := io.WriteString(next, chunkedHead+"2\r\nab\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(next), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a chunked PUT once a handed connection closed: %v %v, want 200", resp, err)
	}
}

// TestHandedIdleMakeRoom: connections handed over that are idle between
// requests (each sent one GET with a head over 4 KiB and stayed, as a
// keep-alive client does) do not hold handedLimit: at the limit, the one
// idle the longest is closed for the next request Fallback must serve,
// which is served, not refused; one idle connection closed per handover.
// (A connection still open waits out a 10 ms read; the server writes
// nothing to an idle one, and closed the two before it answered.)
func TestHandedIdleMakeRoom(t *testing.T) {
	s, addr, limit := startHanded(t)
	longGet := "GET /k HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("p", 5000) + "\r\n\r\n"
	held := make([]net.Conn, limit)
	for i := range held {
		held[i] = dialOver(t, addr)
		io.WriteString(held[i], longGet)
		resp, err := http.ReadResponse(bufio.NewReader(held[i]), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("long GET %d: %v %v", i, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
	}
	if h := s.handed.Load(); h != int64(limit) {
		t.Fatalf("%d connections handed over, want %d", h, limit)
	}
	// Fallback marks a connection idle after its answer is written.
	if !eventually(func() bool {
		s.handedConns.mu.Lock()
		defer s.handedConns.mu.Unlock()
		n := 0
		for r := s.handedConns.idle.Front(); r != nil; r = r.links.Next() {
			n++
		}
		return n == limit
	}) {
		t.Fatal("the handed connections are not all idle")
	}
	for i, req := range []string{
		"PUT /k HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
		longGet,
	} {
		c := dialOver(t, addr)
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d for Fallback with %d idle handed connections: %v %v, want 200", i, limit, resp, err)
		}
	}
	// One idle connection was closed for each: the first to become idle
	// (which may not be the first served: net/http marks a connection
	// idle after its answer is written).
	if closed := closedOf(held); closed != 2 {
		t.Errorf("%d idle handed connections closed, want 2", closed)
	}
	if st := s.ConnStats(); st.HandoversRefused != 0 || st.Reclaimed != 2 || s.handed.Load() != int64(limit) {
		t.Errorf("HandoversRefused %d, Reclaimed %d, handed %d; want 0, 2, %d", st.HandoversRefused, st.Reclaimed, s.handed.Load(), limit)
	}
}

// TestHandedSlowMakeRoom: connections handed over that are working but
// dribbling (each sent the head of a chunked PUT and one byte of its
// body, then nothing) do not hold handedLimit: at the limit, with none
// idle, the one that has moved the fewest bytes a second, below
// minHandedRate, is closed for the next request Fallback must serve,
// which is served, not refused. A fast upload held open beside them is
// not the one closed, and completes.
func TestHandedSlowMakeRoom(t *testing.T) {
	s, addr, limit := startHanded(t)
	chunkedHead := "PUT /k HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
	const fastSize = 256 << 10
	fast := dialOver(t, addr)
	io.WriteString(fast, chunkedHead+strconv.FormatInt(fastSize, 16)+"\r\n"+strings.Repeat("f", fastSize)+"\r\n")
	dribblers := make([]net.Conn, limit-1)
	for i := range dribblers {
		dribblers[i] = dialOver(t, addr)
		io.WriteString(dribblers[i], chunkedHead+"1\r\na\r\n")
	}
	// All handed over and working; the fast upload's body read (but for
	// what the fast path read with its head).
	if !eventually(func() bool {
		s.handedConns.mu.Lock()
		defer s.handedConns.mu.Unlock()
		n, fastRead := 0, false
		for r := s.handedConns.working.Front(); r != nil; r = r.links.Next() {
			n++
			fastRead = fastRead || r.moved.Load() >= fastSize-16<<10
		}
		return n == limit && fastRead
	}) {
		t.Fatalf("the %d chunked uploads are not all working in net/http, the fast one's body read", limit)
	}
	time.Sleep(minRateAfter + 100*time.Millisecond) // the dribblers' rate counts, far below the minimum
	next := dialOver(t, addr)
	io.WriteString(next, chunkedHead+"2\r\nab\r\n0\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(next), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a chunked PUT with %d dribbled uploads handed over: %v %v, want 200", limit-1, resp, err)
	}
	io.WriteString(fast, "0\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(fast), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the fast upload beside the dribbled ones: %v %v, want 200", resp, err)
	}
	if closed := closedOf(dribblers); closed != 1 {
		t.Errorf("%d dribbled uploads closed, want 1", closed)
	}
	if st := s.ConnStats(); st.HandoversRefused != 0 || st.Reclaimed != 1 {
		t.Errorf("HandoversRefused %d, Reclaimed %d; want 0, 1", st.HandoversRefused, st.Reclaimed)
	}
}

// TestHandedSlowest: which working handed connection slowest picks to
// close for room: the one with the fewest bytes a second over its
// request so far, below minHandedRate, among those whose request has
// lasted minRateAfter; none if none is.
func TestHandedSlowest(t *testing.T) {
	now := time.Now()
	type conn struct {
		name  string
		moved int64
		age   time.Duration
	}
	fast := conn{"fast upload", 10 << 20, 10 * time.Second}
	steady := conn{"steady 10 KB/s", 100_000, 10 * time.Second}
	young := conn{"just begun, nothing moved", 0, minRateAfter / 2}
	dribbler := conn{"dribbler", 20, 10 * time.Second}
	stalled := conn{"stalled reader", 40 << 10, 60 * time.Second}
	tests := []struct {
		name  string
		conns []conn
		want  string // "": none
	}{
		{"none", nil, ""},
		{"fast, steady and young", []conn{fast, steady, young}, ""},
		{"a dribbler among them", []conn{fast, dribbler, steady, young}, "dribbler"},
		{"the slower of two below the minimum", []conn{stalled, dribbler, fast}, "dribbler"},
		{"a stalled reader", []conn{steady, stalled}, "stalled reader"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l handedConns
			var open, handed atomic.Int64
			names := map[*replayConn]string{}
			for _, c := range tt.conns {
				r := &replayConn{list: &l, open: &open, handed: &handed}
				l.set(r, false, now.Add(-c.age))
				r.moved.Store(c.moved)
				names[r] = c.name
			}
			got := l.slowest(now)
			if names[got] != tt.want {
				t.Fatalf("slowest: %q, want %q", names[got], tt.want)
			}
			if got != nil && got.links.In() != nil {
				t.Error("the connection picked is still listed")
			}
		})
	}
}

// TestHandedSlowestWindow: a connection that moved a burst early in its
// request (an answer the socket's buffers took, for a client that then
// reads nothing) keeps its place only until slowest has looked at it
// rateWindow apart with nothing moved between; one that keeps moving at
// a steady 10 KB/s keeps it.
func TestHandedSlowestWindow(t *testing.T) {
	var l handedConns
	var open, handed atomic.Int64
	start := time.Now()
	stalled := &replayConn{list: &l, open: &open, handed: &handed}
	steady := &replayConn{list: &l, open: &open, handed: &handed}
	l.set(stalled, false, start)
	l.set(steady, false, start)
	now := start.Add(10 * time.Second)
	stalled.moved.Store(256 << 10) // at once, then nothing
	steady.moved.Store(100_000)
	if got := l.slowest(now); got != nil {
		t.Fatalf("slowest over the request so far: %p (stalled %p, steady %p), want none", got, stalled, steady)
	}
	if got := l.slowest(now.Add(rateWindow / 2)); got != nil {
		t.Fatalf("slowest within rateWindow of the last look: %p, want none", got)
	}
	now = now.Add(rateWindow + time.Second)
	steady.moved.Add(10_000 * int64((rateWindow + time.Second).Seconds()))
	if got := l.slowest(now); got != stalled {
		t.Fatalf("slowest rateWindow after the last look: %p, want the stalled one %p (steady %p)", got, stalled, steady)
	}
}

// TestHandedMovedCountsWrites: what net/http writes to a handed
// connection counts in its rate as the socket takes it, not when
// net/http's one write of the whole answer returns: a long-head GET
// whose answer the client reads 256 KiB of, and no more, has moved what
// the socket took, not nothing until the write timeout (nor the head the
// fast path read before the handover). The client reads what the test
// counts on rather than leaving it to the kernel's buffers, and the
// answer, 64 MiB, is more than they take (a send buffer grows to
// tcp_wmem's maximum, 4 MiB, a receive buffer read from to tcp_rmem's,
// 32 MiB): one of 4 MiB sometimes went whole into the server's send
// buffer, and the connection, its answer written, was idle, not working.
func TestHandedMovedCountsWrites(t *testing.T) {
	s, addr := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 64<<20))
	}), nil)
	c := dialOver(t, addr)
	io.WriteString(c, "GET /k HTTP/1.1\r\nHost: a\r\nX-Pad: "+strings.Repeat("p", 5000)+"\r\n\r\n")
	const read = 256 << 10
	if _, err := io.ReadFull(c, make([]byte, read)); err != nil {
		t.Fatalf("reading %d bytes of the answer: %v", read, err)
	}
	// The writes that carried what the client read have returned, but
	// for the last, of writeChunk at most.
	const want = read - writeChunk
	var moved int64 = -1
	if !eventually(func() bool {
		s.handedConns.mu.Lock()
		defer s.handedConns.mu.Unlock()
		if r := s.handedConns.working.Front(); r != nil {
			moved = r.moved.Load()
		}
		return moved >= want
	}) {
		t.Fatalf("a handed connection writing an answer of 64 MiB, %d bytes of it read: moved %d (-1: not working), want %d at least", read, moved, want)
	}
}

// closedOf is how many of conns the server has closed: their read ends
// at once with EOF (a connection still open has nothing to read).
func closedOf(conns []net.Conn) int {
	closed := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	return closed
}

// startHanded starts a Server of MaxConns 100 (a handedLimit of 64) whose
// handler reads the body and answers "ok", and returns it, its address
// and its handedLimit.
// handedBody is the body of startHanded's 503 over its handed limit.
const handedBody = "too many connections with chunked requests or long heads (MEMCGATE_MAX_CLIENT_CONNS); retry shortly"

func startHanded(t *testing.T) (*Server, string, int) {
	t.Helper()
	s, addr := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}), func(s *Server) { s.MaxConns, s.TooManyHanded = 100, handedBody })
	return s, addr, int(s.handedLimit())
}
