package h1

import (
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memcgate/memcgate/gateway/connlist"
)

// handover gives the connection, with every byte read but not consumed,
// to Fallback, and returns readEnded; or, when as many connections as
// handedLimit allows are Fallback's already, closes one of them to make
// room (the one idle the longest; with none idle, the one working the
// slowest below minHandedRate: handedConns.slowest), and with none of
// either answers 503 and closes this one (refuseHandover), and returns
// readParked if it lingers in the poller.
func (c *conn) handover() readResult {
	s := c.srv
	n := s.handed.Add(1)
	if limit := s.handedLimit(); limit > 0 && n > limit {
		v := s.handedConns.oldestIdle()
		if v == nil {
			v = s.handedConns.slowest(time.Now())
		}
		if v == nil {
			s.handed.Add(-1)
			return c.refuseHandover()
		}
		v.Close() // its place is this one's: handed stays at limit
		s.reclaimed.Add(1)
	}
	if c.pf.registered {
		s.poller.forget(c) // before Fallback reads it
	}
	c.rwc.SetDeadline(time.Time{})
	buf := c.in.takeBytes()
	c.state.Store(stateClosed) // no longer ours: closeIdle and Close leave it alone
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.handed = true // uncounted when Fallback closes it
	rc := &replayConn{Conn: c.rwc, buf: buf, open: &s.open, handed: &s.handed, list: &s.handedConns, readBy: c.deadline(s.ReadTimeout)}
	s.handedConns.set(rc, false, time.Now()) // working, before Fallback's hook can mark it idle
	if rc.inHead = !rc.head.find(buf); rc.inHead {
		// Handed over in the middle of its head: the rest of it has
		// what is left of the header timeout, from now on too, and not
		// Fallback's afresh.
		rc.headBy = c.deadline(s.headTimeout())
		rc.SetReadDeadline(time.Time{})
	}
	// Fallback reads the rest of the connection through GuardConn, which
	// makes net/http refuse what the fast path refuses (errBothLengths),
	// and says what HeadTooLarge says to a head too large.
	if !c.ho.give(Guard{}.conn(rc, c.ho.tooLarge, s.badRequest)) {
		rc.Close()
	}
	return readEnded
}

// handedLimit is how many connections may be Fallback's at once, 0 for no
// limit: a thirty-second of the connection cap, at least 64. A connection
// net/http serves costs a goroutine, buffers and the parsed head, about
// 40-65 KB against the fast path's 4 KiB for one parked, and MaxConns
// never closes it to make room: without this limit, 16,500 connections
// dribbling chunked uploads take 526 MB and every connection slot, and
// other clients get 503. At the limit, the one idle the longest
// (between requests, as Fallback's ConnState says) is closed for a new
// one: otherwise connections that each sent one request with a long head
// and stayed, as keep-alive clients do, would hold the limit for
// IdleTimeout and have every chunked upload and long head refused. With
// none idle, the one moving the fewest bytes a second, below
// minHandedRate, is closed: otherwise connections dribbling chunked
// bodies, or not reading their answers, would hold it for ReadTimeout or
// WriteTimeout, renewably.
func (s *Server) handedLimit() int64 {
	n := s.connLimit()
	if n <= 0 {
		return 0
	}
	return max(64, n/32)
}

// refuseHandover answers a request that Fallback would have to serve,
// over handedLimit, with 503 and Retry-After and closes the connection,
// dropping for a while what the client still sends so that it gets the
// answer.
func (c *conn) refuseHandover() readResult {
	s := c.srv
	s.handedRefused.Add(1)
	if _, ok := s.handedLog.Pass(); ok {
		s.logf("h1: %d connections served by net/http, the most allowed: refused one with 503 (%d refused so far)", s.handedLimit(), s.handedRefused.Load())
	}
	if d := s.WriteTimeout; d > 0 {
		c.setWriteTimeout(time.Now().Add(d))
	}
	c.armWrite()
	s.makeRefusals()
	io.WriteString(c.rwc, s.handedRefusal)
	c.in.Discard(c.in.Buffered())
	c.phase = phaseLinger
	if c.linger() {
		return readParked
	}
	return readEnded
}

// handoff is the net.Listener Fallback.Serve accepts handed-over
// connections from.
type handoff struct {
	ch       chan net.Conn
	done     chan struct{}
	once     sync.Once
	addr     net.Addr
	tooLarge string // headTooLargeAnswer of Server.HeadTooLarge
}

func (h *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-h.ch:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

func (h *handoff) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

func (h *handoff) Addr() net.Addr { return h.addr }

// give passes c to Accept, and reports false if the listener is closed.
func (h *handoff) give(c net.Conn) bool {
	select {
	case h.ch <- c:
		return true
	case <-h.done:
		return false
	}
}

// replayConn is a connection whose first reads return buf, and whose
// first Close takes it off the count of open connections. It holds buf
// only until it has returned it all.
type replayConn struct {
	net.Conn
	buf    []byte
	open   *atomic.Int64 // Server.open
	handed *atomic.Int64 // Server.handed
	list   *handedConns  // Server.handedConns; nil: none
	closed atomic.Bool
	err    error // the last read's error, for ReadError

	// moved counts the bytes read from and written to the connection
	// since its current request began (or it was handed over; the bytes
	// handed over with it are not counted: the fast path read them):
	// list.slowest's measure of how fast it works.
	moved atomic.Int64

	// Guarded by list.mu: its place in list's idle or working list, and
	// two marks of moved and when it was so, from and mark, for
	// list.slowest to measure its rate since from: the request's start
	// until slowest has looked at it rateWindow after it, then the mark
	// it set at least rateWindow before.
	links          connlist.Links[replayConn]
	fromAt, markAt time.Time
	fromMv, markMv int64

	// inHead: the connection was handed over before the head of its
	// request was whole, and Read has not returned the head's end yet;
	// head follows the bytes read to find it. Read's.
	inHead bool
	head   headEnd

	mu sync.Mutex
	// readBy is the read deadline of the request the connection was
	// handed over in, counted from its start (conn.deadline); zero:
	// none, or no longer. net/http counts its ReadTimeout from when it
	// begins to read the request, after the fast path read its head:
	// SetReadDeadline does not let its deadlines past readBy, so that
	// the read timeout counts the whole request there too, until
	// net/http clears the deadline, which it does once the request's
	// body is read (its background read) or between requests.
	readBy time.Time
	// headBy is the header deadline of that request, counted from its
	// start, while its head is not all read (inHead); zero: none, or no
	// longer. net/http arms its ReadHeaderTimeout from when it begins to
	// read: SetReadDeadline lets no deadline past headBy, not even none,
	// so that a head the fast path hands over half read (a folded line)
	// is not given the header timeout twice.
	headBy time.Time
}

// SetReadDeadline sets the read deadline t, but no later than headBy
// while the head is not read, and then no later than readBy while that
// holds; a zero t after the head clears the deadline and ends readBy.
func (r *replayConn) SetReadDeadline(t time.Time) error {
	r.mu.Lock()
	by := r.readBy
	if hb := r.headBy; !hb.IsZero() {
		if by.IsZero() || hb.Before(by) {
			by = hb
		}
		if t.IsZero() {
			t = by
		}
	} else if t.IsZero() {
		r.readBy = time.Time{}
	}
	r.mu.Unlock()
	if !by.IsZero() && !t.IsZero() && t.After(by) {
		t = by
	}
	return r.Conn.SetReadDeadline(t)
}

// headRead ends headBy: Read has returned the end of the head.
func (r *replayConn) headRead() {
	r.inHead = false
	r.mu.Lock()
	r.headBy = time.Time{}
	r.mu.Unlock()
}

// headEnd finds the end of a request head in the bytes that follow its
// start, as net/http's reader does: the first empty line, ended by LF or
// CRLF. Its value is where the bytes so far stop: 0 inside a line, 1 at
// the start of one, 2 after a CR there.
type headEnd uint8

// find follows b and reports whether it holds the head's end.
func (h *headEnd) find(b []byte) bool {
	for _, ch := range b {
		switch {
		case ch == '\n' && *h != 0:
			return true
		case ch == '\n':
			*h = 1
		case ch == '\r' && *h == 1:
			*h = 2
		default:
			*h = 0
		}
	}
	return false
}

// Close closes the connection; the first call also uncounts it.
func (r *replayConn) Close() error {
	if !r.closed.Swap(true) {
		if r.list != nil {
			r.list.drop(r)
		}
		r.open.Add(-1)
		r.handed.Add(-1)
	}
	return r.Conn.Close()
}

// minHandedRate is the rate, in bytes a second read and written, below
// which a handed connection that is working (not idle between requests)
// may be closed to make room at handedLimit when none is idle: 1 KiB/s,
// a tenth of a slow mobile link, which a client sending or reading as
// fast as its link allows stays above. The rate counts over the request
// so far, or once the share has been full for a while the last
// rateWindow to twice that (handedConns.slowest), so that a burst early
// in a request (an answer the socket's buffers took at once, for a
// client that then reads nothing) does not hold the place for the rest
// of it. minRateAfter is how long a request must have lasted for its
// rate to count: a request that just began has moved nothing yet.
const (
	minHandedRate = 1024
	minRateAfter  = time.Second
	rateWindow    = 5 * time.Second
)

// handedConns lists the connections handed to Fallback: those idle
// between requests in the order they became so, and those working (a
// request being read or served), for handover to close one to make room
// at handedLimit: the first idle one, or else the slowest working one.
type handedConns struct {
	mu      sync.Mutex // guards idle, working and their connections' links
	idle    connlist.List[replayConn]
	working connlist.List[replayConn]
}

// state follows Fallback's ConnState hook: a connection handed over (c,
// or one wrapping it: GuardConn's) is in the idle list while it is idle,
// and in the working one otherwise until it closes; its rate is measured
// afresh from each request's start (StateActive: net/http has read the
// head).
func (l *handedConns) state(c net.Conn, st http.ConnState) {
	for {
		switch x := c.(type) {
		case *replayConn:
			if x.list != l {
				return
			}
			switch st {
			case http.StateClosed:
				l.drop(x)
			case http.StateActive:
				l.set(x, false, time.Now())
			default:
				l.set(x, st == http.StateIdle, time.Time{})
			}
			return
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return
		}
	}
}

// set puts r at the end of the idle list or, if it is not there yet, of
// the working one, unless it is closed; a non-zero start begins its
// request there, counting its rate from then. Close marks r closed
// before it takes r out, so that a closed connection never stays in a
// list, whichever comes first.
func (l *handedConns) set(r *replayConn, idle bool, start time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.closed.Load() {
		r.links.Remove()
		return
	}
	if !start.IsZero() {
		r.fromAt, r.markAt, r.fromMv, r.markMv = start, start, 0, 0
		r.moved.Store(0)
	}
	switch {
	case idle:
		r.links.Remove()
		l.idle.Push(r, &r.links)
	case r.links.In() != &l.working:
		r.links.Remove()
		l.working.Push(r, &r.links)
	}
}

// drop takes r out of its list.
func (l *handedConns) drop(r *replayConn) {
	l.mu.Lock()
	r.links.Remove()
	l.mu.Unlock()
}

// oldestIdle takes the connection idle the longest out of the list and
// returns it, for one caller alone; nil if there is none.
func (l *handedConns) oldestIdle() *replayConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.idle.Front()
	if r != nil {
		r.links.Remove()
	}
	return r
}

// slowest takes out of the list and returns, for one caller alone, the
// working connection that has moved the fewest bytes a second, if that
// is below minHandedRate over at least minRateAfter; nil if there is
// none. The rate counts from the request's start, or from a mark slowest
// set on an earlier call rateWindow or more before: each call moves the
// marks of a connection whose last is rateWindow old, so that while the
// share stays full a rate spans the last rateWindow to twice that, and
// no timer is needed. A connection that sends or reads as fast as its
// client can is never the one: a fast upload, or a slow but steady one,
// has a rate above the minimum; a connection whose client dribbles its
// body, or does not read its answer (its writes stall once the socket's
// buffers are full), falls below it.
func (l *handedConns) slowest(now time.Time) *replayConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var pick *replayConn
	var pickRate float64
	for r := l.working.Front(); r != nil; r = r.links.Next() {
		moved := r.moved.Load()
		if now.Sub(r.markAt) >= rateWindow {
			r.fromAt, r.fromMv = r.markAt, r.markMv
			r.markAt, r.markMv = now, moved
		}
		d := now.Sub(r.fromAt)
		if d < minRateAfter {
			continue
		}
		if rate := float64(moved-r.fromMv) / d.Seconds(); rate < minHandedRate && (pick == nil || rate < pickRate) {
			pick, pickRate = r, rate
		}
	}
	if pick != nil {
		pick.links.Remove()
	}
	return pick
}

func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.buf) == 0 {
		n, err := r.Conn.Read(p)
		r.moved.Add(int64(n))
		r.err = err
		if r.inHead && r.head.find(p[:n]) {
			r.headRead()
		}
		return n, err
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	if len(r.buf) == 0 {
		// An empty slice at the end of an array still points into
		// it, and net/http keeps this conn while the connection is
		// open: let the array go.
		r.buf = nil
	}
	return n, nil
}

// Write writes p, counting what it wrote in moved, writeChunk at a time.
func (r *replayConn) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := r.Conn.Write(p[n:min(len(p), n+writeChunk)])
		n += m
		r.moved.Add(int64(m))
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeChunk is the most replayConn.Write gives the socket at once: a
// write returns only when the socket has taken all of it, and net/http
// writes a large answer in one, so that moved follows an answer going
// to a slow reader as it goes (16 KiB: every 1.6 s at 10 KB/s), not only
// when the whole of it has gone.
const writeChunk = 16 << 10

// ReadError returns the error of the last read, nil if it had none: a
// timeout when net/http closed the connection at one, which its
// ConnState hook cannot tell otherwise. It must not be called
// concurrently with Read (net/http's ConnState hook runs on the
// connection's goroutine).
func (r *replayConn) ReadError() error { return r.err }

// CloseWrite lets net/http half-close the connection as it does on TCP.
func (r *replayConn) CloseWrite() error {
	if cw, ok := r.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
