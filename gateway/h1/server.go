package h1

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memcgate/memcgate/upstream/loggate"
)

// Server serves HTTP/1.x connections with Handler, taking the fast path
// for simple requests and passing the connection to Fallback from the
// first request it does not take. Its zero value plus Handler and
// Fallback is ready to use; nothing runs until Serve. A Server is safe for
// concurrent use and must not be copied after first use.
type Server struct {
	// Handler serves every request, on the fast path. It must not be nil.
	Handler http.Handler

	// Detached, if not nil, is offered each fast-path request before
	// Handler, with the request's response as d (see Detach, Block,
	// WaitIfRefused and ReleaseRequest):
	// it either serves the request, detaching the response if it
	// finishes it later, and reports true, or touches nothing and
	// reports false, and Handler serves it.
	Detached func(w http.ResponseWriter, r *http.Request, d interface {
		Detach() (finish func())
		Block()
		WaitIfRefused()
		ReleaseRequest()
	}) bool

	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout mean
	// what they mean in http.Server, including the fall back from
	// ReadHeaderTimeout and IdleTimeout to ReadTimeout when zero. Zero or
	// negative means no timeout. ReadTimeout counts the whole request
	// from its start, head and body, however the body is read. Fallback
	// applies its own timeouts to the connections it is given, but not
	// past ReadTimeout for the request a connection is handed over in,
	// counted from that request's start, nor, while that request's head
	// is not all read, past its ReadHeaderTimeout counted alike.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration

	// MaxHeaderBytes is the request head limit, as in http.Server (zero
	// means http.DefaultMaxHeaderBytes). The fast path only takes heads
	// of at most 4 KiB, which net/http always accepts (it allows
	// MaxHeaderBytes plus 4096 bytes), and Fallback enforces the limit
	// on larger ones, so Serve refuses to run when the two disagree. A
	// larger head is read whole, or up to that limit, before its
	// connection is handed to Fallback, waiting in the poller meanwhile
	// as a short one does.
	MaxHeaderBytes int

	// HeadTooLarge, if not empty, is the body of the 431 that answers a
	// head over that limit, in place of net/http's "431 Request Header
	// Fields Too Large" (Guard.HeadTooLarge): a line naming the limit
	// and what sets it. Such a head is Fallback's to answer: it reads
	// the connection through a Guard with this HeadTooLarge.
	HeadTooLarge string

	// TooManyConns, if not empty, is the body of the 503 that answers a
	// connection over MaxConns, in place of "too many client
	// connections; retry shortly": a line naming the cap and what sets
	// it.
	TooManyConns string

	// TooManyHanded, if not empty, is the body of the 503 that answers a
	// request Fallback would serve while Fallback has its share of
	// MaxConns, in place of "too many connections with chunked requests
	// or long heads; retry shortly".
	TooManyHanded string

	// Fallback serves the connections the fast path does not take, from
	// the first request it does not take on; it usually has the same
	// Handler and timeouts. It must not be nil. Serve runs Fallback.Serve
	// on an internal listener, Shutdown and Close shut it down too, and
	// SetKeepAlivesEnabled is passed on to it. The first Serve sets
	// Fallback.ConnState to a hook of its own that calls the one it had
	// first, if any, so that it knows which handed connections are idle.
	Fallback *http.Server

	// ErrorLog receives handler panics, superfluous WriteHeader calls and
	// accept errors. Nil discards them.
	ErrorLog *log.Logger

	// NewContext, if not nil, makes each fast-path request's context from
	// the connection's, which carries http.LocalAddrContextKey and which
	// Close cancels; it must return a context derived from parent. A
	// handler that would attach a context of its own with WithContext
	// (a copy of the whole request, about 250 bytes, per request) can
	// have it made here and find it in the request instead. head is when
	// the request's head was read: a body read ahead (BodyLimit) comes
	// after it and before the handler runs, so a handler that times
	// requests from their head, as net/http starts its handlers, counts
	// from head rather than from when it starts. client is the request's
	// connection: its Gone reports, without waiting (one non-blocking
	// peek at the socket on Linux; elsewhere always false), whether the
	// client has closed or reset it, which the fast path notices nowhere
	// else (its request contexts are not cancelled when a client goes),
	// so that a handler can leave undone work whose answer nobody would
	// read. It is valid while the request runs.
	NewContext func(parent context.Context, head time.Time, client interface{ Gone() bool }) context.Context

	// BodyLimit, if not nil, says how much of a request's body its
	// handler reads (it is called once the head is read, for requests
	// with a Content-Length body). A body of at most that many bytes
	// that has not all arrived with its head is read whole before the
	// handler runs, as it arrives, with the connection waiting in the
	// poller and not on a worker, up to ReadTimeout; the handler then
	// reads it from memory. One not whole by ReadTimeout reaches the
	// handler too, its body failing with a timeout (a net.Error), as a
	// read from the connection past its deadline fails: the handler
	// answers it, and the connection closes after, lingering. Nil, or a
	// larger body: the handler reads it from the connection, as
	// net/http's does.
	BodyLimit func(r *http.Request) int64

	// Budget, if not nil, holds the bytes of bodies read ahead of their
	// handler and of responses a slow client has not taken yet. A body
	// it refuses fails the handler's read with its error (the connection
	// closes after the response); a detached response whose rest it
	// refuses is cut short and the connection closed, unless it may wait
	// (WaitIfRefused).
	Budget Budget

	// BudgetWait is how long a body read ahead that Budget cannot hold
	// whole yet may wait for room, in line behind the bodies that waited
	// first, with the connection parked in the poller: its bytes wait in
	// the socket. Past it (after one last try), or with the line full
	// (see poller.waitRoom), the handler's read fails with the budget's
	// error. 0: refused at once.
	// SetBudgetWait changes it while the Server runs.
	BudgetWait time.Duration

	// MaxConns, if positive, is the most client connections the Server
	// serves at once, over all its listeners, those handed to Fallback
	// included. A connection accepted beyond it makes room by closing the
	// one the Server would close soonest anyway: of the connection idle
	// (between requests) the longest, due at IdleTimeout, and the silent
	// or slow one nearest its header timeout (parked waiting for a
	// request head, or lingering after an answer), the one due first; so
	// silent connections go before a keep-alive client served a moment
	// ago (nginx closes the idle ones first). When there is neither,
	// it is answered 503 Service Unavailable with Retry-After once its
	// request has begun to come, and closed after what the client still
	// sends is dropped for a while, as after a 400, so that the answer is
	// not lost to a broken pipe or a reset; up to MaxConns/16 (at least
	// 1, at most 64) are answered so at once, each holding a descriptor
	// beyond MaxConns for 30 s at most, others at once with what they had
	// sent by then read first. Neither waits: the accept loop goes on at
	// once.
	// Connections whose handler runs or whose body is being read, and
	// those handed to Fallback, are never closed to make room.
	// The cap keeps the descriptors and kernel memory that clients may
	// take bounded, and leaves the rest of the open-file limit to the
	// process's other connections (memcached, the admin listener).
	// SetMaxConns changes it while the Server runs.
	MaxConns int

	// Buffers, if not nil, lends the buffers bodies are read ahead into,
	// and those that hold what a detached response's client did not take
	// at once, and takes back those the connection is done with. Nil:
	// they are allocated, and left to the garbage collector.
	Buffers Buffers

	readers       sync.Pool // of *[readBufSize]byte, for conn.in
	writers       sync.Pool // of *outbuf, for conn.hbuf and conn.wbuf
	requests      sync.Pool // of *reqObjs given back by their handlers (ReleaseRequest)
	inShutdown    atomic.Bool
	noKeepAlives  atomic.Bool
	date          atomic.Pointer[dateStamp] // the Date header of the current second, for every connection
	acceptErrs    atomic.Uint64             // accept failures Serve waited out
	open          atomic.Int64              // connections accepted and not closed yet, handed over ones included
	reclaimed     atomic.Uint64             // idle (or, for handedLimit, slow) connections closed to make room under MaxConns or handedLimit
	refused       atomic.Uint64             // connections answered 503 and closed over MaxConns
	refusedLog    loggate.Gate              // refusals logged
	badRequests   atomic.Uint64             // requests answered 400 and closed before a handler (badRequest)
	badLog        loggate.Gate              // such requests logged
	hdrTimeouts   atomic.Uint64             // connections closed at the header timeout (timedOut)
	idleTimeouts  atomic.Uint64             // connections closed at the idle timeout (timedOut)
	handed        atomic.Int64              // connections handed to Fallback and not closed yet
	handedConns   handedConns               // those of them, idle between requests or working
	hookFallback  sync.Once                 // sets Fallback.ConnState to follow handedConns
	refusalOnce   sync.Once                 // sets refusal and handedRefusal
	refusal       string                    // the answer to a connection over MaxConns (refusalAnswer of TooManyConns)
	handedRefusal string                    // the answer to a request over handedLimit (refusalAnswer of TooManyHanded)
	handedRefused atomic.Uint64             // requests answered 503 over handedLimit
	handedLog     loggate.Gate              // such refusals logged
	maxConns      atomic.Int64              // SetMaxConns': 0 unset (MaxConns applies), -1 no cap
	budgetWait    atomic.Int64              // SetBudgetWait's in nanoseconds, plus 1: 0 unset (BudgetWait applies)

	mu        sync.Mutex // guards listeners, conns, stopped, refusals, accepted, ctx, cancel and poller
	listeners map[*net.Listener]struct{}
	conns     map[*conn]struct{}
	refusals  map[*refused]struct{} // connections refuseLinger is answering
	accepted  uint64                // connections served on the fast path, ever
	ctx       context.Context       // parent of request contexts; Close cancels it
	cancel    context.CancelFunc
	poller    *poller // nil where connections cannot be parked; set before the first conn
	// stopped is set by Close, and by Shutdown once no connection is
	// left and every Serve has returned: a connection accepted after
	// that is closed unserved. One that Serve accepted as Shutdown
	// closed the listeners is served: the listening socket may be
	// shared with another process (systemd's), which would have kept
	// the connection queued for the next server, and its client would
	// get a reset for a request nothing refused.
	stopped bool

	pollWorkers int           // the poller's soft cap on workers; 0: maxWorkers (tests set it)
	lingerIdle  time.Duration // how long a lingering connection may send nothing; 0: lingerTime (tests set it)
}

const (
	readBufSize     = 4 << 10 // the largest request head the fast path takes
	shutdownPollMax = 100 * time.Millisecond
	newConnGrace    = 5 * time.Second        // a silent new conn counts as idle after this, as in net/http
	lingerTime      = 5 * time.Second        // how long a lingering connection may send nothing (nginx's lingering_timeout)
	refusalLinger   = 500 * time.Millisecond // the same for a refusal over MaxConns (refuseLinger), which many clients may cause at once
	lingerMax       = 30 * time.Second       // how long it may linger in all (nginx's lingering_time)
)

// lingering is how long a lingering connection may send nothing.
func (s *Server) lingering() time.Duration {
	if s.lingerIdle > 0 {
		return s.lingerIdle
	}
	return lingerTime
}

// Buffers lends byte buffers and takes them back (Server.Buffers).
// *bufpool.Pool implements it.
type Buffers interface {
	// Cap is the capacity of the buffer Get(n) returns.
	Cap(n int) int
	// Get returns a buffer of length 0 and a capacity of at least n.
	Get(n int) []byte
	// Put gives back a buffer that nothing will use any more.
	Put(b []byte)
}

// Budget bounds bytes held for clients (Server.Budget).
// *budget.Budget implements it.
type Budget interface {
	// Acquire holds n more bytes, or returns an error if that would
	// pass the limit.
	Acquire(n int64) error
	// Release gives back n bytes Acquire held.
	Release(n int64)
	// Room is how many more bytes Acquire would hold now, counting no
	// refusal.
	Room() int64
	// Limit is the most it holds; <= 0: no limit.
	Limit() int64
}

// roomNotifier is a Budget that says when it gives room back
// (budget.Budget.OnFree): a body waiting for room is then let in as soon
// as there is, rather than at the poller's next look.
type roomNotifier interface {
	// OnFree has f called after each change that may give room, and
	// returns a function that stops the calls.
	OnFree(f func()) (stop func())
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
	acc := newAccepter(ln)
	ln = acc // closing it ends a waiting accept
	if !s.trackListener(&ln, true) {
		ln.Close()
		return http.ErrServerClosed
	}
	defer s.trackListener(&ln, false)
	defer ln.Close()

	s.makeRefusals()
	s.hookFallback.Do(func() {
		prev := s.Fallback.ConnState
		s.Fallback.ConnState = func(c net.Conn, st http.ConnState) {
			if prev != nil {
				prev(c, st)
			}
			s.handedConns.state(c, st)
		}
	})
	ho := &handoff{ch: make(chan net.Conn), done: make(chan struct{}), addr: ln.Addr(), tooLarge: headTooLargeAnswer(s.HeadTooLarge)}
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
		rw, sk, err := acc.accept()
		if err != nil {
			if s.inShutdown.Load() {
				return http.ErrServerClosed
			}
			if retryAccept(err) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.acceptErrs.Add(1)
				s.logf("h1: accept error: %v; retrying in %v", err, delay)
				time.Sleep(delay)
				continue
			}
			return fmt.Errorf("h1: accept: %w", err)
		}
		delay = 0
		if !s.room(rw, sk) {
			continue
		}
		c := s.newConn(rw, sk, ho)
		if c == nil {
			rw.Close()
			s.open.Add(-1)
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
		hdr := s.headTimeout()
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

// room counts a newly accepted connection and reports whether it may be
// served under MaxConns, closing an idle or silent one to make room if
// need be (poller.evict). If not, it answers the connection 503 and
// closes it.
func (s *Server) room(rw net.Conn, sk *sock) bool {
	limit := s.connLimit()
	if s.open.Add(1) <= limit || limit == 0 {
		return true
	}
	if c := s.poller.evict(); c != nil {
		c.closeParked() // its finish uncounts it
		s.reclaimed.Add(1)
		return true
	}
	s.open.Add(-1)
	n := s.refused.Add(1)
	s.refuse(rw, sk)
	// One line a second at most: an attacker must not flood the log.
	if _, ok := s.refusedLog.Pass(); ok {
		s.logf("h1: %d client connections open, the most allowed, none idle or silent: refused a connection with 503 (%d refused so far)", limit, n)
	}
	return false
}

// badRequest counts a request the Server answered 400 and closed before
// any handler saw it, for the reason err: a head the fast path cannot
// read, or framing that a proxy in front may read differently
// (errBothLengths, errTEOnHTTP10), refused by the fast path or, on a
// connection handed to Fallback, by GuardConn. Such requests reach no
// handler, so no access log line or request metric shows them: broken
// clients and smuggling attempts would go unseen. One line a second at
// most, with the count, so that a flood of them cannot flood the log.
func (s *Server) badRequest(err error) {
	n := s.badRequests.Add(1)
	if _, ok := s.badLog.Pass(); ok {
		s.logf("h1: answered a request 400 and closed its connection before any handler: %v (%d such requests so far)", err, n)
	}
}

// timedOut counts a connection the Server closes because its client sent
// nothing in time: idle, between requests; or at phase, in the middle of
// a head, or new and silent. A connection lingering after an answer
// (phaseLinger) was counted when it was answered, and a body read ahead
// is answered by its handler, not closed (readAhead).
func (s *Server) timedOut(phase uint8, idle bool) {
	switch {
	case phase == phaseLinger:
	case idle:
		s.idleTimeouts.Add(1)
	default:
		s.hdrTimeouts.Add(1)
	}
}

// isTimeout reports whether err is a read that reached its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// SetMaxConns sets MaxConns (n <= 0: no cap) while the Server runs. A
// lower cap than the connections open closes none of them: each new
// connection then makes room or is refused as at the cap, until enough
// have closed.
func (s *Server) SetMaxConns(n int) {
	if n <= 0 {
		n = -1
	}
	s.maxConns.Store(int64(n))
}

// SetBudgetWait sets BudgetWait while the Server runs, for the bodies
// that join the line from then on.
func (s *Server) SetBudgetWait(d time.Duration) { s.budgetWait.Store(int64(max(d, 0)) + 1) }

// budgetWaitNow is BudgetWait as SetBudgetWait last set it.
func (s *Server) budgetWaitNow() time.Duration {
	if d := s.budgetWait.Load(); d > 0 {
		return time.Duration(d - 1)
	}
	return s.BudgetWait
}

// connLimit is the cap on connections now; 0: none.
func (s *Server) connLimit() int64 {
	switch n := s.maxConns.Load(); {
	case n < 0:
		return 0
	case n > 0:
		return n
	}
	return int64(max(s.MaxConns, 0))
}

// maxRefusing is how many connections over MaxConns may be answered at
// once by refuseLinger, each holding a descriptor and a goroutine beyond
// MaxConns for lingerMax at most: no more than a sixteenth of MaxConns,
// so that they take little of the descriptors that the cap keeps for
// the process's other connections (memcgate keeps a quarter of its
// open-file limit). Others are answered by refuseNow.
const maxRefusing = 64

// refuse answers rw, a connection over MaxConns, with refusal and closes
// it, without waiting: on a goroutine of its own (refuseLinger), or at
// once (refuseNow) while as many others as allowed are answered so.
//
// Shutdown waits for those being answered and then closes them as they
// linger; Close closes them at once.
func (s *Server) refuse(rw net.Conn, sk *sock) {
	s.makeRefusals()
	r := &refused{rw: rw, answer: s.refusal}
	s.mu.Lock()
	lingers := !s.inShutdown.Load() && len(s.refusals) < int(max(1, min(maxRefusing, s.connLimit()/16)))
	if lingers {
		if s.refusals == nil {
			s.refusals = make(map[*refused]struct{})
		}
		s.refusals[r] = struct{}{}
	}
	s.mu.Unlock()
	if !lingers {
		refuseNow(rw, sk, s.refusal)
		return
	}
	go func() {
		refuseLinger(r)
		s.mu.Lock()
		delete(s.refusals, r)
		s.mu.Unlock()
	}()
}

// refused is a connection refuseLinger is answering.
type refused struct {
	rw       net.Conn
	answer   string      // Server.refusal
	answered atomic.Bool // the refusal is written: it lingers
}

// closeRefusals closes the connections refuseLinger is answering, all of
// them or only those whose answer is written, and reports whether none
// were left.
func (s *Server) closeRefusals(all bool) bool {
	var closing []net.Conn
	s.mu.Lock()
	left := len(s.refusals)
	for r := range s.refusals {
		if all || r.answered.Load() {
			closing = append(closing, r.rw)
		}
	}
	s.mu.Unlock()
	for _, rw := range closing {
		rw.Close() // refuseLinger's Read returns, and it ends
	}
	return left == 0
}

// refuseLinger answers rw with refusal once its request has begun to
// come (or after refusalLinger), then lingers as linger does, for
// refusalLinger of silence at most, and closes it.
// Closed at once, a connection accepted before its request came (a Unix
// socket, TCP without TCP_DEFER_ACCEPT) or sending a body is closed
// under the client's send, which then fails with a broken pipe or a
// reset, and curl, for one, reports that and not the answer.
func refuseLinger(r *refused) {
	rw := r.rw
	defer rw.Close()
	rw.SetReadDeadline(time.Now().Add(refusalLinger))
	var buf [512]byte
	if _, err := rw.Read(buf[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return // the client left: no one to answer
	}
	rw.SetWriteDeadline(time.Now().Add(refusalLinger))
	if _, err := io.WriteString(rw, r.answer); err != nil {
		return
	}
	r.answered.Store(true)
	lingerClose(rw, refusalLinger)
}

// makeRefusals makes the answers of refuse and refuseHandover from
// TooManyConns and TooManyHanded, once.
func (s *Server) makeRefusals() {
	s.refusalOnce.Do(func() {
		s.refusal = refusalAnswer(s.TooManyConns, "too many client connections; retry shortly")
		s.handedRefusal = refusalAnswer(s.TooManyHanded, "too many connections with chunked requests or long heads; retry shortly")
	})
}

// refusalAnswer is a 503 with Retry-After that closes its connection,
// with body (Server.TooManyConns, TooManyHanded), or def when body is
// empty.
func refusalAnswer(body, def string) string {
	if body == "" {
		body = def
	}
	body = strings.TrimSuffix(body, "\n") + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// retryAccept reports whether Serve should wait and accept again after
// err rather than stop: a timeout, or a lack of descriptors or memory
// (EMFILE, ENFILE, ENOBUFS, ENOMEM), which lasts only until some
// connections close. Stopping there would let any client that opens
// enough connections take the listener down for good.
func retryAccept(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return resourceShortage(err)
}

// Shutdown stops the server gracefully: it closes the listeners and the
// idle connections at once, lets active requests finish, closes each
// connection after its current response, shuts Fallback down with ctx, and
// waits for every Serve to return and every connection to end, those a
// Serve accepted as its listener closed included. Connections refused over MaxConns get
// their 503 and are then closed, not lingered on. It returns ctx.Err() if
// ctx ends first, else the first error closing a listener or from
// Fallback. Serve returns http.ErrServerClosed once its listener is
// closed.
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
	for {
		idle := s.closeIdle()
		if s.closeRefusals(false) && idle && s.stopIfEmpty() {
			break
		}
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
	s.stopped = true
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
	s.closeRefusals(true)
	s.closePoller(false)
	if s.Fallback != nil {
		if ferr := s.Fallback.Close(); ferr != nil && err == nil {
			err = ferr
		}
	}
	return err
}

// stopIfEmpty sets stopped if no connection is left and no Serve
// accepts any more (one may hold a connection it accepted and has not
// added yet), and reports whether it did.
func (s *Server) stopIfEmpty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) == 0 && len(s.listeners) == 0 {
		s.stopped = true
	}
	return s.stopped
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

// headTimeout is the time a request's head may take, counted from its
// start: ReadHeaderTimeout, or ReadTimeout without one.
func (s *Server) headTimeout() time.Duration { return orRead(s.ReadHeaderTimeout, s.ReadTimeout) }

// orRead is d, or read when d is zero.
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
			p.watchRoom(s.Budget)
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
		c.rwc.Close() // whoever holds it finishes it: its goroutine, the worker it is queued for, the poller (endHupped) or a detached response's finish
	}
	for _, c := range parked {
		c.closeParked()
	}
	return left == 0
}
