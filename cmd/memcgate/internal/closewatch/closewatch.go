// Package closewatch counts the client connections Go's net/http closes
// without a handler seeing their request (a request it answers itself,
// the header and idle timeouts), which no access log line or request
// metric shows, and keeps how each connection's last read ended, for
// the gateway to tell a read deadline from a bad body. It counts; the
// metric is its user's.
package closewatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/memcgate/memcgate/upstream/loggate"
)

// Reason is why a server closed a client connection before any handler
// saw a request on it: the reason label of
// memcgate_http_connections_closed_total.
type Reason int

// The reasons, and how many there are (Reasons).
const (
	BadRequest    Reason = iota // answered 400 (431, 501, 505, 417) and closed
	HeaderTimeout               // a request head, or a new connection's first bytes, not there in time
	IdleTimeout                 // nothing between requests for the idle timeout
	Reasons
)

// String returns the reason's label: bad_request, header_timeout,
// idle_timeout.
func (r Reason) String() string {
	switch r {
	case BadRequest:
		return "bad_request"
	case HeaderTimeout:
		return "header_timeout"
	case IdleTimeout:
		return "idle_timeout"
	}
	return "unknown"
}

// Watch counts the client connections that Go's net/http closes on
// one listener without a handler seeing their request: a request it
// answers itself (400 for a head it cannot parse, 431 for one over
// MaxHeaderBytes, 501 for a transfer coding it does not know, 417 for an
// Expect it does not know), and connections it closes at the header or
// the idle timeout. None of them reach a handler, so no access log line
// or request metric shows them.
//
// net/http says none of this: its ConnState hook tells a connection's
// states, and the handler (handler) tells which requests reached it, so
// a connection closed while a request that reached no handler was being
// read is one net/http refused, or timed out. Which of the two is told by
// how the connection's last read ended (readError): a timeout, or none
// (net/http answered what it read). A client that went away in the
// middle of a head (EOF, a reset) is its own doing and not counted.
// Every connection is HTTP/1: the servers speak nothing else (cmd/memcgate http1Only).
type Watch struct {
	log   *slog.Logger // for bad requests, a line a second at most; nil: none
	name  string       // the listener label: data or admin
	conns sync.Map     // net.Conn → *watchedConn, each connection open
	count [Reasons]atomic.Uint64

	badLog loggate.Gate // bad requests logged
}

// watchedConn is what a Watch knows of one connection. Its fields
// are written from the connection's own goroutine only (ConnState's
// hook, the handler), in the order of its requests.
type watchedConn struct {
	conn    net.Conn // the connection, for readErrorOf
	state   http.ConnState
	pending atomic.Bool // a request began that no handler has seen yet
}

// watchKey is the request context key of a connection's *watchedConn.
type watchKey struct{}

// New returns a Watch for the listener name (the label its log lines
// carry), logging a line a second at most to lg (nil: none).
func New(name string, lg *slog.Logger) *Watch {
	return &Watch{name: name, log: lg}
}

// Serve sets srv's ConnContext, ConnState (calling its former hook
// first, if any) and Handler so that w watches its connections. The
// listeners srv serves must be Listener's for the timeouts to be told
// apart.
func (w *Watch) Serve(srv *http.Server) {
	srv.ConnContext = w.connContext
	if prev := srv.ConnState; prev != nil {
		srv.ConnState = func(c net.Conn, s http.ConnState) { prev(c, s); w.hook(c, s) }
	} else {
		srv.ConnState = w.hook
	}
	srv.Handler = w.handler(srv.Handler)
}

// connContext is http.Server.ConnContext: one record per connection.
func (w *Watch) connContext(ctx context.Context, c net.Conn) context.Context {
	wc := &watchedConn{conn: c}
	w.conns.Store(c, wc)
	return context.WithValue(ctx, watchKey{}, wc)
}

// ReadErrorOf is gateway.Options.ReadError for the requests of w's
// server: how the last read of the connection of the request whose
// context is ctx ended (readError), nil for a request it did not serve
// (the fast path's own). A chunked body's trailer section cut by the read
// deadline fails in net/http with an error that drops the timeout; this
// tells the gateway it was one. It must not run concurrently with a read
// of the connection: the gateway asks on the goroutine whose body read
// just failed, and net/http has no read of its own under way then (its
// background read starts only once the body is read to its end).
func (w *Watch) ReadErrorOf(ctx context.Context) error {
	if wc, ok := ctx.Value(watchKey{}).(*watchedConn); ok {
		return readError(wc.conn)
	}
	return nil
}

// handler notes that a request reached h.
func (w *Watch) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if wc, ok := r.Context().Value(watchKey{}).(*watchedConn); ok {
			wc.pending.Store(false)
		}
		h.ServeHTTP(rw, r)
	})
}

// hook is http.Server.ConnState.
func (w *Watch) hook(c net.Conn, s http.ConnState) {
	v, ok := w.conns.Load(c)
	if !ok {
		return
	}
	wc := v.(*watchedConn)
	switch s {
	case http.StateActive:
		// Set once the first bytes of a request are read, before its
		// head is parsed.
		wc.state = s
		wc.pending.Store(true)
	case http.StateIdle:
		wc.state = s
	case http.StateHijacked:
		w.conns.Delete(c)
	case http.StateClosed:
		w.conns.Delete(c)
		w.closed(c, wc)
	}
}

// closed counts c, closed in wc's state, if net/http closed it without a
// handler seeing the request it was reading.
func (w *Watch) closed(c net.Conn, wc *watchedConn) {
	err := readError(c)
	timeout := isTimeout(err)
	switch wc.state {
	case http.StateNew: // not a byte came
		if timeout {
			w.count[HeaderTimeout].Add(1)
		}
	case http.StateIdle:
		if timeout {
			w.count[IdleTimeout].Add(1)
		}
	case http.StateActive:
		switch {
		case !wc.pending.Load():
		case timeout:
			w.count[HeaderTimeout].Add(1)
		case err != nil: // the client went away
		case refusalCounted(c): // the fast path's guard counted it
		default:
			w.badRequest()
		}
	}
}

// badRequest counts a request net/http answered itself, and logs it a
// line a second at most, with the count: any client can send them.
func (w *Watch) badRequest() {
	n := w.count[BadRequest].Add(1)
	if w.log == nil {
		return
	}
	if _, ok := w.badLog.Pass(); ok {
		w.log.Warn("net/http answered a request itself (400, 431, 501 or 417) and closed its connection before any handler",
			"listener", w.name, "so_far", n)
	}
}

// Counts returns the connections counted so far, by reason; none for a
// nil Watch.
func (w *Watch) Counts() (n [Reasons]uint64) {
	if w == nil {
		return n
	}
	for i := range n {
		n[i] = w.count[i].Load()
	}
	return n
}

// readError is how the last read of c, or of the connection it wraps,
// ended: from the first of them with a ReadError method (watchConn, and
// the fast path's handed-over connections), nil if none has one.
func readError(c net.Conn) error {
	for {
		switch x := c.(type) {
		case interface{ ReadError() error }:
			return x.ReadError()
		case interface{ NetConn() net.Conn }: // *tls.Conn
			c = x.NetConn()
		default:
			return nil
		}
	}
}

// refusalCounted reports whether c refused a head itself and counted it
// (the fast path's guard on a handed-over connection).
func refusalCounted(c net.Conn) bool {
	r, ok := c.(interface{ RefusalCounted() bool })
	return ok && r.RefusalCounted()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Listener returns ln with each connection it accepts keeping how its
// last read ended, for ReadErrorOf and the counts. Under TLS it must be
// beneath tls.NewListener, whose connections net/http must see as they
// are.
func Listener(ln net.Listener) net.Listener { return watchedListener{ln} }

type watchedListener struct{ net.Listener }

func (l watchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchConn{Conn: c}, nil
}

// watchConn keeps the error of its last read. It is atomic: net/http's
// background read (while a handler runs) may still return from a read
// while the ConnState hook asks.
// A read without an error stores nil, which allocates nothing.
type watchConn struct {
	net.Conn
	err atomic.Pointer[error]
}

func (c *watchConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.err.Store(&err)
	} else if c.err.Load() != nil {
		c.err.Store(nil)
	}
	return n, err
}

// NetConn returns the wrapped connection, as tls.Conn.NetConn does.
func (c *watchConn) NetConn() net.Conn { return c.Conn }

// ReadError returns the last read's error.
func (c *watchConn) ReadError() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

// CloseWrite half-closes the connection if the wrapped one can, as
// net/http does on TCP before closing one with a request left unread.
func (c *watchConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom writes what it reads from r with the wrapped connection's own
// ReadFrom if it has one (sendfile or splice on TCP), as net/http would
// without the wrapper.
func (c *watchConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}
