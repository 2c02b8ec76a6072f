package h1

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// handover gives the connection, with every byte read but not consumed,
// to Fallback.
func (c *conn) handover() {
	if c.pf.registered {
		c.srv.poller.forget(c) // before Fallback reads it
	}
	c.rwc.SetDeadline(time.Time{})
	buf := c.in.takeBytes()
	c.state.Store(stateClosed) // no longer ours: closeIdle and Close leave it alone
	s := c.srv
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.handed = true // uncounted when Fallback closes it
	rc := &replayConn{Conn: c.rwc, buf: buf, open: &s.open}
	// Fallback reads the rest of the connection through GuardConn, which
	// makes net/http refuse what the fast path refuses (errBothLengths).
	if !c.ho.give(GuardConn(rc)) {
		rc.Close()
	}
}

// handoff is the net.Listener Fallback.Serve accepts handed-over
// connections from.
type handoff struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
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
	closed atomic.Bool
}

// Close closes the connection; the first call also uncounts it.
func (r *replayConn) Close() error {
	if !r.closed.Swap(true) {
		r.open.Add(-1)
	}
	return r.Conn.Close()
}

func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.buf) == 0 {
		return r.Conn.Read(p)
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

// CloseWrite lets net/http half-close the connection as it does on TCP.
func (r *replayConn) CloseWrite() error {
	if cw, ok := r.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
