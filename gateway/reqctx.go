package gateway

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
)

// requestCtx is context.WithDeadline without a timer per request: most
// requests finish long before their deadline and never wait on Done (the
// memcached side has its own I/O timeouts), so the timer, a
// WithDeadline child, is made only when someone first asks for Done, or
// for Err once the deadline has passed. It then behaves exactly like
// that child.
type requestCtx struct {
	context.Context               // the request's own context
	start           time.Time     // when the request's head was read: its duration counts from here
	timeout         time.Duration // its deadline, from start: RequestTimeout, or as restart moved it
	mu              sync.Mutex    // guards arming the deadline, and rooms (one lock for both, and the bools beside armed: the struct fits 256 bytes, an allocation size class)
	armed           atomic.Bool   // timed is set
	used            bool          // a request was served with it
	slot            bool          // one of the limiter's in-flight slots, held until the request ends (handler.end)
	timed           context.Context
	cancel          context.CancelFunc
	route           *chi.Context // the value of chi.RouteCtxKey while set
	maker           *Handler     // who made it (Handler.NewContext): it may serve one request as it is

	lim    *limits // the limits of the handler serving the request (ReadBody, GetValue)
	client Client  // the request's connection, from a server that offers it (NewContext); nil otherwise

	// What the request holds until it ends (handler.end).
	held  int64        // bytes of the budget
	rooms []*valueRoom // what its reads hold (valueRoom), guarded by mu: a route's handler may read on several goroutines (GetValue)

	answer answerHeaders // the header values of a read's answer (answerScratch)
}

// answerHeaders is the memory of a read's answer headers (writeFound):
// their value slices and the digits of its ETag, flags and length, which
// fit nb unless the numbers are near their largest. In the request's
// context, they cost no allocation of their own; the context grows from
// 160 to 256 bytes, its allocation size classes, for two allocations
// fewer on every read.
type answerHeaders struct {
	hv    [4]string
	nb    [31]byte
	taken bool // handed out by answerScratch
}

// reqCtxKey is the key under which a requestCtx answers for itself, so
// that a context derived from it (r.WithContext in a handler of
// Options.Routes or a middleware) still leads to the request's limits.
type reqCtxKey struct{}

// Value answers chi.RouteCtxKey itself, so that chi finds its routing
// context without wrapping the request in another one, and reqCtxKey
// with c.
func (c *requestCtx) Value(key any) any {
	switch key {
	case reqCtxKey{}:
		return c
	case chi.RouteCtxKey:
		if c.route != nil {
			return c.route
		}
	}
	return c.Context.Value(key)
}

// newRequestCtx returns the context of a request whose head was read at
// start, with its deadline timeout after that.
func newRequestCtx(parent context.Context, start time.Time, timeout time.Duration) *requestCtx {
	return &requestCtx{Context: parent, start: start, timeout: timeout}
}

// deadline is when the request's memcached work must be done.
func (c *requestCtx) deadline() time.Time { return c.start.Add(c.timeout) }

func (c *requestCtx) arm() context.Context {
	if !c.armed.Load() {
		c.mu.Lock()
		if !c.armed.Load() {
			c.timed, c.cancel = context.WithDeadline(c.Context, c.deadline())
			c.armed.Store(true)
		}
		c.mu.Unlock()
	}
	return c.timed
}

// Deadline is the earlier of the parent's deadline and this one.
func (c *requestCtx) Deadline() (time.Time, bool) {
	dl := c.deadline()
	if d, ok := c.Context.Deadline(); ok && d.Before(dl) {
		return d, true
	}
	return dl, true
}

// Done arms the deadline.
func (c *requestCtx) Done() <-chan struct{} { return c.arm().Done() }

// Err is the parent's error, or DeadlineExceeded once the deadline has
// passed; it arms the deadline only then, so Done is closed whenever Err
// is not nil.
func (c *requestCtx) Err() error {
	if c.armed.Load() {
		return c.timed.Err()
	}
	if c.Context.Err() != nil || !time.Now().Before(c.deadline()) {
		return c.arm().Err()
	}
	return nil
}

// AfterFunc lets contexts derived from this one (context.WithCancel and
// the like) hook onto the armed deadline directly; without it they would
// each start a goroutine to watch Done.
func (c *requestCtx) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(c.arm(), f) }

// restart moves the deadline to d from now, unless something already
// waits on it.
func (c *requestCtx) restart(d time.Duration) {
	if !c.armed.Load() {
		c.timeout = time.Since(c.start) + d
	}
}

// stop releases the timer if one was made.
func (c *requestCtx) stop() {
	if c.armed.Load() {
		c.cancel()
	}
}

// takeContext returns the request's context for maker: the one maker made
// (NewContext) if it is r's context itself, or a new one of timeout,
// attached to a copy of r, whose head counts as read now (a server that
// does not make the context calls its handler once the head is read).
func takeContext(r *http.Request, maker *Handler, timeout time.Duration) (*requestCtx, *http.Request) {
	ctx, ok := r.Context().(*requestCtx) // identity, not a capability: only ours, unwrapped, is served as it is
	if !ok || ctx.maker != maker || ctx.used {
		parent := r.Context()
		if ok {
			// Not ours to take, and nobody would stop its timer if ours
			// armed it: hang ours on what it wraps.
			parent = ctx.Context
		}
		ctx = newRequestCtx(parent, time.Now(), timeout)
		r = r.WithContext(ctx)
	}
	ctx.used = true
	return ctx, r
}

// requestStart is when r's head was read (requestCtx.start), or now for
// a request without a requestCtx.
func requestStart(r *http.Request) time.Time {
	if rc := reqCtx(r); rc != nil {
		return rc.start
	}
	return time.Now()
}

// reqCtx is r's requestCtx, found through any context derived from it:
// every request under Handler has one, and the limits that take it fail
// closed without one (no in-flight slot, every byte refused).
func reqCtx(r *http.Request) *requestCtx {
	rc, _ := r.Context().Value(reqCtxKey{}).(*requestCtx)
	return rc
}
