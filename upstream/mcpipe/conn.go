package mcpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// call is one request waiting for its reply. Whoever completes it (the
// reader, or fail) takes it off the queue and sets reply under the
// connection's mutex, then completes it exactly once with the mutex
// released: it signals done, or, for a call of GetAsync or SetAsync, runs
// its callback. After that only the waiter (or the callback) touches it.
type call struct {
	kind  op.Reply          // how the reply reads
	verb  string            // the command, for error messages
	limit int               // a multi-key Get's cap on value bytes kept; 0: none
	all   bool              // room is asked for every value, not only those of op.LentValue bytes or more (a multi-key Get's)
	key   string            // a single-key Get's key: such Gets may share one command
	asked []string          // a multi-key Get's keys (Client.sendGets), in the order sent: the only keys its reply may answer
	probe []string          // a size probe's keys (Client.probe): the reply is readProbe's
	room  op.Room           // op.Op.Room of a read; nil: none
	ahead int               // a large read's size last seen, counted in its Client's ahead until released (Client.admit)
	peer  []*call           // on the first call of a shared gets line: every call on it
	self  [1]*call          // members' answer for a call on its own, without allocating
	one   [1]*memcache.Item // reply.items of a call on a shared line, without allocating: &item
	item  memcache.Item     // the item of a call on a shared line, copied out of the reader's (share)
	reply
	done chan struct{}
	by   time.Time // the caller's deadline, if it has one: progress keeps it waiting no longer (extendLocked)

	// An asynchronous call's callback, and the Client whose pool it goes
	// back to before the callback runs.
	onDone func(*memcache.Item, uint64, error)
	client *Client

	// What send encodes: an operation (o, with skey as its key; a copy,
	// so that the caller's need not escape), or what encode appends.
	o      op.Op
	skey   string
	encode func([]byte) []byte
}

// complete hands the call its outcome: its waiter's signal, or its
// callback. It must be called without any connection's mutex held.
func (cl *call) complete() {
	if cl.client == nil {
		cl.done <- struct{}{}
		return
	}
	c, done := cl.client, cl.onDone
	it, n, err := cl.result()
	// Back to the pool once the callback has returned: it may be given
	// the call's own item (cl.item), which it copies what it keeps
	// from. Its value is no longer on its way, as before the callback.
	c.dropAhead(cl)
	defer c.release(cl)
	// A panic in the callback ends it alone: the reply was read whole,
	// so the stream is where it was, and the calls after it still run.
	defer c.callbackPanics.Recover()
	done(it, n, err)
}

// result is what the call's reply comes to, as Do returns it. Its item
// may be the call's own (cl.item), which its release clears.
func (cl *call) result() (*memcache.Item, uint64, error) {
	switch {
	case cl.err != nil:
		return nil, cl.num, cl.err
	case cl.kind == op.Meta:
		return cl.items[0], cl.num, nil
	case cl.kind != op.Items:
		return nil, cl.num, nil
	}
	switch {
	case len(cl.items) > 0:
		return cl.items[0], 0, nil
	case len(cl.nofit) > 0:
		return nil, 0, ErrNoFit
	}
	return nil, 0, memcache.ErrCacheMiss
}

// big is the size of cl's value if it is a large value (see bigValue),
// else 0.
func (cl *call) big() int {
	if cl.key != "" || cl.encode != nil || !cl.o.Verb.TakesValue() || len(cl.o.Item.Value) < bigValue {
		return 0
	}
	return len(cl.o.Item.Value)
}

// bigValue is the size from which a value is large: it is counted against
// maxQueuedValues, and written from the caller's buffer instead of being
// copied into the write buffer (see segment). Below it a copy costs less
// than the extra iovec and its bookkeeping.
const bigValue = 16 << 10

// maxQueuedValues bounds the bytes of large values queued on a connection
// and not yet written; one value larger than that goes alone. Without it
// 64 clients setting 1 MB each queued 64 MB on a connection ahead of
// every other client's request, and memcached, its reads starved of the
// writer's CPU, took longer than the timeout over a value and the node
// was ejected. 1 MiB keeps memcached busy for about a millisecond, much
// longer than a writer takes to queue the next value.
const maxQueuedValues = 1 << 20

// held is what a reply's read holds of a caller's budget: n bytes of
// value by room.Reserve, for room.Release once the reply is handed out,
// and cost bytes of the server's Share (room.Holds(n); 0: none), for its
// Give then.
type held struct {
	room op.Room
	n    int
	cost int
}

// waiter is a large value waiting for room on a connection.
type waiter struct {
	n     int        // the value's size
	ready chan error // gets nil once room is granted, or the connection's failure
}

// reply is what a request's answer came to.
type reply struct {
	items   []*memcache.Item
	dropped []string // keys whose values were read but not kept (call.limit)
	nofit   []int    // line indexes of the values read but not kept (call.room refused them); 0 for a reply of its own
	refused []string // on a reply of its own, the keys of those values
	sizes   []int    // a size probe's: the size of each probed key's value, index for index; -1: a miss
	num     uint64
	err     error // memcached's refusal, or the connection's failure
	hd      bool  // an mg answered "HD": the server speaks the meta protocol of memcached 1.6.10+ (Client.metaSets)
}

// conn is one pipelined connection. Writes are combined: whoever finds no
// write in progress becomes the writer and sends everything queued,
// including what others queue meanwhile; the rest just queue. One reader
// goroutine per connection reads replies in order and completes the calls.
//
// A large value is not copied into wbuf: segs refers to it where the
// caller has it, and the writer sends wbuf and the values together with
// one writev. The caller's buffer must then stay as it is until the value
// is written. Do waits for the reply, which comes after that, and a
// connection that fails while a write is in progress leaves its calls to
// the writer to complete once the write has returned (orphans), so that
// no caller gets its buffer back while the kernel may still read it.
type conn struct {
	nc      net.Conn
	sio     *sockIO          // reads and writes nc if it is a socket; nil: nc's own methods
	closed  func()           // Options.Closed, called once nc is closed; nil: none
	hints   *SizeHints       // the Client's: what reads found (readReply)
	share   Share            // the Client's Options.Share; nil: none
	panics  *panicguard.Site // stops a panic of readLoop; nil: none
	timeout time.Duration

	mu          sync.Mutex
	wbuf        []byte    // encoded requests not yet written, but for the values in segs
	segs        []segment // the large values of wbuf's requests, in order
	spare       []byte    // the other write buffer, swapped with wbuf per write
	sspare      []segment // the other segment list, swapped with segs per write
	orphans     []*call   // calls of a connection that failed during a write: the writer completes them
	queue       []*call   // sent or about to be sent, in order; replies complete queue[0]
	qfront      []*call   // the array queue starts at when it empties (enqueue); its slots before queue are nil
	writing     bool      // a goroutine is writing wbuf
	open        *call     // the first call of the gets line at the end of wbuf, still open for keys
	unsent      int       // calls at the end of queue not yet handed to a write
	armedAt     time.Time // when the read deadline was last set
	readBy      time.Time // the read deadline; zero: none
	capped      bool      // progress would move readBy but for the oldest caller's deadline (extendLocked)
	graced      bool      // the reply being read got a late reader's grace (overdue)
	outq        int       // bytes the kernel held unacknowledged when last looked at, after a write of a large value or while a write waits for room (drained)
	outqReplies int       // replies still to come for the calls of the write outq was sampled after
	err         error     // set once the connection failed; final

	values  int       // bytes of large values queued and not yet written, or granted room to be
	wvalues int       // of which in wbuf
	waiters []*waiter // large values waiting for room, first come first served

	// The writer's: the pieces of one write, reused; when the write
	// deadline was last set; whether the write waited for room in the
	// socket since its bytes last counted as progress (writeWaits);
	// whether it got a late writer's grace (writeOverdue); whether its
	// deadline is its oldest caller's rather than the timeout's.
	iov      net.Buffers
	wArmedAt time.Time
	wWaited  bool
	wGraced  bool
	wCapped  bool

	lateWrites int // write deadlines passed and moved on (writeOverdue), under mu
	waits      int // times a write waited for room, its look at the kernel's count published (writeWaits), under mu
}

// segment is a large value that is written after wbuf[:at] (and before
// the rest of wbuf, which goes on with the value's "\r\n").
type segment struct {
	at    int
	value []byte
}

func newConn(nc net.Conn, timeout time.Duration) *conn {
	c := &conn{nc: nc, sio: newSockIO(nc), timeout: timeout}
	if c.sio != nil {
		c.sio.wwait, c.sio.wlate = c.writeWaits, c.writeOverdue
	}
	return c
}

func (c *conn) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

// send queues cl's request and returns once it is written or handed to the
// goroutine that is writing. If the connection has already failed it
// returns that failure and cl is untouched; else cl is completed once,
// possibly before send returns (a failed write fails every queued call).
func (c *conn) send(cl *call) error {
	c.mu.Lock()
	locked := true
	defer func() {
		if locked { // only a panic leaves here holding c.mu
			c.encodePanicked()
		}
	}()
	if c.err != nil {
		err := c.err
		locked = false
		c.mu.Unlock()
		return err
	}
	queued := len(c.queue)
	switch {
	case cl.key != "" && c.open != nil && len(c.open.peer) < maxSharedKeys:
		// Another single-key Get while one's line is still unsent: add
		// the key to that line. memcached answers one multi-key gets
		// for all of them, much cheaper than a command each.
		c.wbuf = append(append(c.wbuf, ' '), cl.key...)
		c.open.peer = append(c.open.peer, cl)
	case cl.key != "":
		c.closeLineLocked()
		c.wbuf = append(append(c.wbuf, "gets "...), cl.key...)
		cl.peer = append(cl.peer[:0], cl)
		c.open = cl
		c.enqueue(cl)
	case cl.encode == nil:
		c.closeLineLocked()
		if n := cl.big(); n > 0 {
			c.wvalues += n
			c.wbuf = op.EncodeHead(c.wbuf, &cl.o, cl.skey)
			c.segs = append(c.segs, segment{at: len(c.wbuf), value: cl.o.Item.Value})
			c.wbuf = append(c.wbuf, "\r\n"...)
		} else {
			c.wbuf = op.Encode(c.wbuf, &cl.o, cl.skey)
		}
		cl.o = op.Op{} // encoded, or in segs
		c.enqueue(cl)
	default:
		c.closeLineLocked()
		c.wbuf = cl.encode(c.wbuf)
		cl.encode = nil
		c.enqueue(cl)
	}
	c.unsent += len(c.queue) - queued
	locked = false
	if c.writing {
		c.mu.Unlock()
		return nil
	}
	c.writing = true
	big := c.wvalues > 0
	c.mu.Unlock()
	// Let the other runnable goroutines queue their requests first: under
	// load they are handlers about to call us, and their requests then
	// leave in this write instead of one write (and one wake-up of
	// memcached) each. With nothing else runnable this returns at once.
	// Not with a large value queued: it was just read from its client and
	// is still in the CPU's caches, and after the other handlers have run,
	// each reading a body of its own, it is not, and the kernel's copy of
	// it into the socket costs up to twice as much (docs/benchmarks.md,
	// "A large value written while it is hot"). One write saved per
	// request is little next to that.
	if !big {
		runtime.Gosched()
	}
	c.writeTurn()
	return nil
}

// errEncodePanicked fails a connection whose request panicked while it
// was encoded.
var errEncodePanicked = errors.New("mcpipe: a request panicked while it was encoded (a bug): the connection's unsent bytes may hold part of a command")

// encodePanicked lets go of c.mu, which send held when a request's
// encoding panicked, and fails the connection: its unsent bytes may end
// in part of a command, and with c.mu held for ever every caller and the
// reader would wait on it for ever. The panic goes on to send's caller.
func (c *conn) encodePanicked() {
	c.mu.Unlock()
	c.fail(errEncodePanicked)
}

// enqueue appends cl to the queue. A queue that every reply empties, as
// one request at a time leaves it, starts again at the front of the array
// it used (qfront) rather than in a new one each time: the reader lets
// go of each slot it answers, so the array holds nothing once the queue
// is empty. c.mu must be held.
func (c *conn) enqueue(cl *call) {
	if len(c.queue) == 0 {
		c.queue = c.qfront[:0]
	}
	n := cap(c.queue)
	c.queue = append(c.queue, cl)
	if cap(c.queue) != n { // a new array, with the queue at its front
		c.qfront = c.queue[:0]
	}
}

// maxQueueKept is the largest queue array kept for the queue to start
// again in once it empties: a burst's longer one goes.
const maxQueueKept = 256

// writeTurn writes what is queued, and what is queued meanwhile, until
// nothing is left: the turn of the goroutine that set c.writing. A write
// error fails the connection.
func (c *conn) writeTurn() {
	c.mu.Lock()
	for c.closeLineLocked(); len(c.wbuf) > 0 && c.err == nil; c.closeLineLocked() {
		c.owedLocked(time.Now())
		buf, segs, values := c.wbuf, c.segs, c.wvalues
		c.wbuf, c.segs, c.wvalues = c.spare[:0], c.sspare[:0], 0
		c.mu.Unlock()
		err := c.writeAll(buf, segs)
		c.mu.Lock()
		if values > 0 {
			c.values -= values
			c.grantLocked()
		}
		if cap(buf) <= 64<<10 { // do not keep a buffer grown by a large value
			c.spare = buf[:0]
		} else {
			c.spare = nil
		}
		clear(segs) // written: let the values go
		if cap(segs) <= 64 {
			c.sspare = segs[:0]
		} else {
			c.sspare = nil
		}
		if err != nil {
			// Fail the connection while still its writer: a send that
			// found no writer between the two would become one and write
			// (under a new deadline) after the bytes this write left cut
			// short, which memcached would read as the rest of a value
			// and then as commands. fail leaves the calls to us.
			c.mu.Unlock()
			c.fail(err)
			c.mu.Lock()
			c.stopWritingLocked()
			return
		}
	}
	c.stopWritingLocked()
}

// stopWritingLocked ends the writer's turn, unlocks, and completes the
// calls a failure left to it (orphans): their values are no longer being
// written.
func (c *conn) stopWritingLocked() {
	c.writing = false
	orphans := c.orphans
	c.orphans = nil
	c.mu.Unlock()
	for _, cl := range orphans {
		signal(cl.members())
	}
}

// ErrNoRoom is the error of a large value that found no room on its
// connection (maxQueuedValues): DoAsync's at once, Do's wrapped with its
// context's error once that ends the wait.
var ErrNoRoom = errors.New("mcpipe: no room on the connection for the value")

// reserve waits until the connection has room for a large value of n
// bytes and takes it: the caller then sends the value, or the room stays
// taken until the connection fails. Values get room in the order they
// ask. It returns the connection's failure, or ErrNoRoom wrapping ctx's
// error if ctx ends first.
func (c *conn) reserve(ctx context.Context, n int) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	if len(c.waiters) == 0 && c.roomLocked(n) {
		c.values += n
		c.mu.Unlock()
		return nil
	}
	w := &waiter{n: n, ready: make(chan error, 1)}
	c.waiters = append(c.waiters, w)
	c.mu.Unlock()
	select {
	case err := <-w.ready:
		return err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if i := slices.Index(c.waiters, w); i >= 0 {
		c.waiters = slices.Delete(c.waiters, i, i+1)
		c.grantLocked() // the values behind it may fit
		c.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrNoRoom, ctx.Err())
	}
	c.mu.Unlock()
	// Answered meanwhile: give back room granted, as the caller gives up.
	if err := <-w.ready; err != nil {
		return err
	}
	c.mu.Lock()
	c.values -= n
	c.grantLocked()
	c.mu.Unlock()
	return fmt.Errorf("%w: %w", ErrNoRoom, ctx.Err())
}

// tryReserve is reserve without waiting: it takes room for n bytes and
// reports true only if there is room now and nobody waits for it.
func (c *conn) tryReserve(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || len(c.waiters) > 0 || !c.roomLocked(n) {
		return false
	}
	c.values += n
	return true
}

// roomLocked reports whether a large value of n bytes may be queued now.
func (c *conn) roomLocked(n int) bool {
	return c.values == 0 || c.values+n <= maxQueuedValues
}

// grantLocked gives room to the waiting values that fit, in order.
func (c *conn) grantLocked() {
	for len(c.waiters) > 0 && c.roomLocked(c.waiters[0].n) {
		w := c.waiters[0]
		c.waiters[0] = nil
		c.waiters = c.waiters[1:]
		c.values += w.n
		w.ready <- nil
	}
	if len(c.waiters) == 0 {
		c.waiters = nil
	}
}

// writeSlice is the most written under one write deadline by a
// connection that is not a socket (sockIO moves its deadlines itself).
const writeSlice = 256 << 10

// writeAll writes buf with the values of segs in their places. The
// timeout bounds how long memcached may take no bytes at all, not how
// long it takes to read everything queued: bytes moved are progress
// (moved), which puts off both the write's deadline and the reply owed to
// the requests written. One 1 MB value over a slow link, or many large
// values queued at once, take memcached longer than one timeout to read
// while it makes steady progress; under a deadline from the write's
// start the set failed with an i/o timeout, as did every operation on
// the connection, and the node was ejected.
//
// A socket (sockIO) tells the writer when a write must wait for room
// (writeWaits), so everything goes in one writev, with a wait only where
// the socket is full: a write that never waits, as small requests do,
// sets one deadline and looks at the clock once, and a 1 MB value is one
// system call and one wake-up of memcached, not one per slice. Any other
// connection's Write waits inside, so it writes slices of at most
// writeSlice bytes: a slice that took more than an eighth of the timeout
// counts as progress once it is written.
//
// A socket's write deadline that passes while the write waits is not
// memcached's stall if bytes left the kernel's send queue since the
// write last looked, or if the writer came to it late (writeOverdue):
// the write goes on.
func (c *conn) writeAll(buf []byte, segs []segment) error {
	c.wWaited, c.wGraced = false, false
	c.armWrite(time.Now())
	// The pieces in order: buf cut where each value goes, in c.iov,
	// whose array the next write reuses.
	pieces := c.iov[:0]
	at := 0
	for _, s := range segs {
		pieces = append(pieces, buf[at:s.at], s.value)
		at = s.at
	}
	if at < len(buf) {
		pieces = append(pieces, buf[at:])
	}
	var err error
	if c.sio != nil {
		c.iov = pieces
		_, err = c.sio.writev(&c.iov) // consumes c.iov
	} else {
		err = c.writeSlices(pieces)
	}
	clear(pieces) // keep no value alive
	c.iov = pieces[:0]
	if err != nil {
		if c.wCapped && errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", ErrBehind, err)
		}
		return err
	}
	if c.sio == nil {
		return nil
	}
	c.wrote()
	if len(segs) > 0 {
		// The kernel may hold all of a value the write took (up to
		// tcp_wmem's maximum, 4 MiB): drained sees those bytes move.
		// (Not after a write of small requests only: sampled then, a
		// large value's bytes still held would count as progress for
		// requests written after it.)
		c.mu.Lock()
		c.outq, c.outqReplies = c.sio.unsent(), len(c.queue)-c.unsent
		c.mu.Unlock()
	}
	return nil
}

// writeSlices writes pieces in slices of at most writeSlice bytes, one
// Write each, for a connection whose Write waits inside (not a socket).
func (c *conn) writeSlices(pieces net.Buffers) error {
	var out net.Buffers
	for len(pieces) > 0 {
		// The next writeSlice bytes: whole pieces, and a part of the
		// piece they end in.
		out = out[:0]
		n := 0
		for len(pieces) > 0 && n < writeSlice {
			p := pieces[0]
			k := min(len(p), writeSlice-n)
			out = append(out, p[:k])
			n += k
			if k == len(p) {
				pieces = pieces[1:]
			} else {
				pieces[0] = p[k:]
			}
		}
		w := out
		_, err := w.WriteTo(c.nc) // consumes w
		clear(out)
		if err != nil {
			return err
		}
		c.wrote()
	}
	return nil
}

// drained is called when a reply's deadline passes: if bytes of a large
// value the kernel held at the end of its write (or at the last look)
// have left since, memcached is still reading what it was sent, and the
// deadline moves on as for any progress (extendLocked). It reports
// whether the reply is owed later than now. A value the socket's send
// buffer took whole ends its write long before memcached has read it: on
// a link slower than the buffer's size per timeout, its reply was owed
// before memcached could read it all. Over TCP the kernel counts bytes
// memcached's kernel acknowledged, not bytes memcached read (over a Unix
// socket, those it read): a memcached that hangs with room in its
// receive buffer looks busy until that is full, and its callers'
// deadlines (extendLocked) bound the wait. Once the calls of the write
// are answered, memcached has read it all, and the count is dropped.
func (c *conn) drained(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readBy.After(now) {
		return true // moved meanwhile, by a write's progress
	}
	if c.err != nil || c.outq <= 0 || len(c.queue) == c.unsent {
		return false
	}
	q := c.sio.unsent()
	if q < 0 || q >= c.outq {
		return false // nothing moved: a stall
	}
	c.outq = q
	c.extendLocked(now)
	return c.readBy.After(now)
}

// wrote is called by the writer once a slice is written: if it waited
// for room on the way, its last bytes are progress.
func (c *conn) wrote() {
	switch {
	case c.sio == nil:
		if now := time.Now(); now.Sub(c.wArmedAt) > c.timeout/8 {
			c.moved(now)
		}
	case c.wWaited:
		c.wWaited = false
		c.moved(time.Now())
	}
}

// writeWaits is sockIO's wwait: the write must wait for room in the
// socket, moved says whether bytes moved since it last waited (or since
// writev began), and held how many bytes the kernel holds unacknowledged
// (-1: not known). Bytes moved are progress; none moved is a stall,
// which leaves the deadlines where they are. held is the reader's last
// look too (drained): a reply owed while the write waits is owed from
// the last bytes that left the kernel's send queue, since the writer,
// which the kernel wakes only once a third of the buffer is free, does
// not see memcached read less than that.
func (c *conn) writeWaits(moved bool, held int) {
	c.wWaited = true // what the wait lets through is progress too (wrote)
	if moved {
		c.moved(time.Now())
	}
	c.mu.Lock()
	if held >= 0 && c.err == nil {
		c.outq, c.outqReplies = held, len(c.queue)-c.unsent
	}
	c.waits++
	c.mu.Unlock()
}

// writeOverdue is sockIO's wlate: the write deadline passed while the
// write waited for room in the socket. It reports whether the write goes
// on, its deadline moved to the timeout from now, because the deadline
// is not memcached's stall:
//
//   - bytes left the kernel's send queue since the write last looked
//     (drained; held is what the queue holds now): memcached is reading,
//     and the deadline moves as for any progress, each time bytes moved,
//     the reply owed with it (extendLocked). The kernel wakes a writer
//     only once a third of its send buffer (up to tcp_wmem's maximum,
//     4 MiB) is free: a memcached reading less than that per timeout
//     made no progress the writer saw.
//   - the writer came to it late, by a quarter of the timeout or more, as
//     the reader's overdue measures: the gateway, not memcached, was not
//     running (a process stopped or starved of CPU, a container
//     throttled), and memcached had less time than it was given. Once
//     per write.
//
// Neither moves the deadline past the oldest unanswered caller's own; a
// write that fails there fails with ErrBehind, as a reply does
// (extendLocked). Without it a gateway paused longer than the timeout
// while a large value waited for room failed the write on waking, and
// every call on the connection with it, though memcached had read all
// the kernel held meanwhile.
func (c *conn) writeOverdue(drained bool, held int) bool {
	now := time.Now()
	late := !c.wGraced && now.Sub(c.wArmedAt) >= c.timeout+c.timeout/4
	if !drained && !late {
		return false // a stall
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	dl, capped := now.Add(c.timeout), false
	if len(c.queue) > 0 {
		if by := c.queue[0].by; !by.IsZero() && by.Before(dl) {
			dl, capped = by, true
		}
	}
	c.wCapped = capped
	if !dl.After(now) {
		return false
	}
	if !drained {
		c.wGraced = true
	}
	c.lateWrites++
	c.wArmedAt = now
	_ = c.nc.SetWriteDeadline(dl)
	if drained {
		if held >= 0 {
			c.outq, c.outqReplies = held, len(c.queue)-c.unsent
		}
		if len(c.queue) > c.unsent {
			c.extendLocked(now)
		}
	}
	return true
}

// moved counts bytes that a write moved at now as memcached's progress:
// the write's next bytes, and the next reply to the requests written,
// are owed within the timeout from now. As for replies (readLoop), a
// deadline set less than an eighth of the timeout ago stays, to spare
// timer updates.
func (c *conn) moved(now time.Time) {
	if now.Sub(c.wArmedAt) > c.timeout/8 {
		c.armWrite(now)
	}
	c.progress(now)
}

// armWrite owes the write's next bytes within the timeout from now.
func (c *conn) armWrite(now time.Time) {
	c.wArmedAt, c.wCapped = now, false
	_ = c.nc.SetWriteDeadline(now.Add(c.timeout))
}

// owedLocked marks every queued call as written by a write that starts
// now and, if no earlier written request is still unanswered, owes a
// reply within the timeout from now. The read deadline runs only while a
// written request waits for its reply: from the write, not from the
// queuing (between the two the writer may wait long for the CPU, with
// many handlers runnable and memcached on the same CPU, while memcached,
// with nothing to answer, is not late: decisions/0010, "A reply is owed
// from its write"), and later writes do not move it (a stopped
// memcached, sent a steady trickle of requests, must still time out on
// the first).
func (c *conn) owedLocked(now time.Time) {
	if len(c.queue) == c.unsent {
		c.armReadLocked(now)
	}
	c.unsent = 0
}

// armReadLocked owes the next reply within the timeout from now.
func (c *conn) armReadLocked(now time.Time) {
	c.armedAt, c.readBy, c.capped = now, now.Add(c.timeout), false
	_ = c.nc.SetReadDeadline(c.readBy)
}

// extendLocked owes the next reply within the timeout from now, for
// bytes of a request or a reply that moved (progress), but not past the
// deadline of the oldest unanswered call's caller, and never sooner than
// it was owed. Progress may keep a slow value going for longer than the
// timeout; it must not keep a caller waiting past its own deadline, as
// the calls queued behind a slow value would otherwise wait for it
// (MEMCGATE_REQUEST_TIMEOUT bounds a request's memcached work). The
// connection fails there, as at any other deadline: replies come in
// order, so none of the calls behind the oldest could be answered
// sooner.
func (c *conn) extendLocked(now time.Time) {
	dl, capped := now.Add(c.timeout), false
	if by := c.queue[0].by; !by.IsZero() && by.Before(dl) {
		dl, capped = by, true
	}
	c.armedAt = now
	switch {
	case dl.After(c.readBy):
		c.readBy, c.capped = dl, capped
		_ = c.nc.SetReadDeadline(dl)
	case capped: // the progress would have moved a deadline the cap holds
		c.capped = true
	}
}

// maxSharedKeys bounds the keys on one shared gets line (about 25 KiB of
// command line with long keys; memcached reads longer get lines too).
const maxSharedKeys = 100

// closeLineLocked ends the open shared gets line, if any.
func (c *conn) closeLineLocked() {
	if c.open != nil {
		c.wbuf = append(c.wbuf, "\r\n"...)
		c.open = nil
	}
}

// fail closes the connection once and fails every queued call with err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	q := c.queue
	c.queue, c.qfront = nil, nil
	c.wbuf = nil
	c.segs = nil
	c.open = nil
	c.unsent = 0
	for _, w := range c.waiters {
		w.ready <- err
	}
	c.waiters = nil
	for _, cl := range q {
		for _, p := range cl.members() {
			p.reply = reply{err: err}
		}
	}
	if c.writing {
		// The write in progress may still read the values of these
		// calls: the writer completes them once it has returned, which
		// closing nc makes prompt.
		c.orphans = append(c.orphans, q...)
		q = nil
	}
	c.mu.Unlock()
	_ = c.nc.Close()
	if c.closed != nil {
		c.closed()
	}
	// Off the queue, the calls are ours alone: complete them unlocked,
	// since a callback may take other locks or send elsewhere.
	for _, cl := range q {
		signal(cl.members())
	}
}

// forgetMissed drops the size hints of the keys that calls with a Room
// found missing (readReply records the others').
func (c *conn) forgetMissed(calls []*call) {
	if c.hints == nil {
		return
	}
	for _, p := range calls {
		if p.room != nil && !p.all && p.kind == op.Items && p.reply.err == nil && len(p.reply.items) == 0 && len(p.reply.nofit) == 0 {
			key := p.key
			if key == "" {
				key = p.skey // a GAT's
			}
			c.hints.Forget(key)
		}
	}
}

// errProtocol is a reply that does not fit the protocol: the connection's
// position in the reply stream is lost.
var errProtocol = errors.New("mcpipe: malformed reply from memcached")

// errReaderPanicked fails the calls of a connection whose reply reader
// panicked (a bug): where the reply stream stands is not known.
var errReaderPanicked = errors.New("mcpipe: the reply reader panicked (a bug): the connection's place in the reply stream is unknown")

// readLoop reads replies until the connection fails.
func (c *conn) readLoop() {
	br := bufio.NewReaderSize(&progressReader{c: c}, 16<<10)
	var keys []string    // the keys of the reply's shared gets line, reused
	var asked []string   // the keys of a reply of its own, reused
	var rooms []op.Room  // their calls' rooms, or the call's own; reused
	var holds []held     // what the reply being read holds; reused
	var lined linedItems // a shared line's items, handed out by share; reused
	release := func() {
		for _, h := range holds {
			h.room.Release(h.n)
			if h.cost > 0 {
				c.share.Give(h.cost)
			}
		}
		clear(holds)
		holds = holds[:0]
	}
	// A panic here leaves the connection's place in the reply stream
	// unknown: once stopped, the reply's holds go back and then the
	// connection fails, which answers every call on it. (Both do nothing
	// after an end of the loop without one.)
	defer c.fail(errReaderPanicked)
	defer release()
	defer c.panics.Recover()
	for {
		// Wait for the first byte of the next reply. With no written
		// request unanswered there is no deadline: an idle connection
		// waits indefinitely.
		if _, err := br.Peek(1); err != nil {
			c.fail(c.behind(err))
			return
		}
		c.mu.Lock()
		if len(c.queue) == c.unsent {
			// Nothing written waits for a reply (a gets line still open
			// may even get more keys: completing its call now would hand
			// those callers a call already back in the pool).
			c.mu.Unlock()
			c.fail(fmt.Errorf("%w: a reply nobody asked for", errProtocol))
			return
		}
		// The keys of a shared line, copied while the calls are surely
		// queued: fail may answer and free them while the reply is read.
		k, verb, probe := c.queue[0].kind, c.queue[0].verb, c.queue[0].probe
		lim := replyLimit{bytes: c.queue[0].limit, all: c.queue[0].all, share: c.share}
		keys, rooms, asked = keys[:0], rooms[:0], asked[:0]
		for _, p := range c.queue[0].peer {
			keys, rooms = append(keys, p.key), append(rooms, p.room)
		}
		if len(c.queue[0].peer) == 0 {
			rooms = append(rooms, c.queue[0].room)
			switch {
			case c.queue[0].asked != nil:
				asked = append(asked, c.queue[0].asked...)
			case k == op.Items:
				asked = append(asked, c.queue[0].skey) // a GAT's
			}
		}
		c.mu.Unlock()
		var r reply
		var err error
		if probe != nil {
			r, err = readProbe(br, probe)
		} else {
			r, err = readReply(br, k, verb, keys, asked, lim, rooms, &holds, c.hints, &lined)
		}
		clear(rooms) // let the callers go
		clear(asked)
		if err != nil {
			release()
			c.fail(c.behind(err))
			return
		}
		c.mu.Lock()
		if c.err != nil { // failed meanwhile (a write error): every call is answered
			c.mu.Unlock()
			release()
			return
		}
		cl := c.queue[0]
		members := cl.members()
		if len(cl.peer) > 0 {
			share(members, r)
			// Each call holds a copy of its item in its own: the
			// line's arrays are free again.
			lined.keep(r.items)
		} else {
			cl.reply = r
		}
		c.forgetMissed(members)
		c.queue[0] = nil
		c.queue = c.queue[1:]
		if len(c.queue) == 0 {
			c.queue = nil // enqueue starts at qfront again
			if cap(c.qfront) > maxQueueKept {
				c.qfront = nil
			}
		}
		if c.outqReplies > 0 {
			if c.outqReplies--; c.outqReplies == 0 {
				c.outq = 0 // memcached has read all the write outq was sampled after
			}
		}
		if len(c.queue) == c.unsent {
			// No written request waits: no reply is owed until the
			// next write (owedLocked).
			c.readBy, c.capped, c.outq, c.outqReplies = time.Time{}, false, 0, 0
			_ = c.nc.SetReadDeadline(time.Time{})
		} else if now := time.Now(); c.readBy.Sub(now) < c.timeout-c.timeout/8 {
			// Extend the deadline from this reply, but not for every
			// reply (a timer update each): the next reply is then owed
			// within 7/8 to 8/8 of the timeout. A deadline that
			// progress stopped at the answered caller's (extendLocked)
			// is always moved: it is not the next caller's.
			c.armReadLocked(now)
		}
		c.capped = false // the cap was the answered caller's; what is left of it is a whole stall's time
		c.graced = false
		c.mu.Unlock()
		// The callers hold what they keep from here, so the reply's
		// hold goes first: held both ways, a value would be refused by
		// its own hold.
		release()
		signal(members) // off the queue: ours alone
	}
}

// behind is err, the failure of a reply's read, as the callers get it: a
// deadline that progress had stopped at the oldest caller's (extendLocked)
// is ErrBehind, not a stall of memcached.
func (c *conn) behind(err error) error {
	c.mu.Lock()
	capped := c.capped
	c.mu.Unlock()
	if capped && errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w (%w)", ErrBehind, err)
	}
	return err
}

// progressReader reads a connection's replies and, as a long reply
// arrives, moves the deadline it is owed by, as readLoop does after each
// reply: the timeout bounds a stall of memcached, not the size of what it
// sends. A gets line of a hundred 1 MB values is one reply of 100 MB;
// owed whole within the timeout, it ejected a memcached that was sending
// all along (256 clients GETting 1 MB values, the gateway sharing a CPU
// with memcached).
type progressReader struct {
	c    *conn
	read int // bytes read since the deadline was last looked at
}

// progressBytes is how many bytes of a reply make progress enough to
// look at its deadline again.
const progressBytes = 256 << 10

func (r *progressReader) Read(p []byte) (int, error) {
	var n int
	var err error
	for {
		if r.c.sio == nil {
			n, err = r.c.nc.Read(p)
		} else {
			n, err = r.c.sio.read(p)
		}
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		// The deadline passed. Unless the reply is there after all, or
		// memcached is still reading what it was sent, or the reader
		// came too late to say, memcached stalled.
		if r.c.sio != nil {
			if m, merr := r.c.sio.readNow(p); m > 0 || merr != nil {
				n, err = m, merr
				break
			}
		}
		now := time.Now()
		if !(r.c.sio != nil && r.c.drained(now)) && !r.c.overdue(now) {
			break
		}
	}
	if r.read += n; r.read >= progressBytes {
		r.read = 0
		r.c.progress(time.Now())
	}
	return n, err
}

// overdue reports whether the read deadline the reader just saw pass is
// worth another wait: the reader came to it late, by a quarter of the
// timeout or more, so the gateway, not memcached, was not running (a
// process stopped or starved of CPU, a container throttled, a long
// pause), and memcached had less time than it was given. The reply is
// then owed within the timeout from now (extendLocked: never past the
// oldest caller's own deadline), once per reply. Without it, a gateway
// paused for 0.8 s failed every call of a connection with a timeout on
// waking, which ejected a healthy node (its reads then went to the next
// node, and came back older after the node's return).
func (c *conn) overdue(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.graced || len(c.queue) == c.unsent || c.readBy.IsZero() || now.Sub(c.readBy) < c.timeout/4 {
		return false
	}
	c.graced = true
	c.extendLocked(now)
	return c.readBy.After(now)
}

// progress moves the deadline of the reply being read to the timeout from
// now (extendLocked), if it was set more than an eighth of the timeout
// ago and a written request is unanswered.
func (c *conn) progress(now time.Time) {
	c.mu.Lock()
	if c.err == nil && len(c.queue) > c.unsent && now.Sub(c.armedAt) > c.timeout/8 {
		c.extendLocked(now)
	}
	c.mu.Unlock()
}

// members are the calls a queued call answers for: the calls on its
// shared gets line, or itself.
func (cl *call) members() []*call {
	if len(cl.peer) > 0 {
		return cl.peer
	}
	cl.self[0] = cl
	return cl.self[:]
}

// signal completes calls, the first (which owns the slice) last: once it
// is signalled its waiter may recycle it, slice included. The rest go in
// the order they were sent. That order is the order their goroutines run
// in: the runtime runs the goroutine woken last first and the others in
// the order they were woken, so the calls run first to last, oldest
// first. (In reverse, the oldest of a shared gets line of dozens of
// calls waited for all the others' responses to be written.)
func signal(calls []*call) {
	for _, cl := range calls[1:] {
		cl.complete()
	}
	calls[0].complete()
}

// linedItems is where a reader puts a shared gets line's items (readReply),
// reused from line to line: share copies each into its call (call.item)
// before the next line is read.
type linedItems struct {
	items []*memcache.Item // the line's items, each pointing into vals
	vals  []memcache.Item
}

// keep makes items, a shared line's items that share has copied out, the
// arrays of the next line, if they are not too large, with nothing of
// this line's left in them (no value kept from the collector).
func (l *linedItems) keep(items []*memcache.Item) {
	if items == nil {
		// No value on the line (misses alone, or an error line):
		// readReply took nothing of l, whose arrays are still clear
		// and stay the next line's.
		return
	}
	clear(l.vals[:min(len(items), len(l.vals))])
	clear(items)
	if cap(items) > maxSharedKeys {
		return
	}
	l.items = items[:0]
	if len(l.vals) < cap(items) {
		l.vals = make([]memcache.Item, cap(items))
	}
}

// share hands each call on a shared gets line its own part of the reply:
// the item memcached sent for its place on the line, or none (a miss).
// memcached answers a key named twice twice, so no two calls share an
// item: a value lent by a call's caller (op.Op.Lend) is that caller's
// alone. The items are in line order, each at the first place not yet
// answered with its key (keyCursor), so they are handed out by one walk
// down the line.
func share(calls []*call, r reply) {
	next := 0 // the first item not handed out
	for j, p := range calls {
		p.reply = reply{err: r.err}
		switch {
		case r.err != nil:
		case slices.Contains(r.nofit, j):
			p.reply.err = ErrNoFit
		case next < len(r.items) && r.items[next].Key == p.key:
			p.item = *r.items[next]
			p.one[0] = &p.item
			p.reply.items = p.one[:]
			next++
		}
	}
}

var (
	crlf            = []byte("\r\n")
	lineEnd         = []byte("END\r\n")
	lineStored      = []byte("STORED\r\n")
	lineNotStored   = []byte("NOT_STORED\r\n")
	lineExists      = []byte("EXISTS\r\n")
	lineNotFound    = []byte("NOT_FOUND\r\n")
	lineDeleted     = []byte("DELETED\r\n")
	lineTouched     = []byte("TOUCHED\r\n")
	lineOK          = []byte("OK\r\n")
	prefixValue     = []byte("VALUE ")
	prefixClientErr = []byte("CLIENT_ERROR ")
	lineHD          = []byte("HD\r\n")
	prefixHD        = []byte("HD ")
	prefixOK        = []byte("OK ")
	lineEN          = []byte("EN\r\n")
	lineNS          = []byte("NS\r\n")
	lineEX          = []byte("EX\r\n")
	lineNF          = []byte("NF\r\n")
	lineError       = []byte("ERROR\r\n")
	lineMN          = []byte("MN\r\n")
)

// maxShown is the most of a server's line that an error quotes: a line
// may be up to the reader's 16 KiB of anything, and the error goes to log
// lines and the status page (a node's reason for being down).
const maxShown = 128

// shown is b, a server's line or part of one, quoted for an error, cut
// to maxShown bytes and its length said if longer.
func shown(b []byte) string {
	if len(b) <= maxShown {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:maxShown])) + "... (" + strconv.Itoa(len(b)) + " bytes)"
}

// isErrorLine reports the protocol's generic error replies, which end a
// reply of any kind.
func isErrorLine(line []byte) bool {
	return bytes.Equal(line, lineError) || bytes.HasPrefix(line, []byte("CLIENT_ERROR ")) ||
		bytes.HasPrefix(line, []byte("SERVER_ERROR "))
}

// replyLimit is what a get reply may keep: at most bytes of values (0:
// no limit), whether its rooms are asked for every value (all) or only
// for those of op.LentValue bytes or more, and within what share of the
// rooms' budgets the server's replies may hold (nil: no share).
type replyLimit struct {
	bytes int
	all   bool
	share Share
}

// readReply reads one whole reply to a request of kind k. Memcached's
// refusals are in the reply, as gomemcache reports them; the error is set
// only when the stream itself is broken. lineKeys are the keys of a
// shared gets line (none for other requests): they become the items' keys.
// A get reply keeps at most lim.bytes of values (0: no limit); the keys
// of the values it drops are in r.dropped. rooms are the op.Op.Room of
// the line's keys, index for index (of the reply's one call when
// lineKeys is empty; nil: none): a value of op.LentValue bytes or more
// (any value, with lim.all) that its room does not Reserve, or that
// lim.share does not Take (reserve), is dropped too, its index in
// r.nofit (and its key in r.refused on a reply of its own), and one it
// reserves is read into a buffer it lends, the reservation (and what the
// share took) added to holds for the caller to release once the reply is
// handed out, whatever the outcome. None of a reply's values reaches its caller
// before the whole reply is read: without the reservations a shared line
// of a hundred 1 MB values would keep 100 MB that no budget saw.
// asked are the keys of a reply of its own (a GAT's, a multi-key Get's),
// in the order sent (nil: any key, for tests of the rest). memcached
// answers the keys asked in order, misses left out: a value for a key
// that was not asked, or out of that order (one asked once and answered
// twice), is a broken stream (errProtocol), whose connection fails, so
// that no caller is handed a value that is not its key's. The size of a
// value asked of a room goes to hints (nil: nowhere). A shared line's
// items are put in lined if it has room for them (the reader's arrays,
// free once share copied them out), else each in memory of its own.
func readReply(br *bufio.Reader, k op.Reply, verb string, lineKeys, asked []string, lim replyLimit, rooms []op.Room, holds *[]held, hints *SizeHints, lined *linedItems) (r reply, err error) {
	keys := keyCursor{keys: lineKeys}
	if len(lineKeys) == 0 {
		keys = keyCursor{keys: asked, own: true}
	}
	kept := 0
	var vals []memcache.Item // where the items are, if in lined
	for {
		line, err := readLine(br)
		if err != nil {
			return r, err
		}
		switch k {
		case op.Items:
		case op.Meta:
			var it *memcache.Item
			it, r.num, r.err = metaResult(line)
			if it != nil {
				r.items = append(r.items, it)
				r.hd = bytes.HasPrefix(line, prefixHD)
			}
			if r.err != nil && !errors.Is(r.err, memcache.ErrCacheMiss) && !metaHit(line) && !isErrorLine(line) {
				return r, fmt.Errorf("%w: %s to %s", errProtocol, shown(line), verb)
			}
			return r, nil
		case op.MetaStored:
			if bytes.Equal(line, lineError) {
				// A server that knows no ms reads its data block as a
				// command of its own, whose reply is still to come:
				// the connection is out of step.
				return r, fmt.Errorf("%w: %s to %s", errProtocol, shown(line), verb)
			}
			r.num, r.err = lineResult(k, verb, line)
			return r, outOfStep(k, verb, line, r.err)
		default:
			r.num, r.err = lineResult(k, verb, line)
			return r, outOfStep(k, verb, line, r.err)
		}
		switch {
		case bytes.Equal(line, lineEnd):
			return r, nil
		case bytes.HasPrefix(line, prefixValue):
			it, i, size, err := parseValueLine(line, &keys)
			if err != nil {
				return r, err
			}
			if i < 0 {
				return r, fmt.Errorf("%w: %s answers a key %s did not ask for, or out of order", errProtocol, shown(line), verb)
			}
			if lim.bytes > 0 && kept+size > lim.bytes {
				// Before the Room is asked: a value it reserved and
				// the limit then dropped would be held for good.
				if err := skipValue(br, size); err != nil {
					return r, err
				}
				r.dropped = append(r.dropped, it.Key)
				continue
			}
			var rm op.Room
			if i < len(rooms) && rooms[i] != nil {
				if hints != nil {
					hints.Saw(it.Key, size)
				}
				if size >= op.LentValue || lim.all && size > 0 {
					rm = rooms[i]
				}
			}
			cost := 0
			if rm != nil && lim.share != nil {
				cost = rm.Holds(size)
			}
			if rm != nil && !reserve(rm, lim.share, size, cost) {
				if err := skipValue(br, size); err != nil {
					return r, err
				}
				r.nofit = append(r.nofit, i)
				if len(lineKeys) == 0 {
					r.refused = append(r.refused, it.Key)
				}
				continue
			}
			kept += size
			var lend func(int) []byte
			if rm != nil {
				*holds = append(*holds, held{rm, size, cost})
				if size >= op.LentValue {
					lend = rm.Lend
				}
			}
			if it.Value, err = readValue(br, size, lend); err != nil {
				return r, err
			}
			if r.items == nil && len(keys.keys) > 0 {
				if !keys.own && lined != nil && cap(lined.items) >= len(keys.keys) && len(lined.vals) >= len(keys.keys) {
					r.items, vals = lined.items[:0], lined.vals[:len(keys.keys)]
				} else {
					r.items = make([]*memcache.Item, 0, len(keys.keys))
				}
			}
			// A line's keys are answered once each, in order
			// (keyCursor): its items are at most its keys.
			var p *memcache.Item
			if vals != nil {
				p = &vals[len(r.items)]
			} else {
				p = new(memcache.Item)
			}
			*p = it
			r.items = append(r.items, p)
		case isErrorLine(line):
			r.err = fmt.Errorf("memcache: unexpected line in get response: %s", shown(line))
			return r, nil
		default:
			return r, fmt.Errorf("%w: %s in a get reply", errProtocol, shown(line))
		}
	}
}

// reserve holds a value of size bytes in rm (op.Room.Reserve), once its
// server's share (nil: none) has taken the cost bytes that holds of the
// budget: a value past the share is refused as one the Room refused, the
// Room not asked (none of its budget taken, no refusal of its counted).
func reserve(rm op.Room, sh Share, size, cost int) (ok bool) {
	if sh == nil {
		return rm.Reserve(size)
	}
	if !sh.Take(cost) {
		return false
	}
	defer func() { // also when Reserve panics: the share is not the reply's hold yet
		if !ok {
			sh.Give(cost)
		}
	}()
	return rm.Reserve(size)
}

// outOfStep is errProtocol if line, the reply to a one-line request of
// kind k whose result is err, says the connection is out of step: a line
// that is neither an answer the command can get nor an error line (the
// reply of another command, or no reply at all), or a CLIENT_ERROR to a
// storage command. The client sends only well-formed commands and data
// blocks of the length they declare, so memcached refusing one means the
// bytes changed on the way; and memcached, when it cannot tell a storage
// command's length, reads its data block as a command of its own, whose
// reply ("ERROR") the next request would take for its own, and each
// request after it the reply of the one before: an incr the number of
// another key's counter. Else nil: the reply was the request's, even
// when it is a refusal.
func outOfStep(k op.Reply, verb string, line []byte, err error) error {
	switch {
	case err == nil, errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrCacheMiss):
		return nil
	case !isErrorLine(line):
		return fmt.Errorf("%w: %s to %s", errProtocol, shown(line), verb)
	case (k == op.Stored || k == op.MetaStored) && bytes.HasPrefix(line, prefixClientErr):
		return fmt.Errorf("%w: %s to %s, which was sent whole: its data block may have been read as a command", errProtocol, shown(line), verb)
	}
	return nil
}

// readLine reads one reply line, CRLF included; the slice is valid until
// the next read of br.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: reply line over %d bytes", errProtocol, br.Size())
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: %s", errProtocol, shown(line))
	}
	return line, nil
}

// errProbeRefused is a size probe that memcached answered with error
// lines for some of its keys (a meta server's CLIENT_ERROR or
// SERVER_ERROR, or ERROR for fewer lines than were sent): the reply was
// read to its end, so the connection is in step, and the keys are read
// without a probe.
var errProbeRefused = errors.New("mcpipe: memcached refused the size probe")

// readProbe reads the reply to a size probe of keys (Client.probe: "mg
// <key> s k q" per key, then "mn"): "HD" with the value's size and key,
// its flags in any order, for each key present in the order asked,
// misses left out (q), then "MN". r.sizes holds each key's size, index
// for index, -1 for a miss. A server without meta commands answers ERROR
// to every line, mn included: all len(keys)+1 of them are read, so that
// the connection stays in step, and r.err is ErrNoMeta. Other error
// lines make r.err errProbeRefused once MN is read. A line that fits
// none of these, a key not asked for, or more lines than were sent is a
// broken stream (errProtocol).
func readProbe(br *bufio.Reader, keys []string) (r reply, err error) {
	r.sizes = make([]int, len(keys))
	for i := range r.sizes {
		r.sizes[i] = -1
	}
	kc := keyCursor{keys: keys}
	errs := 0
	for lines := 0; ; lines++ {
		if lines > len(keys) {
			return r, fmt.Errorf("%w: more than %d lines in reply to a size probe of %d keys", errProtocol, len(keys)+1, len(keys))
		}
		line, err := readLine(br)
		if err != nil {
			return r, err
		}
		switch {
		case bytes.Equal(line, lineMN):
			if errs > 0 && r.err == nil {
				r.err = fmt.Errorf("%w: %d ERROR lines", errProbeRefused, errs)
			}
			return r, nil
		case bytes.Equal(line, lineError):
			if errs++; errs == len(keys)+1 {
				r.err = ErrNoMeta
				return r, nil
			}
		case isErrorLine(line):
			r.err = fmt.Errorf("%w: %s", errProbeRefused, shown(line))
		case bytes.Equal(line, lineEN): // a miss that q did not leave out
		case metaHit(line):
			key, size, err := parseProbeLine(line)
			if err != nil {
				// Another version of the meta protocol: the reply is
				// read to its end, and the keys read without a probe.
				r.err = fmt.Errorf("%w: %w", errProbeRefused, err)
				continue
			}
			_, i := kc.key(key)
			if i < 0 {
				return r, fmt.Errorf("%w: %s answers a key the size probe did not ask for, or out of order", errProtocol, shown(line))
			}
			r.sizes[i] = size
		default:
			return r, fmt.Errorf("%w: %s in reply to a size probe", errProtocol, shown(line))
		}
	}
}

// parseProbeLine parses "HD s<size> k<key>\r\n", its flags in any order
// and others passed over, into the key (a slice of line) and the size.
// s or k given twice is an error, as in metaResult: memcached returns
// each flag asked once, and a line with two sizes or two keys says
// neither.
func parseProbeLine(line []byte) (key []byte, size int, err error) {
	seen := 0
	for tok := range bytes.FieldsSeq(line[2 : len(line)-2]) {
		if (tok[0] == 's' && seen&1 != 0) || (tok[0] == 'k' && seen&2 != 0) {
			return nil, 0, fmt.Errorf("%w: flag %c twice in %s", errProtocol, tok[0], shown(line))
		}
		switch tok[0] {
		case 's':
			n, perr := strconv.ParseUint(string(tok[1:]), 10, 31)
			if perr != nil {
				return nil, 0, fmt.Errorf("%w: bad size in %s", errProtocol, shown(line))
			}
			size, seen = int(n), seen|1
		case 'k':
			if len(tok) == 1 {
				return nil, 0, fmt.Errorf("%w: empty key in %s", errProtocol, shown(line))
			}
			key, seen = tok[1:], seen|2
		}
	}
	if seen != 3 {
		return nil, 0, fmt.Errorf("%w: %s without its size and key", errProtocol, shown(line))
	}
	return key, size, nil
}

// readValue reads a value's size bytes and its CRLF off the stream into
// a buffer that lend lends (nil: a new one). A lender has held size
// bytes already (op.Room.Reserve). A new buffer is not allocated from
// the size alone, which is only what the server claims: past
// trustedValue it doubles as the bytes come, and takes the whole size
// once an eighth of it has come, so that a server that stops sending
// holds at most eight times what it sent (as a client's body does), and
// "VALUE k 0 2147483647" followed by silence costs what came, not 2 GiB.
func readValue(br *bufio.Reader, size int, lend func(int) []byte) ([]byte, error) {
	if lend == nil {
		n := size + 2 // one read for the value and its CRLF
		v := make([]byte, min(n, trustedValue))
		for got := 0; ; {
			if _, err := io.ReadFull(br, v[got:]); err != nil {
				return nil, err
			}
			if got = len(v); got == n {
				break
			}
			grow := got
			if 8*got >= n {
				grow = n - got
			}
			v = append(v, make([]byte, min(grow, n-got))...)
		}
		if !bytes.HasSuffix(v, crlf) {
			return nil, errNoCRLF
		}
		return v[:size], nil
	}
	v := lend(size)[:size] // its size class, not the next one's
	if _, err := io.ReadFull(br, v); err != nil {
		return nil, err
	}
	return v, readCRLF(br)
}

// trustedValue is the most of a value's claimed size that readValue
// allocates before any of it has come.
const trustedValue = 64 << 10

// errNoCRLF is a value not followed by CRLF.
var errNoCRLF = fmt.Errorf("%w: a value not followed by CRLF", errProtocol)

// readCRLF reads the CRLF that ends a value.
func readCRLF(br *bufio.Reader) error {
	var end [2]byte
	if _, err := io.ReadFull(br, end[:]); err != nil {
		return err
	}
	if string(end[:]) != "\r\n" {
		return errNoCRLF
	}
	return nil
}

// skipValue reads a value's size bytes and its CRLF off the stream
// without keeping them.
func skipValue(br *bufio.Reader, size int) error {
	if _, err := br.Discard(size); err != nil {
		return err
	}
	return readCRLF(br)
}

// lineResult maps a one-line reply to gomemcache's result for the verb
// (and incr/decr's number).
func lineResult(k op.Reply, verb string, line []byte) (uint64, error) {
	switch k {
	case op.MetaStored: // as op.Stored's, flags passed over
		switch {
		case bytes.Equal(line, lineHD), bytes.HasPrefix(line, prefixHD):
			return 0, nil
		case bytes.Equal(line, lineNS):
			return 0, memcache.ErrNotStored
		case bytes.Equal(line, lineEX):
			return 0, memcache.ErrCASConflict
		case bytes.Equal(line, lineNF):
			return 0, memcache.ErrCacheMiss
		}
		return 0, fmt.Errorf("memcache: unexpected response line from %q: %s", verb, shown(line))
	case op.MetaDeleted:
		switch {
		case bytes.Equal(line, lineHD), bytes.HasPrefix(line, prefixHD), bytes.Equal(line, lineOK): // OK: memcached 1.6.0 to 1.6.9
			return 0, nil
		case bytes.Equal(line, lineEX):
			return 0, memcache.ErrCASConflict
		case bytes.Equal(line, lineNF):
			return 0, memcache.ErrCacheMiss
		case bytes.Equal(line, lineError), bytes.HasPrefix(line, prefixClientErr):
			// A server without meta commands, or a proxy that passes
			// none on: md has no data block, so the connection is in
			// step.
			return 0, fmt.Errorf("%w: %s to %q", ErrNoMeta, shown(line), verb)
		}
		return 0, fmt.Errorf("memcache: unexpected response line from %q: %s", verb, shown(line))
	case op.Stored:
		switch {
		case bytes.Equal(line, lineStored):
			return 0, nil
		case bytes.Equal(line, lineNotStored):
			return 0, memcache.ErrNotStored
		case bytes.Equal(line, lineExists):
			return 0, memcache.ErrCASConflict
		case bytes.Equal(line, lineNotFound):
			return 0, memcache.ErrCacheMiss
		}
		return 0, fmt.Errorf("memcache: unexpected response line from %q: %s", verb, shown(line))
	case op.Deleted:
		switch {
		case bytes.Equal(line, lineDeleted), bytes.Equal(line, lineOK):
			return 0, nil
		case bytes.Equal(line, lineNotFound):
			return 0, memcache.ErrCacheMiss
		}
		return 0, fmt.Errorf("memcache: unexpected response line: %s", shown(line))
	case op.Touched:
		switch {
		case bytes.Equal(line, lineTouched):
			return 0, nil
		case bytes.Equal(line, lineNotFound):
			return 0, memcache.ErrCacheMiss
		}
		return 0, fmt.Errorf("memcache: unexpected response line from touch: %s", shown(line))
	default: // op.Number
		switch {
		case bytes.Equal(line, lineNotFound):
			return 0, memcache.ErrCacheMiss
		case bytes.HasPrefix(line, prefixClientErr):
			msg := line[len(prefixClientErr) : len(line)-2]
			return 0, errors.New("memcache: client error: " + string(msg[:min(len(msg), maxShown)]))
		}
		v, err := strconv.ParseUint(string(line[:len(line)-2]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("memcache: unexpected response line: %s", shown(line))
		}
		return v, nil
	}
}

// ParseMetaDeleted reads the reply line to an op.DeleteCAS (md) as Do
// does: nil when deleted, memcache.ErrCASConflict, memcache.ErrCacheMiss,
// or ErrNoMeta for an error line. For callers that send it on connections
// of their own (gomemcache's pool has no meta commands).
func ParseMetaDeleted(line []byte) error {
	_, err := lineResult(op.MetaDeleted, "md", line)
	return err
}

// ParseHead reads the reply line to "mg <key> s f c" (op.Head, and
// op.HeadTouch's "… T<exptime>"), as metaResult: for callers that send
// it on connections of their own (gomemcache's pool has no meta commands).
func ParseHead(line []byte) (*memcache.Item, uint64, error) { return metaResult(line) }

// metaResult reads the reply to "mg <key> s f c" (op.Head): "HD" with
// the flags in any order, or "EN" for a miss, as an item holding the
// flags and CAS and the value's size. ERROR is a server that knows no meta
// commands (ErrNoMeta).
func metaResult(line []byte) (*memcache.Item, uint64, error) {
	switch {
	case bytes.Equal(line, lineEN):
		return nil, 0, memcache.ErrCacheMiss
	case bytes.Equal(line, lineError), bytes.HasPrefix(line, prefixClientErr):
		return nil, 0, fmt.Errorf("%w: %s", ErrNoMeta, shown(line))
	case !metaHit(line):
		return nil, 0, fmt.Errorf("memcache: unexpected response line from mg: %s", shown(line))
	}
	it := new(memcache.Item)
	var size uint64
	seen := 0 // a bit per flag asked for: each comes once
	for tok := range bytes.FieldsSeq(line[2 : len(line)-2]) {
		var err error
		var bit int
		switch tok[0] {
		case 's':
			size, err = strconv.ParseUint(string(tok[1:]), 10, 31)
			bit = 1
		case 'f':
			var f uint64
			f, err = strconv.ParseUint(string(tok[1:]), 10, 32)
			it.Flags, bit = uint32(f), 2
		case 'c':
			it.CasID, err = strconv.ParseUint(string(tok[1:]), 10, 64)
			bit = 4
		default:
			continue
		}
		if err != nil || seen&bit != 0 {
			// A flag given twice: counted as two of the three, it
			// stood for one not sent (its value 0).
			return nil, 0, fmt.Errorf("%w: bad %s in %s", ErrNoMeta, shown(tok), shown(line))
		}
		seen |= bit
	}
	if seen != 7 {
		return nil, 0, fmt.Errorf("%w: %s has no size, flags and CAS", ErrNoMeta, shown(line))
	}
	return it, size, nil
}

// metaHit reports whether line is a meta command's success: "HD", or
// "OK" from memcached before 1.6.10, with or without flags.
func metaHit(line []byte) bool {
	return bytes.Equal(line, lineHD) || bytes.HasPrefix(line, prefixHD) ||
		bytes.Equal(line, lineOK) || bytes.HasPrefix(line, prefixOK)
}

// ErrNoMeta is a server's ERROR or CLIENT_ERROR for a meta command
// (op.Head), or a success without the flags asked for: it is older than
// memcached 1.6, speaks another version of the meta protocol, or a proxy
// in front of it does not pass meta commands on. The connection stays in
// step; a plain get answers instead. It is also what an op.AppendCAS or
// op.PrependCAS gets, unsent, from a Client whose server has not answered
// an mg with "HD" (Client.Do), and what an op.DeleteCAS gets when its md
// is answered with an error line.
var ErrNoMeta = errors.New("memcache: server does not know meta commands (mg)")

// keyCursor finds the keys of a reply among the keys asked, so that an
// item's Key is the string its caller passed rather than a copy.
// memcached answers the keys of a command in order, leaving out the
// misses, so the search goes on from the last key found.
type keyCursor struct {
	keys []string
	next int
	own  bool // keys are a reply of its own's (readReply's asked): a key found is at index 0, its one call's
}

// key returns the key asked equal to b and its index on the shared line
// (0 for a reply of its own), or else a copy of b and -1: a key not asked,
// or out of order. With no keys it returns a copy of b and 0.
func (kc *keyCursor) key(b []byte) (string, int) {
	if len(kc.keys) == 0 {
		return string(b), 0
	}
	for i := kc.next; i < len(kc.keys); i++ {
		if kc.keys[i] == string(b) {
			kc.next = i + 1
			if kc.own {
				return kc.keys[i], 0
			}
			return kc.keys[i], i
		}
	}
	return string(b), -1
}

// parseValueLine parses "VALUE <key> <flags> <bytes> [<cas>]\r\n", taking
// the key and its index from keys.
func parseValueLine(line []byte, keys *keyCursor) (it memcache.Item, index, size int, err error) {
	rest := line[len(prefixValue) : len(line)-2]
	if len(rest) == 0 || rest[len(rest)-1] == ' ' {
		return it, 0, 0, fmt.Errorf("%w: %s", errProtocol, shown(line))
	}
	var f [4][]byte
	n := 0
	for len(rest) > 0 && n < len(f) {
		i := bytes.IndexByte(rest, ' ')
		if i < 0 {
			i = len(rest)
		}
		f[n], n = rest[:i], n+1
		rest = rest[min(i+1, len(rest)):]
	}
	if len(rest) > 0 || n < 3 || len(f[0]) == 0 {
		return it, 0, 0, fmt.Errorf("%w: %s", errProtocol, shown(line))
	}
	flags, err1 := strconv.ParseUint(string(f[1]), 10, 32)
	n64, err2 := strconv.ParseUint(string(f[2]), 10, 31)
	var cas uint64
	var err3 error
	if n == 4 {
		cas, err3 = strconv.ParseUint(string(f[3]), 10, 64)
	}
	if err1 != nil || err2 != nil || err3 != nil {
		return it, 0, 0, fmt.Errorf("%w: %s", errProtocol, shown(line))
	}
	key, index := keys.key(f[0])
	return memcache.Item{Key: key, Flags: uint32(flags), CasID: cas}, index, int(n64), nil
}
