package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/loggate"
	"github.com/memcgate/memcgate/upstream/op"
)

// What a request may hold, and when it takes it.
//
// A request takes one of MaxRequests in-flight slots only once it has
// work for memcached: a request without a body when it is routed, one
// with a body once the body has been read (readBody), so that a client
// that is slow to send holds no slot. Bytes held for a request beyond
// smallHold (its body, a large value read for it, a multi-get's or
// batch's results) are held against the Budget from the moment they are
// in memory until the request ends; what the budget refuses is answered
// 503 with Retry-After. Both are given back by end.

// smallHold is the size below which a body or value is not counted
// against the budget: such bytes are bounded by the in-flight slots and
// leave as soon as their response is written, and counting them would
// cost the hot path two atomic operations per request.
const smallHold = 4 << 10

// limits are the in-flight cap and the byte budget of a handler.
type limits struct {
	lim    limiter
	budget *budget.Budget // nil: no bound
	// takeBody is Options.TakeBody: the body a server read ahead, or nil.
	takeBody  func(r *http.Request) []byte
	readError func(ctx context.Context) error // Options.ReadError, or nil
	bufs      Buffers                         // Options.Buffers, or nil
	timeout   atomic.Int64                    // RequestTimeout in nanoseconds: the memcached work's, from when the body is read
	// refused counts the requests answered 503 because every slot was
	// taken (memcgate_http_requests_refused_total); refusedLog lets a
	// warning about them through a second at most, as any client can
	// set off one per request.
	refused    atomic.Uint64
	refusedLog loggate.Gate
	log        *slog.Logger
}

// requestTimeout is RequestTimeout now.
func (l *limits) requestTimeout() time.Duration { return time.Duration(l.timeout.Load()) }

// limiter counts requests in flight against a cap; a zero max disables it.
type limiter struct {
	max      atomic.Int64 // 0: no cap
	inFlight atomic.Int64
}

// acquire counts a request in, if the cap allows it.
func (l *limiter) acquire() bool {
	if n := l.inFlight.Add(1); n > l.max.Load() && l.max.Load() > 0 {
		l.inFlight.Add(-1)
		return false
	}
	return true
}

// release counts out a request acquire let in.
func (l *limiter) release() {
	l.inFlight.Add(-1)
}

// errBusy answers a request that found every in-flight slot taken.
var errBusy = &overloadError{"too many requests in flight (MEMCGATE_MAX_REQUESTS); retry shortly"}

// takesBody reports whether r brings a body its handler reads before it
// does anything else, and so takes its slot only then.
func takesBody(r *http.Request) bool {
	return (r.Method == http.MethodPut || r.Method == http.MethodPost) && (r.ContentLength != 0 || len(r.TransferEncoding) > 0)
}

// middleware takes the slot of a request without a body (readBody takes
// the others'); end gives back whatever the request held.
func (l *limits) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := reqCtx(r)
		if !takesBody(r) && !l.takeSlot(rc) {
			writeError(w, errBusy)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// takeSlot takes an in-flight slot for rc's request, once. A request
// without a requestCtx (not served through Handler) gets none: the limits
// fail closed.
func (l *limits) takeSlot(rc *requestCtx) bool {
	if rc == nil {
		return false
	}
	if rc.slot {
		return true
	}
	if !l.lim.acquire() {
		l.refuse()
		return false
	}
	rc.slot = true
	return true
}

// refuse counts a request refused at the cap, and says so in the log a
// line a second at most, with the refusals that line stands for.
func (l *limits) refuse() {
	l.refused.Add(1)
	unlogged, ok := l.refusedLog.Pass()
	if !ok || l.log == nil {
		return
	}
	l.log.LogAttrs(context.Background(), slog.LevelWarn, "request refused with 503: every request slot is taken (MEMCGATE_MAX_REQUESTS)",
		slog.Int64("max_requests", l.lim.max.Load()), slog.Uint64("unlogged_before", unlogged))
}

// dropSlot gives back rc's slot, if it holds one, while it waits for
// something other than memcached (the next chunk of a large body).
func (l *limits) dropSlot(rc *requestCtx) {
	if rc != nil && rc.slot {
		l.lim.release()
		rc.slot = false
	}
}

// ownRead makes o's value, if it reads one, the request's own (l is its
// op.Room): held against the budget while its reply is read, dropped
// unread when the budget cannot take it instead of read only to be
// refused by hold, and read into a buffer of l.bufs that putValue gives
// back. For a request that holds nothing else yet, and that answers with
// the value and nothing else keeps it. r's client, if its server offers
// one (Client), goes with o: a pool that would send a large read late
// asks it first.
func (l *limits) ownRead(o *op.Op, r *http.Request) {
	if o.Verb.Reply() == op.Items || o.Verb == op.Head { // a head reads the value from a server without meta commands
		o.Room = l
		if rc := reqCtx(r); rc != nil && rc.client != nil {
			o.Client = rc.client
		}
	}
}

// Reserve holds n bytes of the budget for a value being read (op.Room).
func (l *limits) Reserve(n int) bool { return l.budget.Acquire(int64(n)) == nil }

// hold holds n bytes more until the request ends, as Reserve does, or
// answers errBudget (phpvalue.Hold, for a value decompressed into the
// answer).
func (v *valueRoom) hold(n int) error {
	if !v.Reserve(n) {
		return errBudget
	}
	return nil
}

// Fits reports whether Reserve(n) would hold n bytes now (op.Room).
func (l *limits) Fits(n int) bool { return l.budget.Fits(int64(n)) }

// Holds is what Reserve(n) holds: n bytes (op.Room).
func (l *limits) Holds(n int) int { return n }

// Release gives back what Reserve held (op.Room).
func (l *limits) Release(n int) { l.budget.Release(int64(n)) }

// Lend lends the buffer a value is read into (op.Room).
func (l *limits) Lend(n int) []byte { return l.getBody(n) }

// putValue gives back the value of res if it is in a buffer lent for it
// (ownRead, op.Result.Lent), once the response is written and nothing
// reads it.
func (l *limits) putValue(res *op.Result) {
	if res.Lent {
		l.putBody(res.Item.Value)
		res.Item.Value, res.Lent = nil, false
	}
}

// hold counts n more bytes against the budget for rc's request, until it
// ends; sizes below smallHold are not counted. Without a requestCtx
// nothing would give them back: refused.
func (l *limits) hold(rc *requestCtx, n int) error {
	if rc == nil {
		return errBudget
	}
	if n < smallHold {
		return nil
	}
	if err := l.budget.Acquire(int64(n)); err != nil {
		return err
	}
	rc.held += int64(n)
	return nil
}

// valueRoom holds the values a request reads against the budget until
// it ends (op.Room): each is held before it is read, whatever its size
// (a multi-get's; a single read's from op.LentValue bytes), and one the
// budget cannot take is read off and dropped (upstream.ErrNoFit for its
// key), so that what they read never passes the budget however many such
// requests run. For an answer that copies its values into JSON (a
// multi-get's or batch's), each value is held twice from the start, for
// itself and for its place in the answer: an answer whose values came
// is never refused for its encoding, and encoding many at once cannot
// pass the budget. Its reads may run on several goroutines at once (one
// per node), and one the request stopped waiting for may end after it: a
// Reserve once the request has ended holds nothing and refuses.
type valueRoom struct {
	l      *limits
	per    int64 // bytes held per byte of value: 1, or 2 with a place in a JSON answer
	mu     sync.Mutex
	held   int64
	closed bool
}

// valueRoom returns a room for rc's request's reads, given back when the
// request ends (end); json: the answer copies the values (valueRoom.per).
// Without a requestCtx it refuses every value: nothing would give them
// back.
func (l *limits) valueRoom(rc *requestCtx, json bool) *valueRoom {
	v := &valueRoom{l: l, per: 1}
	if json {
		v.per = 2
	}
	if rc == nil {
		v.closed = true
		return v
	}
	rc.mu.Lock()
	rc.rooms = append(rc.rooms, v)
	rc.mu.Unlock()
	return v
}

// Reserve holds a value of n bytes until the request ends (op.Room).
func (v *valueRoom) Reserve(n int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed || v.l.budget.Acquire(int64(n)*v.per) != nil {
		return false
	}
	v.held += int64(n) * v.per
	return true
}

// Fits reports whether Reserve(n) would hold n bytes now (op.Room).
func (v *valueRoom) Fits(n int) bool { return v.l.budget.Fits(int64(n) * v.per) }

// Holds is what Reserve(n) holds: n bytes per byte held (op.Room).
func (v *valueRoom) Holds(n int) int { return n * int(v.per) }

// answered is what v holds for the values' places in a JSON answer.
func (v *valueRoom) answered() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return int(v.held - v.held/v.per)
}

// Release does nothing: what Reserve held stays held until the request
// ends, as the values are in its answer (op.Room).
func (v *valueRoom) Release(int) {}

// Lend returns a buffer of its own for a value (op.Room): the values of
// a multi-key read go into the answer and are left to the collector.
func (v *valueRoom) Lend(n int) []byte { return make([]byte, n) }

// close gives back what v holds, and makes it refuse from then on.
func (v *valueRoom) close() {
	v.mu.Lock()
	n := v.held
	v.held, v.closed = 0, true
	v.mu.Unlock()
	v.l.budget.Release(n)
}

// end gives back what rc's request held, and stops its timer.
func (l *limits) end(rc *requestCtx) {
	rc.mu.Lock()
	rooms := rc.rooms
	rc.rooms = nil
	rc.mu.Unlock()
	for _, v := range rooms {
		v.close()
	}
	if rc.slot {
		l.lim.release()
		rc.slot = false
	}
	if rc.held > 0 {
		l.budget.Release(rc.held)
		rc.held = 0
	}
	rc.stop()
}

// errBudget answers what the budget refused.
var errBudget = &overloadError{"the gateway holds as many bytes for clients as it may (MEMCGATE_MAX_BUFFERED_BYTES); retry shortly"}

// ReadBody reads r's body, for a handler of Options.Routes, as the REST
// API reads its own (readBody): whole, at most limit bytes, held against
// the byte budget, and then takes the request's in-flight slot. Status
// maps its errors. name is the variable that sets limit, which the 413
// names so that whoever reads it knows what to raise.
func ReadBody(r *http.Request, limit int64, name string) ([]byte, error) {
	rc := reqCtx(r)
	if rc == nil || rc.lim == nil {
		return nil, errors.New("gateway: ReadBody outside a gateway request")
	}
	return rc.lim.readBody(r, limit, name)
}

// GetValue runs o, a read (op.Get, op.GAT, or op.Head, whose value is
// read only from a node without meta commands) on s whose value r's handler
// (one of Options.Routes) answers with, holding the value against the
// byte budget as the REST API holds its GETs': a large value from before
// it is read, every value of 4 KiB or more until the request ends. A
// value the budget cannot take is read off memcached's connection and
// dropped, or dropped once read, and the read fails with
// upstream.ErrNoFit, which Status maps to 503.
func GetValue(r *http.Request, s Doer, o op.Op) op.Result {
	rc := reqCtx(r)
	if rc == nil || rc.lim == nil {
		return op.Result{Err: errors.New("gateway: GetValue outside a gateway request")}
	}
	vr := rc.lim.valueRoom(rc, false)
	o.Room = vr
	res := s.Do(r.Context(), o)
	if res.Err == nil && !vr.holdRead(res) {
		return op.Result{Err: upstream.ErrNoFit}
	}
	return res
}

// HoldAnswer holds n bytes against the byte budget until r's request
// ends, for an answer a handler of Options.Routes builds from bytes it
// read otherwise than by GetValue (the HttpMemc endpoints' stats, every
// node's reply), as hold holds the REST API's; sizes below smallHold
// are not counted. It fails with upstream.ErrNoFit, which Status maps to
// 503, when the budget cannot take them: the caller drops them unsent.
func HoldAnswer(r *http.Request, n int) error {
	rc := reqCtx(r)
	if rc == nil || rc.lim == nil {
		return errors.New("gateway: HoldAnswer outside a gateway request")
	}
	if rc.lim.hold(rc, n) != nil {
		return upstream.ErrNoFit
	}
	return nil
}

// holdRead holds the value of res, a read through v, if its Room did not
// (a small value, or a store that reads without one), and reports whether
// the budget took it. Values under smallHold are not counted, as hold
// does not count them.
func (v *valueRoom) holdRead(res op.Result) bool {
	n := len(res.Item.Value)
	return res.Lent || n < smallHold || v.Reserve(n)
}

// readBody reads r's body whole, at most limit bytes: 413 beyond, naming
// the variable name that sets limit, before reading when Content-Length
// says so. The buffer grows with the bytes
// that arrive, never from the declared length alone, and beyond
// smallHold is held against the budget (503 when refused); once
// firstBodyBuf bytes and an eighth of it have come, the rest of the
// declared length is held and read into one buffer. Then it takes
// the request's slot. A body the server read whole ahead of the handler
// (Options.TakeBody) is taken as it is, neither copied nor counted twice.
// The buffer comes from l.bufs: a caller that knows when nothing reads
// the body any more gives it back with putBody; others leave it to the
// garbage collector.
func (l *limits) readBody(r *http.Request, limit int64, name string) ([]byte, error) {
	rc := reqCtx(r)
	tooLarge := func(n string) error {
		return &requestError{kind: kindTooLarge, msg: "request body is " + n + " bytes; at most " + strconv.FormatInt(limit, 10) + " are accepted (" + name + ")"}
	}
	cl := r.ContentLength
	if cl > limit {
		return nil, tooLarge(strconv.FormatInt(cl, 10))
	}
	if l.takeBody != nil && cl > 0 {
		if buf := l.takeBody(r); buf != nil {
			if int64(len(buf)) != cl { // some of it was read before
				// buf is then the tail of its buffer: not one to lend again.
				return nil, bodyError(io.ErrUnexpectedEOF, len(buf), cl)
			}
			if err := l.hold(rc, cap(buf)); err != nil {
				l.putBody(buf)
				return nil, errBudget
			}
			if err := l.bodyRead(rc); err != nil {
				return nil, err
			}
			return buf, nil
		}
	}
	var buf []byte
	held := 0
	hold := func(n int) error { // held before the buffer is taken, as h1's growAhead does
		if n >= smallHold && n > held {
			if err := l.hold(rc, n-held); err != nil {
				return errBudget
			}
			held = n
		}
		return nil
	}
	grow := func(size int) error {
		if err := hold(size); err != nil {
			return err
		}
		nb := l.getBody(size)
		if err := hold(cap(nb)); err != nil {
			l.putBody(nb)
			return err
		}
		nb = append(nb, buf...)
		l.putBody(buf)
		buf = nb
		return nil
	}
	want := cl
	if want < 0 {
		want = limit + 1 // chunked: read until EOF, or one byte past the limit
	}
	for int64(len(buf)) < want {
		if len(buf) == cap(buf) {
			size := int(min(want, int64(max(2*cap(buf), firstBodyBuf))))
			if cl > 0 && int64(len(buf)) >= max(firstBodyBuf, cl/8) {
				// Its first bytes came: room for all of it at once, or
				// none more read (h1's reserveAfter says why).
				size = int(cl)
			}
			if err := grow(size); err != nil {
				return nil, err
			}
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			l.putBody(buf)
			return nil, bodyError(l.late(r.Context(), err), len(buf), cl)
		}
	}
	switch {
	case cl >= 0 && int64(len(buf)) < cl:
		l.putBody(buf)
		return nil, bodyError(io.ErrUnexpectedEOF, len(buf), cl)
	case cl < 0 && int64(len(buf)) > limit:
		l.putBody(buf)
		return nil, tooLarge("more than " + strconv.FormatInt(limit, 10))
	}
	if err := l.bodyRead(rc); err != nil {
		l.putBody(buf)
		return nil, err
	}
	return buf, nil
}

// firstBodyBuf is the most readBody lends for a body before any of it is
// read, as much as the fast path reads ahead into at first: a body of up
// to that size is read with one read, and one that arrives slowly holds
// no more than it would on the fast path.
const firstBodyBuf = 16 << 10

// getBody returns a buffer for at least n bytes of a body.
func (l *limits) getBody(n int) []byte {
	if l.bufs == nil {
		return make([]byte, 0, n)
	}
	return l.bufs.Get(n)
}

// putBody gives back a body readBody returned, once nothing reads it:
// for a value, when the Store it was given to has returned (a Store
// keeps no Value after that, and memcached answers only once it has
// all of it).
func (l *limits) putBody(b []byte) {
	if l.bufs != nil && b != nil {
		l.bufs.Put(b)
	}
}

// keepBody returns a body readBody returned, for a holder that keeps it
// after its request ends and counts only its length (the asynchronous
// queue): b if its buffer is not much larger than b, else a copy of
// exactly b's length, b's buffer given back. Without it a 1-byte body
// queued in the 16 KiB buffer it was read into held 16,000 times what
// the queue and the budget counted, and a queue full of such writes
// held far more memory than the budget allows (docs/benchmarks.md,
// "Attacks from review").
func (l *limits) keepBody(b []byte) []byte {
	if fits(b) {
		return b
	}
	kept := bytes.Clone(b)
	l.putBody(b)
	return kept
}

// fits reports whether b's buffer is not much larger than b: by an
// eighth of b at most.
func fits(b []byte) bool { return cap(b)-len(b) <= len(b)/8 }

// bodyRead starts the memcached work of rc's request, whose body has
// been read: it takes the request's slot and, however long the body
// took, gives the work all of RequestTimeout.
func (l *limits) bodyRead(rc *requestCtx) error {
	if !l.takeSlot(rc) {
		return errBusy
	}
	if rc != nil {
		rc.restart(l.requestTimeout())
	}
	return nil
}

// late is err, the failure of a read of the body of the request whose
// context is ctx, wrapping the timeout its connection's last read failed
// with, if it did (Options.ReadError), so that bodyError answers it as a
// body late at the read timeout: err itself may have dropped it.
func (l *limits) late(ctx context.Context, err error) error {
	var ne net.Error
	if l.readError == nil || errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	if rerr := l.readError(ctx); errors.As(rerr, &ne) && ne.Timeout() {
		return fmt.Errorf("%w (%w)", err, rerr)
	}
	return err
}

// bodyError is why reading a body failed after n of cl bytes (cl < 0:
// chunked).
func bodyError(err error, n int, cl int64) error {
	var ne net.Error
	switch {
	case errors.Is(err, budget.ErrExhausted):
		return errBudget // the server's read ahead (h1) was refused
	case errors.As(err, &ne) && ne.Timeout():
		return &requestError{kind: kindBodyTooSlow, msg: "request body did not arrive within MEMCGATE_READ_TIMEOUT"}
	case cl >= 0:
		return badRequest("request body ended after " + strconv.Itoa(n) + " of " + strconv.FormatInt(cl, 10) + " bytes")
	}
	return badRequest("reading request body: " + err.Error())
}
