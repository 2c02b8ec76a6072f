// Package h1 is a minimal HTTP/1.x server for one http.Handler. It serves
// the simple, well-formed requests of the gateway's hot path itself and
// hands every connection it does not take on to a net/http Server, which
// then owns it and answers exactly as net/http does, errors included.
//
// The fast path avoids net/http's per-request background read, context
// and double buffering: it parses each request head where it lies in the
// read buffer and sends each response with one write. A connection holds
// no buffer between requests, and on Linux no goroutine either: it waits
// in an epoll set of the Server's own and a worker serves it when its
// next request comes, connections in the order their requests arrived
// (see poller). h1 does no TLS, HTTP/2, Hijack or 100-continue itself.
//
// What a handler sees on the fast path differs from net/http in these
// ways, all else (request fields, status lines, headers and their order,
// Content-Length and Content-Type rules, chunking, keep-alive and body
// draining rules) being the same:
//   - The request context is cancelled only by Server.Close: not when the
//     client goes away (net/http notices that with a background read) nor
//     when the handler returns. Handlers bound their work with their own
//     deadlines.
//   - The context carries http.LocalAddrContextKey but not
//     http.ServerContextKey.
//   - The ResponseWriter is an http.Flusher and supports
//     http.ResponseController's Flush, SetReadDeadline, SetWriteDeadline
//     and EnableFullDuplex, but not Hijack; it has no CloseNotify or
//     ReadFrom. http.MaxBytesReader cannot make it close the connection
//     after the response, as net/http does when the limit is hit.
//   - When it must close a connection with request bytes left unread, h1
//     half-closes it and reads for up to 500ms until the client closes;
//     net/http half-closes and sleeps 500ms.
//   - A request that arrives while Shutdown runs is answered, with
//     "Connection: close", if it got in before its connection was closed
//     as idle; net/http may drop such a request unanswered.
package h1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves HTTP/1.x connections with Handler, taking the fast path
// for simple requests and passing the connection to Fallback from the
// first request it does not take. Its zero value plus Handler and
// Fallback is ready to use; nothing runs until Serve. A Server is safe for
// concurrent use and must not be copied after first use.
type Server struct {
	// Handler serves every request, on the fast path. It must not be nil.
	Handler http.Handler

	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout mean
	// what they mean in http.Server, including the fall back from
	// ReadHeaderTimeout and IdleTimeout to ReadTimeout when zero. Zero or
	// negative means no timeout. Fallback applies its own timeouts anew to
	// the connections it is given.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration

	// MaxHeaderBytes is the request head limit, as in http.Server (zero
	// means http.DefaultMaxHeaderBytes). The fast path only takes heads
	// of at most 4 KiB, which net/http always accepts (it allows
	// MaxHeaderBytes plus 4096 bytes), and Fallback enforces the limit
	// on larger ones, so Serve refuses to run when the two disagree.
	MaxHeaderBytes int

	// Fallback serves the connections the fast path does not take, from
	// the first request it does not take on; it usually has the same
	// Handler and timeouts. It must not be nil. Serve runs Fallback.Serve
	// on an internal listener, Shutdown and Close shut it down too, and
	// SetKeepAlivesEnabled is passed on to it.
	Fallback *http.Server

	// ErrorLog receives handler panics, superfluous WriteHeader calls and
	// accept errors. Nil discards them.
	ErrorLog *log.Logger

	// NewContext, if not nil, makes each fast-path request's context from
	// the connection's, which carries http.LocalAddrContextKey and which
	// Close cancels; it must return a context derived from parent. A
	// handler that would attach a context of its own with WithContext
	// (a copy of the whole request, about 250 bytes, per request) can
	// have it made here and find it in the request instead.
	NewContext func(parent context.Context) context.Context

	// BodyLimit, if not nil, says how much of a request's body its
	// handler reads (it is called once the head is read, for requests
	// with a Content-Length body). A body of at most that many bytes
	// that has not all arrived with its head is read whole before the
	// handler runs, as it arrives, with the connection waiting in the
	// poller and not on a worker, up to ReadTimeout; the handler then
	// reads it from memory. Nil, or a larger body: the handler reads it
	// from the connection, as net/http's does.
	BodyLimit func(r *http.Request) int64

	// Budget, if not nil, holds the bytes of bodies read ahead of their
	// handler and of responses a slow client has not taken yet. A body
	// it refuses fails the handler's read with its error (the connection
	// closes after the response); a response whose rest it refuses is
	// cut short and the connection closed.
	Budget Budget

	readers      sync.Pool // of *[readBufSize]byte, for conn.in
	writers      sync.Pool // of *outbuf, for conn.hbuf and conn.wbuf
	inShutdown   atomic.Bool
	noKeepAlives atomic.Bool

	mu        sync.Mutex // guards listeners, conns, ctx, cancel and poller
	listeners map[*net.Listener]struct{}
	conns     map[*conn]struct{}
	ctx       context.Context // parent of request contexts; Close cancels it
	cancel    context.CancelFunc
	poller    *poller // nil where connections cannot be parked; set before the first conn

	pollWorkers int // the poller's soft cap on workers; 0: maxWorkers (tests set it)
}

const (
	readBufSize     = 4 << 10 // the largest request head the fast path takes
	shutdownPollMax = 100 * time.Millisecond
	newConnGrace    = 5 * time.Second // a silent new conn counts as idle after this, as in net/http
	lingerTime      = 500 * time.Millisecond
)

// Budget bounds bytes held for clients (Server.Budget).
// *budget.Budget implements it.
type Budget interface {
	// Acquire holds n more bytes, or returns an error if that would
	// pass the limit.
	Acquire(n int64) error
	// Release gives back n bytes Acquire held.
	Release(n int64)
}

// errConfig is returned by Serve for a Server that cannot run.
var errConfig = errors.New("h1: Server needs a Handler and a Fallback")

// Serve accepts connections on ln and serves each in its own goroutine,
// until ln fails or Shutdown or Close is called; it then closes ln and
// returns http.ErrServerClosed, or the accept error. Serve may be called
// for several listeners at once. It returns an error at once if Handler
// or Fallback is nil or MaxHeaderBytes differs from Fallback's.
//
// ln should be a plain TCP listener: behind a TLS listener, requests have
// no Request.TLS, and Fallback cannot negotiate HTTP/2.
func (s *Server) Serve(ln net.Listener) error {
	if s.Handler == nil || s.Fallback == nil {
		return errConfig
	}
	if maxHeader(s.MaxHeaderBytes) != maxHeader(s.Fallback.MaxHeaderBytes) {
		return fmt.Errorf("h1: MaxHeaderBytes %d differs from Fallback's %d", s.MaxHeaderBytes, s.Fallback.MaxHeaderBytes)
	}
	if !s.trackListener(&ln, true) {
		ln.Close()
		return http.ErrServerClosed
	}
	defer s.trackListener(&ln, false)
	defer ln.Close()

	ho := &handoff{ch: make(chan net.Conn), done: make(chan struct{}), addr: ln.Addr()}
	fbDone := make(chan struct{})
	go func() {
		defer close(fbDone)
		defer ho.Close() // if Fallback stops on its own, later handovers fail fast
		err := s.Fallback.Serve(ho)
		if !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.logf("h1: fallback server stopped: %v", err)
		}
	}()
	defer func() { ho.Close(); <-fbDone }()

	var delay time.Duration // how long to sleep on accept failure
	for {
		rw, err := ln.Accept()
		if err != nil {
			if s.inShutdown.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.logf("h1: accept error: %v; retrying in %v", err, delay)
				time.Sleep(delay)
				continue
			}
			return fmt.Errorf("h1: accept: %w", err)
		}
		delay = 0
		c := s.newConn(rw, ho)
		if c == nil {
			rw.Close()
			return http.ErrServerClosed
		}
		if !s.admit(c) {
			go c.serve()
		}
	}
}

// admit hands a new connection to the poller and reports whether it
// did. What has arrived is read without waiting: a connection with
// something to serve (or an error to report) is queued for a worker, one
// that has sent nothing yet waits in the poller, holding no goroutine
// and no buffer, until its first bytes come or the header timeout
// passes. So connections that send nothing, however many, never hold
// up the ones that do.
func (s *Server) admit(c *conn) bool {
	p := s.poller
	if p == nil {
		return false
	}
	if c.in.tryFill() {
		hdr := orRead(s.ReadHeaderTimeout, s.ReadTimeout)
		var deadline time.Time
		if hdr > 0 {
			deadline = c.created.Add(hdr)
		}
		switch p.parkReading(c, stateNew, deadline) {
		case parked:
			return true
		case notParked:
			return false
		}
	}
	return p.admit(c)
}

// Shutdown stops the server gracefully: it closes the listeners and the
// idle connections at once, lets active requests finish, closes each
// connection after its current response, shuts Fallback down with ctx,
// and waits for every connection to end. It returns ctx.Err() if ctx ends
// first, else the first error closing a listener or from Fallback.
// Serve returns http.ErrServerClosed as soon as Shutdown is called.
func (s *Server) Shutdown(ctx context.Context) error {
	s.inShutdown.Store(true)
	s.mu.Lock()
	err := s.closeListenersLocked()
	s.mu.Unlock()
	s.closeIdle()
	if s.Fallback != nil {
		if ferr := s.Fallback.Shutdown(ctx); ferr != nil && err == nil {
			err = ferr
		}
	}
	poll := time.Millisecond
	timer := time.NewTimer(poll)
	defer timer.Stop()
	for !s.closeIdle() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			poll = min(2*poll, shutdownPollMax)
			timer.Reset(poll)
		}
	}
	s.closePoller(true)
	return err
}

// Close stops the server at once: it closes the listeners and every
// connection, cancels the contexts of requests in flight, and closes
// Fallback. It does not wait for handlers to return. It returns the
// first error from closing a listener or Fallback.
func (s *Server) Close() error {
	s.inShutdown.Store(true)
	s.mu.Lock()
	err := s.closeListenersLocked()
	if s.cancel != nil {
		s.cancel()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	s.closePoller(false)
	if s.Fallback != nil {
		if ferr := s.Fallback.Close(); ferr != nil && err == nil {
			err = ferr
		}
	}
	return err
}

// closePoller closes the poller, once no connection is left to park;
// with wait it also waits for its workers to end.
func (s *Server) closePoller(wait bool) {
	s.mu.Lock()
	p := s.poller
	s.mu.Unlock()
	if p != nil {
		p.close(wait)
	}
}

// SetKeepAlivesEnabled controls keep-alives, which are on by default. When
// off, every later response says "Connection: close" and its connection
// is closed after it, and idle connections are closed now. The setting is
// passed on to Fallback.
func (s *Server) SetKeepAlivesEnabled(v bool) {
	s.noKeepAlives.Store(!v)
	if s.Fallback != nil {
		s.Fallback.SetKeepAlivesEnabled(v)
	}
	if !v {
		s.closeIdle()
	}
}

func (s *Server) keepAlives() bool { return !s.noKeepAlives.Load() && !s.inShutdown.Load() }

func (s *Server) logf(format string, args ...any) {
	if s.ErrorLog != nil {
		s.ErrorLog.Printf(format, args...)
	}
}

func maxHeader(n int) int {
	if n > 0 {
		return n
	}
	return http.DefaultMaxHeaderBytes
}

func orRead(d, read time.Duration) time.Duration {
	if d != 0 {
		return d
	}
	return read
}

// trackListener adds or removes ln; adding fails once the server is
// shutting down. The first add also sets up the server's state.
func (s *Server) trackListener(ln *net.Listener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.listeners, ln)
		return true
	}
	if s.inShutdown.Load() {
		return false
	}
	if s.listeners == nil {
		s.listeners = make(map[*net.Listener]struct{})
		s.conns = make(map[*conn]struct{})
		s.ctx, s.cancel = context.WithCancel(context.Background())
		if p, err := newPoller(orRead(s.IdleTimeout, s.ReadTimeout), s.pollWorkers); err != nil {
			s.logf("%v; idle connections keep their goroutines", err)
		} else if p != nil {
			s.poller = p
			go p.run() // until Close or Shutdown closes the poller
		}
	}
	s.listeners[ln] = struct{}{}
	return true
}

func (s *Server) closeListenersLocked() error {
	var err error
	for ln := range s.listeners {
		if cerr := (*ln).Close(); cerr != nil && err == nil {
			err = fmt.Errorf("h1: close listener: %w", cerr)
		}
	}
	return err
}

// closeIdle closes the idle connections (and the new ones that have sent
// nothing for newConnGrace) and reports whether no connection is left.
func (s *Server) closeIdle() bool {
	var idle, parked []*conn
	s.mu.Lock()
	left := len(s.conns)
	for c := range s.conns {
		switch {
		case c.state.CompareAndSwap(stateIdle, stateClosed),
			time.Since(c.created) > newConnGrace && c.state.CompareAndSwap(stateNew, stateClosed):
			idle = append(idle, c)
		case c.state.CompareAndSwap(stateParked, stateClosed):
			parked = append(parked, c)
		}
	}
	s.mu.Unlock()
	for _, c := range idle {
		c.rwc.Close() // its goroutine, or the worker it is queued for, finishes it
	}
	for _, c := range parked {
		c.closeParked()
	}
	return left == 0
}

// Connection states. The connection's goroutine moves new or idle to
// active with a compare-and-swap when a request arrives, so that
// closeIdle, which swaps idle to closed, never closes a connection that
// has just started a request. A parked connection has no goroutine; see
// poller for who takes it from there.
const (
	stateNew int32 = iota
	stateIdle
	stateActive
	stateParked
	stateReading // parked mid-request (poller.parkReading)
	stateClosed
)

func (s *Server) newConn(rw net.Conn, ho *handoff) *conn {
	c := &conn{srv: s, rwc: rw, ho: ho, created: time.Now()}
	c.in.init(rw, &s.readers)
	if ra := rw.RemoteAddr(); ra != nil {
		c.remote = ra.String()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inShutdown.Load() {
		return nil
	}
	c.ctx = context.WithValue(s.ctx, http.LocalAddrContextKey, rw.LocalAddr())
	s.conns[c] = struct{}{}
	return c
}

// A conn is one client connection served on the fast path. Everything but
// state is owned by the connection's goroutine.
type conn struct {
	srv     *Server
	rwc     net.Conn
	in      inbuf // holds a buffer only while a request is being read
	ho      *handoff
	ctx     context.Context // the per-connection parent of request contexts
	remote  string
	created time.Time
	state   atomic.Int32

	readDL   bool       // a read deadline is set
	lastPOST bool       // the last request was a POST: skip up to 4 stray CR/LF
	pf       pollFields // the poller's, guarded by its mutex

	// The request being read (readNext).
	phase       uint8
	reqFirst    bool          // it is the connection's first
	crlfSkipped int           // CR/LF bytes dropped before it (after a POST)
	headAt      time.Time     // when it began: its header and read timeouts count from here
	ahead       *http.Request // phaseBody: the request whose body is read ahead
	abuf        []byte        // the body read ahead so far
	aheld       int64         // bytes of Server.Budget held for abuf
	spilled     int64         // bytes of Server.Budget held for spill
	lingerAt    time.Time     // phaseLinger: when it began

	// A detached response (detach.go). detached is the connection's
	// goroutine's; the others are finish's until the request ends.
	detached    bool         // the running handler detached its response
	pending     atomic.Int32 // parties (handler return, finish) still to end the request
	nonBlocking bool         // flush writes without waiting, spilling the rest
	spill       []byte       // what the socket did not take, for writeSpill
	reuse       bool         // the detached response left the connection reusable
	finishFn    func()       // c.finishDetached, made once
	wv          writevState  // writeNow's

	w    response // reused for every request
	kvs  []kv     // header snapshot, reused
	out  *outbuf  // where hbuf and wbuf come from, during a request
	hbuf []byte   // response head not yet written
	wbuf []byte   // response body not yet written
	iov  net.Buffers
	iovs [3][]byte // c.iov's storage
	werr error     // first write error; the connection is then dropped

	dateSec int64
	date    []byte
}

// headBuffered reports whether the read buffer already holds a whole
// request head.
func (c *conn) headBuffered() bool {
	return bytes.Contains(c.in.bytes(), []byte("\r\n\r\n"))
}

func (c *conn) close() {
	if st := c.state.Swap(stateClosed); st == stateParked || st == stateReading {
		c.closeParked()
		return
	}
	c.rwc.Close()
}

// closeParked closes a connection that a swap of its state from parked
// to closed took from the poller, and lets go of it: it has no goroutine
// to do that.
func (c *conn) closeParked() {
	c.rwc.Close()
	c.finish()
}

// setReadTimeout arms the read deadline d from now, or clears it.
func (c *conn) setReadTimeout(d time.Duration) {
	if d > 0 {
		c.rwc.SetReadDeadline(time.Now().Add(d))
		c.readDL = true
	} else if c.readDL {
		c.rwc.SetReadDeadline(time.Time{})
		c.readDL = false
	}
}

// serve serves the connection from its first request. Its goroutine
// ends when the connection is closed, handed over or parked.
func (c *conn) serve() {
	c.setReadTimeout(orRead(c.srv.ReadHeaderTimeout, c.srv.ReadTimeout))
	if !c.loop(true) {
		c.finish()
	}
}

// resume serves a connection that the poller found ready, on a worker.
func (c *conn) resume() {
	if !c.loop(false) {
		c.finish()
	}
}

// finish lets go of a connection that is closed or handed over.
func (c *conn) finish() {
	s := c.srv
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.in.free()
	c.dropAhead()
	if c.pf.registered {
		s.poller.forget(c)
	}
}

// Where a connection is in reading its next request, for the worker that
// resumes it after it was parked mid-request.
const (
	phaseIdle   uint8 = iota // between requests
	phaseHead                // part of a request head is buffered (stashed while parked)
	phaseBody                // c.ahead's head is read and its body is being read ahead
	phaseLinger              // answered and half-closed: what the client still sends is dropped (linger)
)

// readNext results.
type readResult uint8

const (
	readOK     readResult = iota // a request to serve
	readParked                   // parked: the goroutine must let go of the connection
	readEnded                    // closed or handed over
)

// loop serves requests until the connection is closed or handed over,
// or until it is parked, which it reports. It starts with the first
// request, or with a resumed connection: idle, or parked mid-request.
func (c *conn) loop(first bool) (parked bool) {
	s := c.srv
	for resumed := !first; ; first, resumed = false, false {
		if c.phase == phaseLinger {
			return c.linger()
		}
		req, res := c.readNext(first, resumed)
		switch res {
		case readParked:
			return true
		case readEnded:
			return false
		}
		if s.WriteTimeout > 0 {
			c.rwc.SetWriteDeadline(time.Now().Add(s.WriteTimeout))
		}
		if !c.serveRequest(req) {
			if c.phase == phaseLinger {
				return c.linger()
			}
			return false
		}
		if c.detached {
			c.detached = false
			if c.pending.Add(-1) != 0 {
				return true // finish ends the request and moves the connection on
			}
			// finish is done already: go on here, as after an ordinary
			// response, rather than queue the connection for a worker.
			if !c.reuse || c.state.Load() == stateClosed {
				c.close()
				return false
			}
		}
		if !s.keepAlives() { // turned off after this response's head was written
			c.close()
			return false
		}
	}
}

// readNext reads the connection's next request: its head and, when its
// handler takes the whole body (Server.BodyLimit), the body too. Where it
// would wait for the client and the connection can park, it parks it
// instead, and a worker resumes it here when more comes.
func (c *conn) readNext(first, resumed bool) (*http.Request, readResult) {
	s := c.srv
	switch c.phase {
	case phaseBody:
		return c.readAhead()
	case phaseHead:
		c.in.unstash()
	default:
		if res := c.startRequest(first, resumed); res != readOK {
			return nil, res
		}
	}
	req, n, res := c.readHead(first)
	if res != readOK {
		return nil, res
	}
	c.in.Discard(n)
	c.phase = phaseIdle
	c.lastPOST = req.Method == "POST"
	if req.Body == http.NoBody {
		// The request is read: the buffer is free while the handler
		// waits on memcached, as is most of the time with thousands
		// of clients.
		c.in.release()
		return req, readOK
	}
	if c.readsAhead(req) {
		c.ahead, c.phase = req, phaseBody
		return c.readAhead()
	}
	if req.ContentLength > int64(c.in.Buffered()) {
		c.setReadTimeout(s.ReadTimeout) // zero clears the header deadline, as net/http
	}
	return req, readOK
}

// startRequest waits, between requests, until the next request begins,
// and makes the connection active. A connection that can park waits in
// the poller (awaitRequest); else, or when a resumed one finds fewer
// bytes than it needs, in a read.
func (c *conn) startRequest(first, resumed bool) readResult {
	s := c.srv
	hdrTimeout := orRead(s.ReadHeaderTimeout, s.ReadTimeout)
	idle := c.in.Buffered() == 0
	peek := 4 // as net/http, which closes silently on less between requests
	if first {
		peek = 1
	}
	if idle && !first {
		if !resumed {
			c.state.Store(stateIdle)
		}
		if !s.keepAlives() { // Shutdown or SetKeepAlivesEnabled may have missed us
			c.close()
			return readEnded
		}
		if c.awaitRequest(resumed) {
			return readParked
		}
		if c.in.Buffered() > 0 && c.canPark() {
			// The request has begun: whatever else its head needs
			// is waited for in the poller, up to the header timeout.
			peek = 1
		} else if c.in.Buffered() < peek {
			// The Peek below waits for the request.
			c.setReadTimeout(orRead(s.IdleTimeout, s.ReadTimeout))
		}
	}
	if !idle && !first && !c.headBuffered() {
		// A pipelined request, not all here yet: the Peek may wait.
		c.setReadTimeout(hdrTimeout)
	}
	// An idle connection waits here without a read buffer (see inbuf).
	if _, err := c.in.Peek(peek); err != nil {
		c.close()
		return readEnded
	}
	if !c.state.CompareAndSwap(stateIdle, stateActive) && !c.state.CompareAndSwap(stateNew, stateActive) && c.state.Load() != stateActive {
		return readEnded // closed by closeIdle
	}
	// Deadlines cost a runtime timer update each, so the header and
	// read timeouts are armed only when a read may wait: a head not
	// yet complete in the buffer, or a body not yet buffered. A request
	// that arrived whole (the usual case) costs no read deadline but
	// the idle one.
	c.headAt = time.Now()
	if first {
		c.headAt = c.created
	} else if idle && !c.headBuffered() {
		c.setReadTimeout(hdrTimeout)
	}
	c.crlfSkipped = 0
	if c.lastPOST { // net/http's tolerance of old clients' CRLF after a POST body
		b, _ := c.in.Peek(min(4, c.in.Buffered()))
		n := 0
		for n < len(b) && (b[n] == '\r' || b[n] == '\n') {
			n++
		}
		c.in.Discard(n)
		c.crlfSkipped = n
	}
	c.reqFirst = first
	return readOK
}

// canPark reports whether the connection can wait in the poller.
func (c *conn) canPark() bool { return c.srv.poller != nil && c.in.rc != nil }

// awaitRequest parks the idle connection with the poller if its next
// request is not there yet, and reports whether it did: the goroutine
// must then let go of it. Else the request, or a read error, is in c.in,
// or c has no poller and the caller waits for the request in a read. A
// resumed connection reads first, as it is expected to have a request.
func (c *conn) awaitRequest(resumed bool) bool {
	p := c.srv.poller
	if p == nil { // no poller here: the caller waits in a read
		return false
	}
	for {
		if !resumed {
			if c.readDL { // a parked connection has the poller's idle timeout
				c.setReadTimeout(0)
			}
			switch p.park(c) {
			case parked:
				return true // c is the poller's now: hands off
			case notParked:
				return false
			}
		}
		resumed = false
		if !c.in.poll() {
			return false // something to serve, or an error to report
		}
	}
}

// waitMore waits for more of the request being read: it parks the
// connection until the bytes come or deadline passes, if it can
// (parked), or reads once, waiting up to deadline. A read error is left
// in c.in for the caller.
func (c *conn) waitMore(deadline time.Time) (wasParked bool) {
	if c.canPark() {
		for {
			if !c.in.tryFill() {
				return false // bytes, an error, or a full buffer
			}
			if c.phase == phaseHead {
				c.in.stash()
			}
			if c.readDL {
				c.setReadTimeout(0) // the poller keeps the deadline while parked
			}
			switch c.srv.poller.parkReading(c, stateActive, deadline) {
			case parked:
				return true
			case notParked:
				c.in.unstash()
				c.setDeadline(deadline)
				c.in.fill()
				return false
			}
			c.in.unstash() // readable: bytes came since the last read
		}
	}
	c.setDeadline(deadline)
	c.in.fill()
	return false
}

// setDeadline arms the read deadline at t, or clears it if t is zero.
func (c *conn) setDeadline(t time.Time) {
	if t.IsZero() {
		c.setReadTimeout(0)
		return
	}
	c.rwc.SetReadDeadline(t)
	c.readDL = true
}

// deadline is when a read of the current request times out after d
// (zero: never).
func (c *conn) deadline(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return c.headAt.Add(d)
}

// serveRequest runs the handler and finishes its response. It reports
// whether the connection may serve another request; if not, it has
// closed the connection.
func (c *conn) serveRequest(req *http.Request) bool {
	w := &c.w
	w.reset(c, req)
	c.takeOut()
	ok := c.runHandler(w, req)
	if c.detached {
		// The response is finish's now (see detach.go). A handler that
		// panicked after detaching still owes it; its connection closes.
		if !ok {
			c.close()
		}
		return true
	}
	defer func() {
		w.forget()
		c.releaseOut()
	}()
	if !ok {
		if w.committed { // as net/http, send what was already on its way
			c.flush(nil)
		}
		c.close()
		return false
	}
	w.finish()
	if w.reusable() {
		return true
	}
	if w.tooBig || w.body != nil && w.body.early {
		c.phase = phaseLinger // loop lingers, then closes
		return false
	}
	c.close()
	return false
}

// outbuf keeps a response's head and body buffers in the server's pool
// between responses, so that a connection waiting for its next request
// holds none.
type outbuf struct{ head, body []byte }

// takeOut gives the connection its response buffers.
func (c *conn) takeOut() {
	o, _ := c.srv.writers.Get().(*outbuf)
	if o == nil {
		o = new(outbuf)
	}
	c.out, c.hbuf, c.wbuf = o, o.head[:0], o.body[:0]
}

// releaseOut returns the response buffers to the pool, but not a body
// buffer grown by a large response.
func (c *conn) releaseOut() {
	o := c.out
	o.head, o.body = c.hbuf[:0], c.wbuf[:0]
	if cap(o.body) > 4*maxBuffer {
		o.body = nil
	}
	c.srv.writers.Put(o)
	c.out, c.hbuf, c.wbuf = nil, nil, nil
}

func (c *conn) runHandler(w *response, req *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler && c.srv.ErrorLog != nil {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			c.srv.logf("h1: panic serving %s: %v\n%s", c.remote, v, buf)
		}
	}()
	c.srv.Handler.ServeHTTP(w, req)
	return true
}

// linger half-closes the connection and drops what the client still
// sends, for up to lingerTime or until it closes, and then closes it, so
// that closing with unread request bytes does not reset the connection
// before the client has read the response. (net/http half-closes and
// sleeps instead.) A connection that can park waits in the poller
// meanwhile, not on a worker: linger reports whether it parked it.
func (c *conn) linger() (wasParked bool) {
	if !c.canPark() {
		c.lingerClose()
		c.close()
		return false
	}
	if c.lingerAt.IsZero() {
		if cw, ok := c.rwc.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		c.lingerAt = time.Now()
	}
	for {
		for c.in.Buffered() > 0 {
			c.in.Discard(c.in.Buffered())
		}
		if !c.in.tryFill() {
			if c.in.Buffered() > 0 {
				continue
			}
			c.close() // the client closed (or reset), or the socket failed
			return false
		}
		if c.readDL {
			c.setReadTimeout(0)
		}
		switch c.srv.poller.parkReading(c, stateActive, c.lingerAt.Add(lingerTime)) {
		case parked:
			return true
		case notParked:
			c.lingerClose()
			c.close()
			return false
		}
	}
}

// lingerClose is linger for a connection that cannot park: it waits in a
// read on its goroutine.
func (c *conn) lingerClose() {
	if cw, ok := c.rwc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.rwc.SetReadDeadline(time.Now().Add(lingerTime))
	io.Copy(io.Discard, c.rwc)
}

// handover gives the connection, with every byte read but not consumed,
// to Fallback.
func (c *conn) handover() {
	if c.pf.registered {
		c.srv.poller.forget(c) // before Fallback reads it
	}
	c.rwc.SetDeadline(time.Time{})
	buf := bytes.Clone(c.in.bytes())
	c.in.free()
	c.state.Store(stateClosed) // no longer ours: closeIdle and Close leave it alone
	s := c.srv
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	// Fallback reads the rest of the connection through GuardConn, which
	// makes net/http refuse what the fast path refuses (errBothLengths).
	if !c.ho.give(GuardConn(&replayConn{Conn: c.rwc, buf: buf})) {
		c.rwc.Close()
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

// replayConn is a connection whose first reads return buf.
type replayConn struct {
	net.Conn
	buf []byte
}

func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.buf) == 0 {
		return r.Conn.Read(p)
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// CloseWrite lets net/http half-close the connection as it does on TCP.
func (r *replayConn) CloseWrite() error {
	if cw, ok := r.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
