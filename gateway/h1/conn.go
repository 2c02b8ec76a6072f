package h1

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"time"
)

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

func (s *Server) newConn(rw net.Conn, sk *sock, ho *handoff) *conn {
	c := &conn{srv: s, rwc: rw, sk: sk, ho: ho, created: time.Now()}
	c.in.init(rw, &s.readers)
	c.in.uncopied = c.in.rc != nil && sk.dropsUncopied()
	if ra := rw.RemoteAddr(); ra != nil {
		c.remote = ra.String()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	c.lctx = connCtx{Context: s.ctx, c: rw}
	c.ctx = &c.lctx
	s.conns[c] = struct{}{}
	s.accepted++
	return c
}

// connCtx is a connection's context: the Server's, plus the connection's
// local address under http.LocalAddrContextKey, asked for only when a
// handler looks (a sock on a wildcard address learns it with a system
// call).
type connCtx struct {
	context.Context
	c net.Conn
}

// Value implements context.Context.
func (x *connCtx) Value(key any) any {
	if key == http.LocalAddrContextKey {
		return x.c.LocalAddr()
	}
	return x.Context.Value(key)
}

// A conn is one client connection served on the fast path. Everything but
// state is owned by the connection's goroutine.
type conn struct {
	srv     *Server
	rwc     net.Conn
	sk      *sock // rwc, if the Server accepted it itself; nil otherwise
	in      inbuf // holds a buffer only while a request is being read
	ho      *handoff
	ctx     context.Context // the per-connection parent of request contexts: lctx
	lctx    connCtx
	remote  string
	created time.Time
	state   atomic.Int32
	handed  bool // handed over to Fallback, which now holds its place under MaxConns

	readDL   bool       // a read deadline is set
	writeDL  bool       // a write deadline has been set on the connection, ever
	writeBy  time.Time  // the response's WriteTimeout deadline, not set yet (armWrite)
	lastPOST bool       // the last request was a POST: skip up to 4 stray CR/LF
	pf       pollFields // the poller's, guarded by its mutex

	// The request being read (readNext).
	phase       uint8
	reqFirst    bool          // it is the connection's first
	crlfSkipped int           // CR/LF bytes dropped before it (after a POST)
	headAt      time.Time     // when it began: its header and read timeouts count from here
	hs          headScan      // how much of its head readHead has checked
	ahead       *http.Request // phaseBody: the request whose body is read ahead
	abuf        []byte        // the body read ahead so far
	aheld       int64         // bytes of Server.Budget held for abuf
	aheldAt     time.Time     // when abuf was held whole (reserveAfter); zero: it is not
	aheadShrunk bool          // it stopped while held whole and gave back what it had not sent (shrinkAhead)
	roomTurn    bool          // taken from the room line: its turn to take room (poller.waitRoom)
	roomGaveUp  bool          // waited BudgetWait in the room line for nothing
	roomSince   time.Time     // when the body read ahead first came into the room line; zero: it has not
	roomSeq     uint64        // its place in the room line's order, from when it first came in
	spilled     int64         // bytes of Server.Budget held for spill
	lingerAt    time.Time     // phaseLinger: when it began

	// The objects of the request being served (newRequest), until it
	// ends (endRequest). rqBack is set by the handler (ReleaseRequest)
	// and read once the request has ended, after the handler's return
	// and, for a detached response, its finish.
	rq     *reqObjs
	rqBack bool

	// A detached response (detach.go). detached is the connection's
	// goroutine's; the others are finish's until the request ends.
	detached    bool         // the running handler detached its response
	pending     atomic.Int32 // parties (handler return, finish) still to end the request
	nonBlocking bool         // flush writes without waiting, spilling the rest
	waitRefused bool         // once the budget refuses a spill, flush waits instead (WaitIfRefused)
	spill       []byte       // what the socket did not take, for writeSpill
	reuse       bool         // the detached response left the connection reusable
	finishFn    func()       // c.finishDetached, made once
	wv          writevState  // writeNow's

	w    response // reused for every request
	kvs  []kv     // header snapshot, during a request (from out)
	out  *outbuf  // where hbuf and wbuf come from, during a request
	hbuf []byte   // response head not yet written
	wbuf []byte   // response body not yet written
	iov  net.Buffers
	iovs [3][]byte // c.iov's storage
	werr error     // first write error; the connection is then dropped
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
//
// The header timeout is armed only when the first read may wait, that is
// when nothing has been read yet. A connection accepted with its first
// bytes (admit read them; TCP_DEFER_ACCEPT makes that the usual case)
// needs no deadline for them, and if its head is not whole, readHead
// arms the same deadline, counted from the accept, before it waits for
// the rest. A deadline costs a runtime timer, set here and deleted when
// the connection closes.
func (c *conn) serve() {
	if c.in.Buffered() == 0 {
		c.setReadTimeout(c.srv.headTimeout())
	}
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
	// A body still being read ahead was never handed to a handler; one
	// that was may still be referenced by its request.
	c.dropAhead(c.phase == phaseBody)
	if c.pf.registered {
		s.poller.forget(c)
	}
	if !c.handed {
		s.open.Add(-1)
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
		if !first && !resumed && c.in.Buffered() > 0 {
			// A request pipelined behind the one just served: let the
			// other goroutines run first, as nginx posts a pipelined
			// request as an event of its own. Without it a client
			// pipelining as fast as it can keeps its goroutine busy
			// until the scheduler preempts it, every 10 ms, and many
			// such clients hold a GET on another connection for seconds
			// (docs/benchmarks.md, Abuse: attack 7).
			runtime.Gosched()
		}
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
			c.setWriteTimeout(time.Now().Add(s.WriteTimeout))
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
			c.endRequest()
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
		c.hs = headScan{}
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
		if c.readDL {
			// readAhead counts its own deadline, from the request's
			// start; one left from before (a body an earlier handler
			// streamed, a header deadline) may have passed, and would
			// fail its reads from the socket at once.
			c.setReadTimeout(0)
		}
		c.ahead, c.phase = req, phaseBody
		c.aheldAt, c.aheadShrunk = time.Time{}, false
		return c.readAhead()
	}
	if req.ContentLength > int64(c.in.Buffered()) {
		// The handler reads the rest from the connection: its reads
		// share the read timeout counted from the request's start, as a
		// body read ahead does and as net/http's do, so that the whole
		// request takes no longer than ReadTimeout however long its head
		// took. Zero clears the header deadline, as net/http does.
		c.setDeadline(c.deadline(s.ReadTimeout))
	}
	return req, readOK
}

// startRequest waits, between requests, until the next request begins,
// and makes the connection active. A connection that can park waits in
// the poller (awaitRequest); else, or when a resumed one finds fewer
// bytes than it needs, in a read.
func (c *conn) startRequest(first, resumed bool) readResult {
	s := c.srv
	hdrTimeout := s.headTimeout()
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
		if isTimeout(err) {
			s.timedOut(phaseIdle, idle && !first && c.in.Buffered() == 0)
		}
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
	if first {
		c.headAt = c.created
	} else {
		c.headAt = time.Now()
		if idle && !c.headBuffered() {
			c.setReadTimeout(hdrTimeout)
		}
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

// setWriteTimeout makes t the deadline of the response's writes. It is
// set on the connection only before a write that may wait (armWrite): a
// response the socket takes at once, as a detached one always is, costs
// no runtime timer. Once a deadline has been set, each later one is set
// at once, because an expired deadline fails even a write that would not
// wait.
func (c *conn) setWriteTimeout(t time.Time) {
	if c.writeDL {
		c.rwc.SetWriteDeadline(t)
		return
	}
	c.writeBy = t
}

// armWrite sets the deadline setWriteTimeout kept, before a write that
// may wait.
func (c *conn) armWrite() {
	if !c.writeBy.IsZero() {
		c.rwc.SetWriteDeadline(c.writeBy)
		c.writeBy = time.Time{}
		c.writeDL = true
	}
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
		c.endRequest()
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
	if rb := w.body; w.tooBig || rb != nil && (rb.early || rb.err != nil && rb.err != io.ErrUnexpectedEOF) {
		// The client may still send: drop it while the answer goes out
		// (a body cut short at the read timeout, read ahead or by its
		// handler, or by the budget was answered 408 or 503, and its
		// client may be sending still: closing with its bytes unread
		// would reset the answer away; one that ended its side sends
		// nothing more). What was read ahead goes back first, so that
		// a lingering connection holds none of the budget.
		if rb != nil && (rb.ahead != nil || rb.err != nil) {
			rb.done()
		}
		c.phase = phaseLinger // loop lingers, then closes
		return false
	}
	c.close()
	return false
}

// endRequest ends the request being served, once its handler has
// returned and, for a detached response, finish has run: the request's
// objects go back to the server's pool if the handler gave them back
// (ReleaseRequest), or else stay with whoever holds them. A request whose
// connection closed before its handler ran (a body read ahead that never
// came whole) never ends: its objects are the collector's.
func (c *conn) endRequest() {
	o := c.rq
	if o == nil {
		return
	}
	c.rq = nil
	if c.rqBack {
		c.rqBack = false
		o.reset()
		c.srv.requests.Put(o)
	}
}

// outbuf keeps what a response needs in memory, its head and body
// buffers, its header map and the header's snapshot, in the server's
// pool between responses, so that a connection waiting for its next
// request holds none, and a client that opens a connection per request
// does not make them anew each time (the header map alone was about 550
// of the 4 KB a request allocated).
type outbuf struct {
	head, body []byte
	header     http.Header // emptied by response.forget; nil if it grew large
	kvs        []kv        // cleared
}

// takeOut gives the connection its response buffers and header map.
func (c *conn) takeOut() {
	o, _ := c.srv.writers.Get().(*outbuf)
	if o == nil {
		o = new(outbuf)
	}
	c.out, c.hbuf, c.wbuf = o, o.head[:0], o.body[:0]
	c.w.header, c.kvs = o.header, o.kvs[:0]
	o.header, o.kvs = nil, nil
}

// releaseOut returns the response buffers and header map to the pool,
// after response.forget emptied the map, but not a body buffer grown by
// a large response.
func (c *conn) releaseOut() {
	o := c.out
	o.head, o.body = c.hbuf[:0], c.wbuf[:0]
	if cap(o.body) > 4*maxBuffer {
		o.body = nil
	}
	o.header, o.kvs = c.w.header, c.kvs[:0]
	c.srv.writers.Put(o)
	c.out, c.hbuf, c.wbuf = nil, nil, nil
	c.w.header, c.kvs = nil, nil
}

func (c *conn) runHandler(w *response, req *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler && c.srv.ErrorLog != nil {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			c.srv.logf("h1: panic serving %s: %v\n%s", c.remote, v, buf)
		}
	}()
	if d := c.srv.Detached; d != nil {
		if d(w, req, w) {
			return true
		}
		// It reported false, so it must have touched nothing; a give-back
		// it made anyway must not reach a Handler that may keep the request.
		c.rqBack = false
	}
	c.srv.Handler.ServeHTTP(w, req)
	return true
}

// linger half-closes the connection and drops what the client still
// sends, until it closes, sends nothing for lingerTime, or has lingered
// for lingerMax, and then closes it, so that closing with unread request
// bytes does not reset the connection before the client has read the
// response: a client still sending a large body it was refused gets the
// answer, not a broken pipe. (nginx lingers alike; net/http half-closes
// and sleeps 500 ms.) A connection that can park waits in the poller
// meanwhile, not on a worker: linger reports whether it parked it.
func (c *conn) linger() (wasParked bool) {
	if !c.canPark() {
		lingerClose(c.rwc, c.srv.lingering())
		c.close()
		return false
	}
	if c.readDL {
		// A body cut short at the read timeout left its deadline
		// behind, passed: a read would fail at once, and the
		// connection would close with the client's bytes unread. The
		// poller keeps the linger's own deadline while parked.
		c.setReadTimeout(0)
	}
	if c.lingerAt.IsZero() {
		if cw, ok := c.rwc.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		c.lingerAt = time.Now()
	}
	dropped := 0 // bytes dropped since a worker took the connection
	for {
		for c.in.Buffered() > 0 {
			n, _ := c.in.Discard(c.in.Buffered())
			dropped += n
		}
		if dropped >= aheadTurn {
			// Others' turn, as in readAhead: a client sending fast
			// must not keep the worker for the whole lingerMax.
			c.in.release()
			if c.srv.poller.requeue(c) {
				return true
			}
		}
		n, blocked := c.in.tryDrop()
		dropped += n
		if !blocked {
			if n > 0 || c.in.Buffered() > 0 {
				continue
			}
			c.close() // the client closed (or reset), or the socket failed
			return false
		}
		switch c.srv.poller.parkReading(c, stateActive, lingerUntil(c.lingerAt, c.srv.lingering())) {
		case parked:
			return true
		case notParked:
			lingerClose(c.rwc, c.srv.lingering())
			c.close()
			return false
		}
	}
}

// lingerUntil is when a connection lingering since start is closed if
// nothing more comes: idle from now, lingerMax from start at most.
func lingerUntil(start time.Time, idle time.Duration) time.Time {
	end := start.Add(lingerMax)
	if idle := time.Now().Add(idle); idle.Before(end) {
		return idle
	}
	return end
}

// lingerClose is linger for a connection that cannot park, rw: it waits
// in reads on its goroutine. The caller closes rw after.
func lingerClose(rw net.Conn, idle time.Duration) {
	if cw, ok := rw.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	start := time.Now()
	var buf [4 << 10]byte
	for {
		rw.SetReadDeadline(lingerUntil(start, idle))
		if _, err := rw.Read(buf[:]); err != nil {
			return
		}
	}
}
