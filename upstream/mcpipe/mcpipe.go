// Package mcpipe is a pipelined client for memcached's text protocol. It
// exists because gomemcache, the project's client, sends one request per
// connection and waits for its reply: under load every request then costs a
// write and a read system call on each side, and a wake-up of memcached per
// request. Here a few connections carry every request of a node at once:
// requests that arrive while a write is in progress leave together in the
// next write, and memcached answers them in one read and one write.
//
// The Client has gomemcache's method set, items and error values, so the
// caller classifies its errors exactly as gomemcache's; only the transport
// differs. Replies come back in request order on a connection (memcached
// guarantees it), so a connection that loses its place — an I/O error, a
// timeout, a reply that does not parse — fails every request on it and is
// replaced on the next use.
package mcpipe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// DefaultTimeout is Options.Timeout when zero: gomemcache's default.
const DefaultTimeout = 500 * time.Millisecond

// Options configures a Client.
type Options struct {
	// Dial opens one connection to the server. A socket it returns
	// (*net.TCPConn, *net.UnixConn) is read and written with system
	// calls on its descriptor, large values with writev, so it should
	// return the connection itself, not a wrapper; any other connection
	// is read and written with its own methods.
	Dial func(ctx context.Context) (net.Conn, error)
	// Closed, if not nil, is called once for every connection Dial
	// returned, after the client closed it: a count of open connections
	// needs no wrapper around them.
	Closed func()
	// Share, if not nil, is the server's share of its callers' byte
	// budgets: what its replies hold of them while they are read.
	Share Share
	// Conns is the number of connections requests are spread over; if
	// zero, 1.
	Conns int
	// Timeout bounds dialling and how long memcached may stall: a write
	// waits at most that long with no byte taken, and while written
	// requests are unanswered the next reply is owed within it of the
	// last progress: the last reply (or 256 KiB of a long one), the
	// last bytes a write moved once it had waited for room in the
	// socket, or else the start of the write that ended a wait with
	// none unanswered (writes that never wait do not move it); each
	// rounded down by up to an eighth to spare timer updates. A value
	// memcached reads slowly but steadily takes as long as it needs.
	// Bytes the kernel's send buffer took count as written then, though
	// still on their way: a value the buffer takes whole is owed its
	// reply from the end of its write. If zero, DefaultTimeout.
	Timeout time.Duration
	// Panics, if not nil, stops a panic on a connection's reply reader
	// (where="mcpipe_reader": the connection fails, since its place in
	// the reply stream is unknown, and so do its calls) and in a
	// DoAsync callback (where="mcpipe_callback": the other callbacks
	// run and the connection goes on, its stream where it was). If nil,
	// such a panic ends the process.
	Panics *panicguard.Guard
}

// Client sends requests to one memcached server over Options.Conns
// pipelined connections, and reads of values known to be large (see
// SizeHints) and the chunks of values in chunks (op.Op.Bulk) over as many
// more, dialled when first needed: a small request never waits behind
// megabytes of replies or chunks, however many are queued. (Multi-key gets go on the small lane unless their
// values are held through a Room: GetMultiLimit.) It is safe for
// concurrent use. Its methods block until the reply arrives or the
// connection fails, but for DoAsync, which completes through a callback.
type Client struct {
	dial    func(ctx context.Context) (net.Conn, error)
	closed  func()
	timeout time.Duration
	small   lane // every request but large reads
	large   lane // reads of values that were large when last read
	calls   sync.Pool
	hints   *SizeHints
	share   Share        // Options.Share; nil: none
	ahead   atomic.Int64 // the sizes last seen of the large reads sent and not yet answered (admit)
	noMeta  atomic.Bool  // the server answered a size probe with ERROR: no meta commands, so GetMultiLimit probes no more
	// metaSets: the server answered an mg (op.Head) with "HD", as
	// memcached 1.6.10 and later do, whose ms takes the data length as a
	// token (op.AppendCAS). Before, an ms is refused unsent: memcached
	// 1.6.0 to 1.6.9 answers mg with "OK" and reads that ms as another,
	// and one without meta commands reads its data block as a command;
	// either would put the connection out of step. Cleared by each dial.
	metaSets atomic.Bool
	// Where panics on its reader goroutines and in callbacks are
	// stopped (Options.Panics); nil: nowhere.
	readerPanics, callbackPanics *panicguard.Site
}

// lane is connections that requests are spread over round robin.
type lane struct {
	slots []slot
	next  atomic.Uint32
}

// slot holds one connection, dialled on first use and after a failure.
type slot struct {
	mu      sync.Mutex // held while dialling; guards dialErr and dialEnd
	c       atomic.Pointer[conn]
	dialErr error     // the last dial's failure
	dialEnd time.Time // when it ended
}

// New returns a Client. It dials nothing until the first request.
func New(o Options) *Client {
	if o.Conns <= 0 {
		o.Conns = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return &Client{
		dial: o.Dial, closed: o.Closed, timeout: o.Timeout, hints: NewSizeHints(), share: o.Share,
		small: lane{slots: make([]slot, o.Conns)}, large: lane{slots: make([]slot, o.Conns)},
		readerPanics: o.Panics.Site("mcpipe_reader"), callbackPanics: o.Panics.Site("mcpipe_callback"),
	}
}

// Share bounds what one server's replies hold of their callers' byte
// budgets while they are read. A value is held (op.Room.Reserve) from
// its VALUE line, before its bytes come: a server that claims a value
// and sends it slowly, or not at all, holds the claimed size until its
// reply ends or the connection fails, and with many callers reading its
// keys it could hold a budget every server's callers draw on. Take is
// asked before every such hold; a value it refuses is read off and
// dropped as one its Room refused (ErrNoFit). Give gives back what Take
// counted once the reply has been read and handed out, or has failed.
// Both run on a connection's reader goroutine, once per value held
// (op.LentValue bytes or more; any value of a multi-key Get with a
// Room): never for the small values of single reads.
type Share interface {
	// Take counts n more bytes as held by the server's replies, or
	// reports that they hold their share already, counting nothing.
	Take(n int) bool
	// Give gives back n bytes Take counted.
	Give(n int)
	// Ahead reports whether the server may have n bytes of large values
	// on their way at once (asked for and not yet read), counting a
	// refusal if not.
	Ahead(n int64) bool
}

// ErrClosed is what requests on a connection get after Close closed it.
var ErrClosed = errors.New("mcpipe: connection closed")

// ErrBehind fails the calls on a connection whose oldest unanswered
// caller's deadline passed while memcached was still sending the reply
// being read: replies come in order, so no call behind it could have been
// answered sooner, and the connection is given up there (see
// MEMCGATE_REQUEST_TIMEOUT). It wraps context.DeadlineExceeded: what ran
// out was the callers' time in the connection's queue, not memcached's
// progress, so it says nothing about the node's health.
var ErrBehind = fmt.Errorf("mcpipe: a caller's deadline passed while memcached was still sending the replies ahead of it: %w", context.DeadlineExceeded)

// ErrNoFit is what a read gets when its op.Op.Room refused its value:
// memcached has it, and it was read off the connection and dropped; or,
// when the key's value was large the last time a Room was asked about it
// and the Room would not take that size now, the read was not sent.
var ErrNoFit = errors.New("mcpipe: the value does not fit the caller's byte budget")

// Close closes the open connections; requests on them fail with ErrClosed.
// The Client stays usable: the next request dials again.
func (c *Client) Close() error {
	for _, l := range []*lane{&c.small, &c.large} {
		for i := range l.slots {
			if cn := l.slots[i].c.Swap(nil); cn != nil {
				cn.fail(ErrClosed)
			}
		}
	}
	return nil
}

// conn picks a connection of l round robin, dialling it if needed.
func (c *Client) conn(l *lane) (*conn, error) {
	s := &l.slots[int(l.next.Add(1)-1)%len(l.slots)]
	if cn := s.c.Load(); cn != nil && !cn.failed() {
		return cn, nil
	}
	waitFrom := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if cn := s.c.Load(); cn != nil && !cn.failed() {
		return cn, nil
	}
	if s.dialErr != nil && s.dialEnd.After(waitFrom) {
		// A dial failed while we waited for it: share its answer rather
		// than queue one more dial (against a black hole, callers would
		// otherwise wait a dial timeout each, one after another).
		return nil, s.dialErr
	}
	nc, err := c.dialTimely()
	if err != nil {
		s.dialErr, s.dialEnd = err, time.Now()
		return nil, err
	}
	s.dialErr = nil
	// A new connection may reach another server at the same address (a
	// memcached restarted as an older version): meta sets wait for its
	// mg to answer HD again, which the next checked append's read does.
	c.metaSets.Store(false)
	cn := newConn(nc, c.timeout)
	cn.closed, cn.hints, cn.share, cn.panics = c.closed, c.hints, c.share, c.readerPanics
	go cn.readLoop()
	s.c.Store(cn)
	return cn, nil
}

// dialTimely dials within the timeout, and once more if the dial timed
// out a quarter of the timeout or more after its deadline, as the reader
// forgives a late deadline (conn.overdue): the gateway, not the server,
// was not running (a process stopped or starved of CPU, a container
// throttled), and the server had less time to answer than it was given.
// Without it a gateway paused for 0.8 s while a connection was being
// dialled failed the dial with "i/o timeout" on waking, and with it every
// read that was waiting for the connection, which then went to the next
// node and found nothing there (decisions/0085).
func (c *Client) dialTimely() (net.Conn, error) {
	for again := true; ; again = false {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		nc, err := c.dial(ctx)
		cancel()
		var ne net.Error
		if err == nil || !again || !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) < c.timeout+c.timeout/4 {
			return nc, err
		}
	}
}

// ErrNoConn is GetAsync's and SetAsync's error when no connection is open:
// they never dial (a dial waits), so the caller makes a blocking call,
// which dials.
var ErrNoConn = errors.New("mcpipe: no open connection")

// openConn picks an open connection of l round robin, skipping failed or
// undialled ones, without dialling.
func (c *Client) openConn(l *lane) (*conn, error) {
	n := int(l.next.Add(1) - 1)
	for i := range l.slots {
		if cn := l.slots[(n+i)%len(l.slots)].c.Load(); cn != nil && !cn.failed() {
			return cn, nil
		}
	}
	return nil, ErrNoConn
}

// Do sends o, with key as the key sent (the caller's prefix applied),
// and waits for its reply: for op.Get the item
// (memcache.ErrCacheMiss if there is none), for op.Incr and op.Decr the
// new value, for the others their outcome, with gomemcache's errors.
// Single-key Gets may share one command line with others (see conn.send).
// op.AppendCAS and op.PrependCAS answer as their plain verbs do, a CAS
// that does not match with memcache.ErrCASConflict; they are sent only
// once an op.Head was answered "HD", and get ErrNoMeta unsent before.
// op.DeleteCAS (md, one line with no data block, which every memcached
// 1.6 reads alike) is sent at once: a CAS that does not match is
// memcache.ErrCASConflict, a miss memcache.ErrCacheMiss, and an error
// line, from a server without meta commands, ErrNoMeta.
//
// A value of 16 KiB or more is written from o.Item.Value itself, which
// must not change until Do returns. (When memcached refuses a value
// before reading all of it, Do may return while the rest is still being
// written; memcached reads those bytes only to discard them.) Such a
// value first waits for room on its connection,
// which holds at most about 1 MiB of such values not yet written (or one
// larger value alone); if ctx ends first, Do returns ErrNoRoom wrapping
// ctx's error and nothing was sent. Once sent, the connection's timeout
// bounds the reply: each reply, and each piece of a value being written,
// is owed within the timeout of the bytes that last moved, but no later
// than ctx's deadline once this call is the oldest waiting for its
// reply. The connection fails with a timeout there, and so do the calls
// behind this one, which memcached would answer only after it.
func (c *Client) Do(ctx context.Context, o op.Op, key string) (*memcache.Item, uint64, error) {
	if !LegalKey(key) {
		return nil, 0, memcache.ErrMalformedKey
	}
	l, hint := c.route(&o, key)
	if !c.admit(o.Room, key, hint, o.Verb == op.GAT) {
		return nil, 0, ErrNoFit
	}
	cn, err := c.conn(l)
	if err != nil {
		c.ahead.Add(-int64(hint))
		return nil, 0, err
	}
	if o.Verb.Reply() == op.MetaStored && !c.metaSets.Load() {
		// Asked after the dial, which clears it: a new connection
		// may reach another server.
		return nil, 0, ErrNoMeta
	}
	cl := c.newCall()
	c.prepare(cl, &o, key)
	cl.ahead = hint
	cl.by, _ = ctx.Deadline()
	if n := cl.big(); n > 0 {
		if err := cn.reserve(ctx, n); err != nil {
			c.release(cl)
			return nil, 0, err
		}
	}
	if err := cn.send(cl); err != nil {
		c.release(cl)
		return nil, 0, err
	}
	<-cl.done
	if cl.hd && !c.metaSets.Load() {
		c.metaSets.Store(true)
	}
	it, n, err := cl.result()
	if it == &cl.item {
		// The call's own, cleared when it goes back to the pool.
		own := *it
		it = &own
	}
	c.release(cl)
	return it, n, err
}

// route returns the lane o goes on: the large one for a chunk of a value
// in chunks (op.Op.Bulk) and for a read with a Room whose key's value was
// large when last read (SizeHints), and the small one for the rest; and,
// for a Get or GAT on the large lane, the size last seen (0 for any other
// operation). An operation that changes key's value drops its hint.
func (c *Client) route(o *op.Op, key string) (*lane, int) {
	switch {
	case o.Bulk:
		return &c.large, 0
	case o.Room != nil && o.Verb.Reply() == op.Items:
		if n := c.hints.Size(key); n > 0 { // a Get or GAT
			return &c.large, n
		}
	case o.Verb.Writes():
		c.hints.Forget(key)
	}
	return &c.small, 0
}

// admit reports whether a read of key routed to the large lane (a Get or
// GAT, or a key of a multi-key get with a room), its value n bytes when
// last read, may be sent, and if so counts n in c.ahead until its call is
// released. It may be sent when the server's large values on their way,
// with this one, stay within what the Share lets it have ahead
// (Share.Ahead; any one value alone may be), and then, but for a GAT, if
// room could take n bytes now, or else if it is the one read per
// hintRetry sent anyway to correct a hint that may be stale. A GAT is not
// refused for room, since it touches the item whether or not its value is
// kept; refused for what is on its way, it does not touch it either: the
// request failed, and its client may send it again. n of 0 is any other
// operation, always sent and not counted.
//
// Reads on their way are not memory, but they are the server's queue:
// without a bound in bytes, clients that ask for large values and never
// read the answers (a reset after each request) keep thousands queued
// on the node, each holding one of its in-flight slots, and every other
// request for the node waits for a slot behind gigabytes of replies.
func (c *Client) admit(room op.Room, key string, n int, gat bool) bool {
	if n == 0 {
		return true
	}
	if !c.takeAhead(n) {
		return false
	}
	if gat || room.Fits(n) || c.hints.Retry(key) {
		return true
	}
	c.ahead.Add(-int64(n))
	return false
}

// takeAhead counts n bytes of a large value in c.ahead if the server's
// large values on their way, with these, stay within what the Share lets
// it have ahead (any one value alone may be), and reports whether it
// did.
func (c *Client) takeAhead(n int) bool {
	after := c.ahead.Add(int64(n))
	if after == int64(n) || c.share == nil || c.share.Ahead(after) {
		return true
	}
	c.ahead.Add(-int64(n))
	return false
}

// prepare makes cl the call of o.
func (c *Client) prepare(cl *call, o *op.Op, key string) {
	cl.kind, cl.verb, cl.room = o.Verb.Reply(), o.Verb.Command(), o.Room
	if o.Verb == op.Get {
		cl.key = key // shares gets lines with other Gets
		return
	}
	cl.o, cl.skey = *o, key
}

// newCall returns a call from the pool.
func (c *Client) newCall() *call {
	cl, _ := c.calls.Get().(*call)
	if cl == nil {
		cl = &call{done: make(chan struct{}, 1)}
	}
	return cl
}

// DoAsync is Do for a caller that does not wait: it sends o and returns.
// ctx's deadline bounds the call as Do's does, once sent; ctx is not
// kept.
// It never dials: with no connection open it returns ErrNoConn. If it
// returns an error, nothing was sent and done is never called. Otherwise
// done is called exactly once with what Do would have returned: usually
// from the goroutine that reads the connection's replies, but from
// whichever goroutine fails the connection (possibly the caller's, before
// DoAsync returns), or, for a read refused unsent (ErrNoFit), from the
// caller's before DoAsync returns; never with a lock of the Client held.
// Callbacks of one connection may run concurrently and out of request
// order when it fails. o is encoded before DoAsync returns; it is not
// kept. The item done gets is valid until done returns, as the bytes
// given to an io.Writer's Write are: done copies what it keeps of it (its
// Value is the caller's to keep).
//
// DoAsync never waits: a value that would wait for room on its
// connection (see Do) is refused with ErrNoRoom, and the caller may use
// Do, which waits.
//
// done runs where the connection's replies are read: it must not block,
// and must not send more requests to this Client itself (the reader would
// become the writer while memcached waits for it to read); hand such work
// to a goroutine.
func (c *Client) DoAsync(ctx context.Context, o op.Op, key string, done func(*memcache.Item, uint64, error)) error {
	if !LegalKey(key) {
		return memcache.ErrMalformedKey
	}
	if o.Verb.Reply() == op.MetaStored && !c.metaSets.Load() {
		return ErrNoMeta
	}
	l, hint := c.route(&o, key)
	if !c.admit(o.Room, key, hint, o.Verb == op.GAT) {
		// Answered, as the reply would have been: calling Do instead
		// would ask the Room again, and count a second refusal.
		done(nil, 0, ErrNoFit)
		return nil
	}
	cn, err := c.openConn(l)
	if err != nil {
		c.ahead.Add(-int64(hint))
		return err
	}
	cl := c.newCall()
	c.prepare(cl, &o, key)
	cl.ahead = hint
	cl.by, _ = ctx.Deadline()
	if n := cl.big(); n > 0 {
		if !cn.tryReserve(n) {
			c.release(cl)
			return ErrNoRoom
		}
		// Written after DoAsync returns, from a copy: the caller may
		// reuse its buffer at once.
		cl.o.Item.Value = bytes.Clone(cl.o.Item.Value)
	}
	cl.client, cl.onDone = c, done
	if err := cn.send(cl); err != nil {
		c.release(cl)
		return err
	}
	return nil
}

// release returns a call whose results the caller has read.
func (c *Client) release(cl *call) {
	c.dropAhead(cl)
	// A pooled call keeps its peer array only if it is small, and never
	// the calls in it: stale pointers there would keep those calls (and
	// their own arrays) alive, so a burst's shared lines would stay in
	// the heap that every GC marks long after the burst.
	peer := cl.peer
	if cap(peer) > maxPooledPeers {
		peer = nil
	} else {
		clear(peer)
		peer = peer[:0]
	}
	*cl = call{done: cl.done, peer: peer}
	c.calls.Put(cl)
}

// dropAhead gives back what cl counts in c.ahead, once: when its reply
// has been read, even if the call itself goes back to the pool later.
func (c *Client) dropAhead(cl *call) {
	if cl.ahead != 0 {
		c.ahead.Add(-int64(cl.ahead))
		cl.ahead = 0
	}
}

// maxPooledPeers is the largest peer array a pooled call keeps: shared
// gets lines at 64 clients hold about 11 keys at the median and 31 at p99.
const maxPooledPeers = 32

// LegalKey reports whether memcached's text protocol can carry key, by
// gomemcache's rule: 1 to 250 bytes, no spaces or control bytes, so a key
// can never split or end a command line. The client's calls refuse other
// keys unsent (memcache.ErrMalformedKey).
func LegalKey(key string) bool {
	if len(key) == 0 || len(key) > 250 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] == 0x7f {
			return false
		}
	}
	return true
}

// Get reads one item with its CAS value ("gets", as gomemcache);
// memcache.ErrCacheMiss if it is not there.
func (c *Client) Get(key string) (*memcache.Item, error) {
	it, _, err := c.Do(context.Background(), op.Op{Verb: op.Get}, key)
	return it, err
}

// GetMulti reads many items with one command; missing keys are absent
// from the map.
func (c *Client) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	m, _, _, err := c.GetMultiLimit(context.Background(), keys, 0, nil, false)
	return m, err
}

// GetMultiLimit is GetMulti that keeps at most limit bytes of values (0:
// no limit): values that would pass it are read off the connection and
// dropped, and their keys returned in dropped, so that a reply of any
// size costs at most limit bytes of memory. room, if not nil, is asked
// for every value before it is read (op.Room, for values of any size):
// one it does not Reserve is read off and dropped, its key in nofit, and
// the reservations are released once the reply is read. With a room the
// command goes on the large lane, since its reply may be megabytes long
// (a small request must not wait behind it), and a key whose value was
// large when last read is refused unsent (in nofit) while the room could
// not take that size, or while the server has as much of such values on
// their way as its Share lets it have, as Do's reads are (Client.admit):
// those it sends count in that until the reply is read. ctx's deadline
// bounds it as Do's does.
//
// With probe and a limit, memcached is first asked the size of every
// key's value (Client.fitting, one round trip more) and then sent a gets
// for only the keys whose values fit: without it memcached sends every
// value, and a request naming 100 keys of 1 MB made it send 100 MB to
// keep 16 MiB. The keys present past the limit are in dropped, unsent;
// those whose value room could not take now are in nofit, unsent; the
// keys missing at probe time are not read (misses). A value that grew
// since the probe is still dropped as it is read. A server without meta
// commands (memcached before 1.6) answers the first probe with ERROR,
// and the Client probes no more: its keys are read as without probe.
func (c *Client) GetMultiLimit(ctx context.Context, keys []string, limit int, room op.Room, probe bool) (items map[string]*memcache.Item, dropped, nofit []string, err error) {
	for _, k := range keys {
		if !LegalKey(k) {
			return nil, nil, nil, memcache.ErrMalformedKey
		}
	}
	probing := probe && limit > 0 && !c.noMeta.Load()
	l, send, ahead := &c.small, keys, 0
	if room != nil {
		l, send = &c.large, make([]string, 0, len(keys))
		for _, k := range keys {
			n := c.hints.Size(k)
			if probing {
				// Counted ahead at the size the probe finds (fitting).
				if n == 0 || room.Fits(n) || c.hints.Retry(k) {
					send = append(send, k)
					continue
				}
			} else if c.admit(room, k, n, false) {
				send, ahead = append(send, k), ahead+n
				continue
			}
			nofit = append(nofit, k)
		}
	}
	if probing && len(send) > 0 {
		var refused []string
		if send, dropped, refused, ahead, err = c.fitting(ctx, send, limit, room); err != nil {
			return nil, nil, nil, err
		}
		nofit = append(nofit, refused...)
	}
	if len(send) == 0 {
		c.ahead.Add(-int64(ahead))
		return map[string]*memcache.Item{}, dropped, nofit, nil
	}
	cl, err := c.sendGets(ctx, l, send, limit, room, ahead)
	if err != nil {
		return nil, nil, nil, err
	}
	<-cl.done
	defer c.release(cl)
	if cl.err != nil {
		return nil, nil, nil, cl.err
	}
	items = make(map[string]*memcache.Item, len(cl.items))
	for _, it := range cl.items {
		items[it.Key] = it
	}
	return items, append(dropped, cl.dropped...), append(nofit, cl.refused...), nil
}

// fitting asks memcached the sizes of keys' values (probe) and returns
// the keys worth a gets: the present ones, in order, whose values fit
// limit as readReply would keep them (a value that passes what is kept
// so far is skipped, a smaller one after it may still fit), and that room
// (nil: none) could take now. over are the present keys past the limit,
// nofit those room could not take, or, with a room, the large ones
// (op.LentValue or more) the server may not have on their way
// (takeAhead): those sent are counted in c.ahead, ahead bytes, for the
// caller to give back. A server without meta commands is remembered
// (noMeta), and a probe it refused for some keys (errProbeRefused)
// taught nothing: both return every key, read as without a probe, and
// count nothing. A failed connection is an error.
func (c *Client) fitting(ctx context.Context, keys []string, limit int, room op.Room) (send, over, nofit []string, ahead int, err error) {
	sizes, err := c.probe(ctx, keys)
	switch {
	case errors.Is(err, ErrNoMeta):
		c.noMeta.Store(true)
		return keys, nil, nil, 0, nil
	case errors.Is(err, errProbeRefused):
		return keys, nil, nil, 0, nil
	case err != nil:
		return nil, nil, nil, 0, err
	}
	send = make([]string, 0, len(keys))
	kept := 0
	for i, k := range keys {
		switch n := sizes[i]; {
		case n < 0: // a miss: nothing to read
		case kept+n > limit:
			over = append(over, k)
		case room != nil && n > 0 && !room.Fits(n),
			room != nil && n >= op.LentValue && !c.takeAhead(n):
			nofit = append(nofit, k)
		default:
			kept += n
			send = append(send, k)
			if room != nil && n >= op.LentValue {
				ahead += n
			}
		}
	}
	return send, over, nofit, ahead, nil
}

// probe sends "mg <key> s k q" for each key and then "mn", as one call
// on the small lane (its reply is a line per key), and returns the size
// of each key's value, index for index, -1 for a miss (readProbe).
func (c *Client) probe(ctx context.Context, keys []string) ([]int, error) {
	cn, err := c.conn(&c.small)
	if err != nil {
		return nil, err
	}
	cl := c.newCall()
	defer c.release(cl)
	cl.kind, cl.verb, cl.probe = op.Meta, "mg", keys
	cl.by, _ = ctx.Deadline()
	cl.encode = func(b []byte) []byte {
		for _, k := range keys {
			b = append(b, "mg "...)
			b = append(b, k...)
			b = append(b, " s k q\r\n"...)
		}
		return append(b, "mn\r\n"...)
	}
	if err := cn.send(cl); err != nil {
		return nil, err
	}
	<-cl.done
	return cl.sizes, cl.err
}

// sendGets sends one gets command for keys on a connection of lane l, as
// GetMultiLimit's call, which gives back the ahead bytes its keys counted
// in c.ahead when it is released; if it is not sent, sendGets gives them
// back.
func (c *Client) sendGets(ctx context.Context, l *lane, keys []string, limit int, room op.Room, ahead int) (*call, error) {
	cn, err := c.conn(l)
	if err != nil {
		c.ahead.Add(-int64(ahead))
		return nil, err
	}
	cl := c.newCall()
	cl.kind, cl.verb, cl.limit, cl.asked, cl.ahead = op.Items, "gets", limit, keys, ahead
	cl.room, cl.all = room, room != nil
	cl.by, _ = ctx.Deadline()
	cl.encode = func(b []byte) []byte {
		b = append(b, "gets"...)
		for _, k := range keys {
			b = append(b, ' ')
			b = append(b, k...)
		}
		return append(b, "\r\n"...)
	}
	if err := cn.send(cl); err != nil {
		c.release(cl)
		return nil, err
	}
	return cl, nil
}

// Set stores an item.
func (c *Client) Set(it *memcache.Item) error { return c.store(op.Set, it) }

// Add stores an item only if its key is absent (memcache.ErrNotStored).
func (c *Client) Add(it *memcache.Item) error { return c.store(op.Add, it) }

// Replace stores an item only if its key is present (memcache.ErrNotStored).
func (c *Client) Replace(it *memcache.Item) error { return c.store(op.Replace, it) }

// Append adds the value after the stored one (memcache.ErrNotStored if
// absent).
func (c *Client) Append(it *memcache.Item) error { return c.store(op.Append, it) }

// Prepend adds the value before the stored one (memcache.ErrNotStored if
// absent).
func (c *Client) Prepend(it *memcache.Item) error { return c.store(op.Prepend, it) }

// CompareAndSwap stores an item only if it is unchanged since it.CasID was
// read (memcache.ErrCASConflict; memcache.ErrCacheMiss if gone).
func (c *Client) CompareAndSwap(it *memcache.Item) error { return c.store(op.CAS, it) }

func (c *Client) store(v op.Verb, it *memcache.Item) error {
	o := op.Op{Verb: v, Item: op.Item{Value: it.Value, Flags: it.Flags, Expiration: it.Expiration, CAS: it.CasID}}
	_, _, err := c.Do(context.Background(), o, it.Key)
	return err
}

// Delete removes an item; memcache.ErrCacheMiss if it was not there.
func (c *Client) Delete(key string) error {
	_, _, err := c.Do(context.Background(), op.Op{Verb: op.Delete}, key)
	return err
}

// Touch sets a new expiration; memcache.ErrCacheMiss if the item is gone.
func (c *Client) Touch(key string, seconds int32) error {
	_, _, err := c.Do(context.Background(), op.Op{Verb: op.Touch, Item: op.Item{Expiration: seconds}}, key)
	return err
}

// Increment adds delta to a decimal value and returns the result.
func (c *Client) Increment(key string, delta uint64) (uint64, error) {
	_, n, err := c.Do(context.Background(), op.Op{Verb: op.Incr, Delta: delta}, key)
	return n, err
}

// Decrement subtracts delta from a decimal value (stopping at zero) and
// returns the result.
func (c *Client) Decrement(key string, delta uint64) (uint64, error) {
	_, n, err := c.Do(context.Background(), op.Op{Verb: op.Decr, Delta: delta}, key)
	return n, err
}
