// Package conncap caps the client connections of listeners that Go's
// net/http serves alone (TLS, or the fast path turned off), as
// gateway/h1 caps its own: a connection over the cap makes room by
// closing a quiet or idle one, the one due to be closed first. What the
// cap is, from MAX_CLIENT_CONNS and the open-file limit, is its user's.
package conncap

import (
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memcgate/memcgate/gateway/connlist"
	"github.com/memcgate/memcgate/upstream/loggate"
)

// Cap caps the client connections of the data listeners that Go's
// net/http serves alone (TLS, FAST_PATH=false), which h1.Server.MaxConns
// does on the fast path. A connection accepted over the cap makes room as
// on the fast path, by closing the connection the server would close
// soonest anyway: of the one that has not sent a request yet (a TLS
// handshake not done, a head not all there) accepted first, due at the
// header timeout, and the one idle the longest, due at the idle timeout,
// the one due first. So connections that stay silent, or never finish
// their handshake, give way to new clients instead of keeping them out
// for a header timeout each, again and again. A connection whose request
// is being read or served is never closed for room; with none to close,
// the new connection is closed at once: net/http offers no way to answer
// it without reading its request (over TLS, without a handshake).
//
// Which connections may be closed comes from net/http's ConnState hook
// (state): a connection is quiet from its accept until the head of its
// first request is read, and idle between requests.
type Cap struct {
	max       atomic.Int64 // 0: no cap (a reload may set one)
	open      atomic.Int64
	refused   atomic.Uint64
	reclaimed atomic.Uint64
	log       *slog.Logger // refusals, a line a second at most; nil: none
	logGate   loggate.Gate // refusals logged
	limit     string       // what the refusal's log line names as the cap

	// headerTimeout and idleTimeout are when the server closes a quiet
	// and an idle connection (0: never).
	headerTimeout, idleTimeout time.Duration

	mu sync.Mutex
	// quiet and idle hold the connections of each kind, in the order in
	// which they became so: the first of each is due to be closed first.
	quiet, idle connlist.List[cappedConn]
}

// New returns a cap of max connections (0: none) over the
// listeners of a server that closes a connection which has sent no
// request after headerTimeout, and an idle one after idleTimeout (0:
// never), as net/http's ReadHeaderTimeout and IdleTimeout do. limit is
// what the log line of a refusal names as the cap (the setting, or what
// fixes it).
func New(max int, headerTimeout, idleTimeout time.Duration, limit string, log *slog.Logger) *Cap {
	c := &Cap{log: log, limit: limit, headerTimeout: headerTimeout, idleTimeout: idleTimeout}
	c.max.Store(int64(max))
	return c
}

// Listener returns ln with the cap on its connections, which all of one
// Cap's listeners share. The server serving it must pass its ConnState
// hook's calls to State.
func (c *Cap) Listener(ln net.Listener) net.Listener { return &capListener{Listener: ln, cap: c} }

// SetMax changes the cap to max connections (0: none); the connections
// open over a lower cap stay.
func (c *Cap) SetMax(max int) { c.max.Store(int64(max)) }

// Reclaimed returns the number of quiet or idle connections closed to
// make room for a new one.
func (c *Cap) Reclaimed() uint64 { return c.reclaimed.Load() }

// Refused returns the number of new connections closed at the cap, with
// none quiet or idle to close for room.
func (c *Cap) Refused() uint64 { return c.refused.Load() }

type capListener struct {
	net.Listener
	cap *Cap
}

// Accept returns the next connection under the cap, closing the one due
// first of the quiet and idle ones to make room for it, or, with none,
// closing the new one.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n, m := l.cap.open.Add(1), l.cap.max.Load()
		if m > 0 && n > m {
			v := l.cap.due()
			if v == nil {
				l.cap.open.Add(-1)
				l.cap.refusal(m)
				c.Close()
				continue
			}
			v.Close() // frees its place
			l.cap.reclaimed.Add(1)
		}
		cc := &cappedConn{Conn: c, cap: l.cap}
		l.cap.mu.Lock()
		l.cap.push(&l.cap.quiet, cc)
		l.cap.mu.Unlock()
		return cc, nil
	}
}

// due takes out of its list, and returns, the quiet or idle connection
// due to be closed first; nil if there is none.
func (c *Cap) due() *cappedConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, i := c.quiet.Front(), c.idle.Front()
	if q == nil && i == nil {
		return nil
	}
	v := q
	if q == nil || i != nil && dueAt(i.since, c.idleTimeout) < dueAt(q.since, c.headerTimeout) {
		v = i
	}
	v.links.Remove()
	return v
}

// dueAt is when a connection that became quiet or idle at since (Unix
// nanoseconds) is closed, after d (0: never).
func dueAt(since int64, d time.Duration) int64 {
	if d <= 0 {
		return math.MaxInt64
	}
	return since + int64(d)
}

// State follows net/http's ConnState hook for one of the cap's
// connections (c, or a connection wrapping it; others are ignored): a
// request being read or served takes it out of the lists, idle puts it
// at the end of the idle list.
func (c *Cap) State(nc net.Conn, s http.ConnState) {
	cc := cappedOf(nc)
	if s == http.StateNew || cc == nil || cc.cap != c {
		return // a new connection is quiet from its accept
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cc.links.Remove()
	if s == http.StateIdle && !cc.closed.Load() {
		c.push(&c.idle, cc)
	}
}

// cappedOf returns the *cappedConn that c is or wraps, through NetConn
// (tls.Conn, closewatch's, h1's guard), nil if none.
func cappedOf(c net.Conn) *cappedConn {
	for {
		switch x := c.(type) {
		case *cappedConn:
			return x
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return nil
		}
	}
}

// refusal counts a connection closed at the cap m, and logs it as the
// fast path logs its refusals: a line a second at most, with the count,
// as any client can open connections at will.
func (c *Cap) refusal(m int64) {
	n := c.refused.Add(1)
	if c.log == nil {
		return
	}
	if _, ok := c.logGate.Pass(); ok {
		c.log.Warn("client connections open at "+c.limit+", the most allowed, none quiet or idle to close for room: closed a new connection unserved (net/http cannot answer it)",
			"max_conns", m, "refused_so_far", n)
	}
}

// cappedConn is a connection under a Cap; its first Close frees its
// place.
type cappedConn struct {
	net.Conn
	cap    *Cap
	closed atomic.Bool

	// Guarded by cap.mu: its place in the quiet or idle list, and when
	// it went in, in Unix nanoseconds.
	links connlist.Links[cappedConn]
	since int64
}

// Close closes the connection; the first call frees its place.
func (c *cappedConn) Close() error {
	if !c.closed.Swap(true) {
		c.cap.mu.Lock()
		c.links.Remove()
		c.cap.mu.Unlock()
		c.cap.open.Add(-1)
	}
	return c.Conn.Close()
}

// push appends cc, which is in no list, to l, one of c's lists, as of
// now; the caller holds c.mu.
func (c *Cap) push(l *connlist.List[cappedConn], cc *cappedConn) {
	cc.since = time.Now().UnixNano()
	l.Push(cc, &cc.links)
}
