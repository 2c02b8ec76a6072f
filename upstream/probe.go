package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// maxProbes bounds the probes run at once, each a goroutine and a
// connection: by a health-check round (checkAll), and by SetServers for
// the nodes it adds (probeAdded). MEMCGATE_MAX_NODES allows 256 nodes,
// each with a UDP port too. A probe of a node that hangs ends within one
// Health.Timeout (two when the gateway came to its deadline late and it
// is sent again: roundTrip), so a node waits behind those that hang at
// most that per maxProbes of them.
const maxProbes = 64

// prober is what health checking needs from a node's probe client.
// *probeClient implements it. Each call returns when ctx ends.
type prober interface {
	Ping(ctx context.Context) error
	FlushAll(ctx context.Context) error
	Close() error
}

// probeClient is a node's health-check connection: never a data
// connection, so a probe never waits behind data. It keeps at most one
// idle connection between probes. A probe's dial and round trip share
// one deadline, timeout after it starts, and end when its context does
// (shutdown), the socket's deadline moved to the past. A kept
// connection that memcached closed (a restart, its idle timeout) is
// dialled again within that deadline, so that a node that is back
// passes. On each new connection the probe asks stats too, in the same
// write, for the process that answers there (restart.go). A probe that
// timed out at a deadline the gateway came to late is sent once more
// (roundTrip). A flush_all is never sent while one written before is
// unanswered (FlushAll). A version whose answer has not begun by its
// deadline leaves its connection owing that answer (pending), and the
// next probe reads it there before its own (Ping).
type probeClient struct {
	addr    string
	timeout time.Duration
	dial    func(ctx context.Context, network, address string) (net.Conn, error)
	// seen, if not nil, is given what the stats of each new connection
	// say about the memcached process (restart.go); nil asks no stats.
	seen func(instance)
	// late, if not nil, is called for each probe sent once more because
	// its first try timed out at a deadline the gateway came to late.
	late func()

	mu   sync.Mutex // guards idle, pending, pendingStats and unanswered; never held across I/O
	idle net.Conn   // the connection kept from the last probe; nil if none
	// pending is the connection a version was written on whose answer
	// had not begun by its probe's deadline: it owes that one answer,
	// and a stats reply after it if pendingStats. nil if none.
	pending      net.Conn
	pendingStats bool
	// unanswered is the connection a flush_all was written on whose
	// answer did not come: memcached may still run it, later than any
	// flush sent after it. nil if none.
	unanswered net.Conn

	// flushing serializes the flushes (a reload's left running and a
	// round's): none is written while another may be left unanswered.
	// Held across I/O, at most two timeouts per flush.
	flushing sync.Mutex
}

// probeLineMax bounds an answer's line: memcached's VERSION and OK are
// a few dozen bytes.
const probeLineMax = 256

// errProbeCut says a probe's context ended before its answer came.
var errProbeCut = errors.New("probe cut short")

// errProbeSlow says a probe's own answer did not come by its deadline,
// but the late answer to the probe before it did: memcached answers,
// later than the timeout (a loaded event loop), and is not gone. It
// wraps the timeout. Health does not count it toward Fall on a node in
// service, nor toward Rise on one out of it (probeResult).
var errProbeSlow = errors.New("probe slow: memcached answered the probe before it late, and not this one in time")

// Ping sends memcached's version command and waits for its answer. A
// version whose answer has not begun by the deadline leaves its
// connection kept, owing that one answer (pending), not closed; the next
// Ping writes its own version there and reads both answers within its
// own deadline: its own in time passes; only the earlier one in time is
// errProbeSlow, and the connection owes this one's answer instead;
// neither fails, and the connection is closed (never more than one
// answer owed), so that a hung memcached fails as many probes in a row
// as it did with a new connection each (decision 0095).
func (p *probeClient) Ping(ctx context.Context) error {
	return p.roundTrip(ctx, "version", false, func(line []byte) bool { return bytes.HasPrefix(line, []byte("VERSION ")) })
}

// FlushAll sends flush_all and waits for memcached's OK. A flush_all
// is not idempotent in time: run after writes, it empties them. So one
// written whose answer did not come (memcached stopped, or the gateway
// late to its deadline) is not sent again on another connection, where
// memcached could answer the second before it runs the first, and run
// the first after the node serves again. Its connection is kept
// (unanswered), and each flush first reads on it (settle): its answer
// (whatever the line), or memcached closing it, says that it ran or
// never will, and a new flush_all goes out; no answer fails the flush,
// and the node it was for stays down. A flush whose first try the
// gateway came to late reads on the same connection for its second
// (roundTrip), and sends a new flush_all only once the first answered
// (decision 0090).
func (p *probeClient) FlushAll(ctx context.Context) error {
	p.flushing.Lock()
	defer p.flushing.Unlock()
	return p.roundTrip(ctx, "flush_all", true, func(line []byte) bool { return string(line) == "OK\r\n" })
}

// Close closes the idle connection, and the one of a flush_all left
// unanswered; a probe in flight closes its own when it ends. The client
// may be used again.
func (p *probeClient) Close() error {
	p.mu.Lock()
	c, u, w := p.idle, p.unanswered, p.pending
	p.idle, p.unanswered, p.pending = nil, nil, nil
	p.mu.Unlock()
	var err error
	for _, c := range []net.Conn{c, u, w} {
		if c != nil {
			err = errors.Join(err, c.Close())
		}
	}
	return err
}

// roundTrip sends cmd and reads one line, which ok judges (try), and
// tries once more, with a timeout of its own, if the first try timed out
// at a deadline the gateway came to a quarter of the timeout or more
// after it passed: the gateway, not memcached, was not running (a
// process stopped or starved of CPU, a container throttled), and
// memcached had less time to answer than it was given, as the data
// path's reader forgives such a deadline (mcpipe's overdue, decisions
// 0069 and 0087). A second try that times out late too is the probe's
// failure: a gateway starved for good still fails a memcached that
// stopped with it. The errors are those of the socket
// (*net.OpError, os.ErrDeadlineExceeded, io.EOF) or an unexpected line
// worded as gomemcache words it, which classify tells apart. With
// once (flush_all), a command written and not answered is never sent
// again until its answer came (FlushAll): the second try reads on for
// it first.
func (p *probeClient) roundTrip(ctx context.Context, cmd string, once bool, ok func(line []byte) bool) error {
	late, err := p.try(ctx, cmd, once, ok)
	if late {
		if p.late != nil {
			p.late()
		}
		_, err = p.try(ctx, cmd, once, ok)
	}
	return err
}

// try sends cmd on the idle connection or a new one and reads one line,
// which ok judges, within one timeout. It reports whether it failed by
// that timeout at a deadline seen a quarter of the timeout or more after
// it passed. A kept connection memcached had closed before cmd was
// answered is dialled again once, within the same deadline: a memcached
// restarted since the last probe answers on a new connection, and
// counts as the node it is, up, rather than as one failed probe. With
// once, the answer to the command left unanswered before is read first
// (settle), and cmd is not sent if it does not come.
func (p *probeClient) try(ctx context.Context, cmd string, once bool, ok func(line []byte) bool) (late bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if once {
		if late, err := p.settle(ctx); err != nil {
			return late, err
		}
	}
	p.mu.Lock()
	c, owed := p.idle, answerOwed{}
	if !once && p.pending != nil {
		c, owed = p.pending, answerOwed{yes: true, stats: p.pendingStats}
		p.pending = nil
	} else {
		p.idle = nil
	}
	p.mu.Unlock()
	if c != nil {
		line, seen, err := p.send(ctx, c, cmd, false, once, owed, ok)
		if !closedByPeer(ctx, line, err) {
			return err != nil && timedOut(err) && p.lateAt(ctx, seen), judge(ctx, cmd, line, err, ok)
		}
	}
	c, err = p.dial(ctx, "tcp", p.addr)
	if err != nil {
		return timedOut(err) && p.lateAt(ctx, time.Now()), cutShort(ctx, err)
	}
	line, seen, err := p.send(ctx, c, cmd, p.seen != nil, once, answerOwed{}, ok)
	return err != nil && timedOut(err) && p.lateAt(ctx, seen), judge(ctx, cmd, line, err, ok)
}

// answerOwed is what a probe connection owes before the answer to the
// command written next: the answer to a version written before, if yes,
// and a stats reply after it if stats (it was a new connection).
type answerOwed struct{ yes, stats bool }

// lateAt reports whether seen, when a probe whose context is ctx saw its
// deadline pass (zero: it did not), is a quarter of the timeout or more
// after that deadline. A probe cut short is never late: it says nothing.
func (p *probeClient) lateAt(ctx context.Context, seen time.Time) bool {
	deadline, ok := ctx.Deadline()
	return ok && !seen.IsZero() && !cutShortBy(ctx) && seen.Sub(deadline) >= p.timeout/4
}

// timedOut reports whether err, a dial's or a socket's, is a deadline's.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// send sends cmd on c, a connection of the probe's, with stats after it
// if stats (a new connection), and reads cmd's line; it keeps c as the
// idle connection if its state is known, and closes it otherwise. What
// stats says goes to p.seen; a stats reply that does not come, or does
// not parse, fails nothing: the probe is cmd's. seen is when a read or
// the write first failed by the deadline; zero if none did. With once,
// a connection cmd was written on whose answer has not begun by the
// deadline (or a cut) is kept as p.unanswered instead of closed.
// Without once, c owes the answers owed says, read first and judged by
// ok; a connection cmd was written on whose answer has not begun by the
// deadline is kept as p.pending if it owed none, or if the one it owed
// came (then err wraps errProbeSlow), and closed otherwise.
func (p *probeClient) send(ctx context.Context, c net.Conn, cmd string, stats, once bool, owed answerOwed, ok func(line []byte) bool) (line []byte, seen time.Time, err error) {
	deadline, _ := ctx.Deadline()
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return nil, time.Time{}, err
	}
	// A context that ends otherwise than by its deadline (shutdown)
	// wakes the reads and writes at once; its deadline is the socket's
	// already, and is left to onTimeConn.
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			c.SetDeadline(time.Unix(1, 0))
		}
	})
	oc := &onTimeConn{Conn: c, ctx: ctx, timeout: p.timeout}
	x := exchange(oc, cmd, stats, owed, ok)
	stopped := stop()
	unanswered := x.written && len(x.line) == 0 && errors.Is(x.err, os.ErrDeadlineExceeded)
	switch {
	case once && unanswered:
		p.holdUnanswered(c)
	case !once && unanswered && !cutShortBy(ctx) && (!owed.yes || x.owedRead):
		// Memcached may yet answer: the next probe reads it here.
		p.holdPending(c, stats)
		if owed.yes {
			x.err = fmt.Errorf("%w: %w", errProbeSlow, x.err)
		}
	case !stopped && cutShortBy(ctx) || x.err != nil || x.buffered || stats && !x.statsRead:
		// Cut short, failed, or more than one answer came: the
		// connection is in no known state. One whose answer was read
		// past the deadline is kept: a probe that dials again when the
		// gateway is late may time out dialling a node that is up.
		c.Close()
	default:
		p.keep(c)
	}
	if x.instance.known() && x.err == nil {
		p.seen(x.instance)
	}
	return x.line, oc.seen, x.err
}

// settle reads, within ctx's deadline, the answer to the flush_all left
// unanswered (p.unanswered), if any, and reports whether a new one may
// be sent: err is nil once a line came (the command ran, whatever it
// said), or memcached closed the connection or it broke (what was
// unread there is never run). If nothing came by the deadline, or ctx
// was cut short, the connection is kept for the next flush, and late
// says whether the deadline was seen a quarter of the timeout or more
// after it passed (roundTrip's second try reads on). An answer in the
// socket at the deadline is read (onTimeConn). It first writes version
// on the connection, which memcached answers only after the flush_all:
// a host restarted meanwhile, its memcached gone without closing the
// connection, answers it with a reset, which settles the connection,
// where a read alone would wait on it for good.
func (p *probeClient) settle(ctx context.Context) (late bool, err error) {
	p.mu.Lock()
	c := p.unanswered
	p.unanswered = nil
	p.mu.Unlock()
	if c == nil {
		return false, nil
	}
	deadline, _ := ctx.Deadline()
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return false, nil // closed under it: nothing more comes on it
	}
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			c.SetDeadline(time.Unix(1, 0))
		}
	})
	oc := &onTimeConn{Conn: c, ctx: ctx, timeout: p.timeout}
	var line []byte
	_, rerr := oc.Write([]byte("version\r\n"))
	if rerr == nil {
		line, rerr = bufio.NewReaderSize(oc, probeLineMax).ReadSlice('\n')
	}
	stop()
	if len(line) == 0 && errors.Is(rerr, os.ErrDeadlineExceeded) {
		p.holdUnanswered(c)
		return p.lateAt(ctx, oc.seen), cutShort(ctx, fmt.Errorf("a flush_all sent before is unanswered, and is not sent again until memcached answers it: %w", rerr))
	}
	c.Close()
	return false, nil
}

// holdPending keeps c, a connection a version was written on whose
// answer (and a stats reply after it, if stats) has not begun, for the
// next Ping; one kept already (two probes of one node at once) is
// closed.
func (p *probeClient) holdPending(c net.Conn, stats bool) {
	p.mu.Lock()
	old := p.pending
	p.pending, p.pendingStats = c, stats
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// holdUnanswered keeps c, a connection a flush_all was written on and
// not answered, for settle. flushing is held: there is no other.
func (p *probeClient) holdUnanswered(c net.Conn) {
	p.mu.Lock()
	old := p.unanswered
	p.unanswered = c
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// judge is the outcome of a probe whose command's line is line, read
// with err.
func judge(ctx context.Context, cmd string, line []byte, err error, ok func(line []byte) bool) error {
	switch {
	case err != nil:
		return cutShort(ctx, err)
	case !ok(line):
		return fmt.Errorf("memcache: unexpected response line from %s: %q", cmd, line)
	}
	return nil
}

// closedByPeer reports whether a command on a kept connection failed
// with err because memcached had closed it before anything came back
// (end of file, reset, broken pipe), not for a timeout or a cut: the
// connection, not the node, is gone.
func closedByPeer(ctx context.Context, line []byte, err error) bool {
	return err != nil && len(line) == 0 && ctx.Err() == nil &&
		(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// cutShortBy reports whether ctx, a probe's, ended otherwise than by
// its own deadline.
func cutShortBy(ctx context.Context) bool {
	cause := context.Cause(ctx)
	return cause != nil && !errors.Is(cause, context.DeadlineExceeded)
}

// cutShort is err, a probe's, marked errProbeCut if the probe's context
// ended otherwise than by its own deadline: the error says nothing
// about the node.
func cutShort(ctx context.Context, err error) error {
	if cutShortBy(ctx) {
		return fmt.Errorf("%w: %w", errProbeCut, err)
	}
	return err
}

// exchanged is what exchange read.
type exchanged struct {
	line      []byte   // cmd's answer line; a copy when stats followed
	err       error    // of the write, or of reading line
	instance  instance // what the stats reply said; zero if none was read or it said nothing
	statsRead bool     // the stats reply was read to its end (END or an error line)
	buffered  bool     // more bytes came after the last answer read
	written   bool     // cmd's line was written whole: memcached may run it (a part of it it never runs)
	owedRead  bool     // the answers the connection owed were read (none owed: false)
}

// statsLinesMax bounds the lines of a probe's stats reply: memcached
// 1.6 sends about 90.
const statsLinesMax = 512

// exchange writes cmd, and stats after it in the same write if stats,
// and reads what the connection owed (owed), then cmd's line of at most
// probeLineMax bytes, then the stats reply, its lines as long at most.
// An owed answer that ok does not take is x.err: the connection is out
// of step.
func exchange(c net.Conn, cmd string, stats bool, owed answerOwed, ok func(line []byte) bool) (x exchanged) {
	req := cmd + "\r\n"
	if stats {
		req += "stats\r\n"
	}
	n, err := c.Write([]byte(req))
	x.written, x.err = n >= len(cmd)+2, err
	if err != nil {
		return x
	}
	br := bufio.NewReaderSize(c, probeLineMax)
	if owed.yes {
		line, err := br.ReadSlice('\n')
		switch {
		case err != nil:
			x.err = err
			return x
		case !ok(line):
			x.line, x.err = bytes.Clone(line), fmt.Errorf("answer owed by a probe connection: %q", line)
			return x
		}
		if owed.stats {
			x.instance, _ = readStats(br)
		}
		x.owedRead = true
	}
	if x.line, x.err = br.ReadSlice('\n'); x.err != nil {
		return x // what came of the line, if anything: closedByPeer tells
	}
	if stats {
		x.line = bytes.Clone(x.line) // the stats lines read next overwrite br's buffer
		x.instance, x.statsRead = readStats(br)
	}
	x.buffered = br.Buffered() > 0
	return x
}

// onTimeConn is a connection whose read, failed by its deadline while
// the answer waits in the socket unread, reads it with one more timeout:
// the answer came in time, and the gateway was late to read it (busy,
// starved of the processor), not the node (0061). A probe's or a HEAD's
// on gomemcache's pool (metaHead). One cut short (ctx ended otherwise
// than by its deadline) is not read on.
type onTimeConn struct {
	net.Conn
	ctx     context.Context
	timeout time.Duration
	seen    time.Time // when a read or write first failed by the deadline; zero: none did
}

func (c *onTimeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		c.saw()
		if !cutShortBy(c.ctx) && unreadBytes(c.Conn) > 0 && c.Conn.SetDeadline(time.Now().Add(c.timeout)) == nil {
			n, err = c.Conn.Read(p)
		}
	}
	return n, err
}

func (c *onTimeConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.saw()
	}
	return n, err
}

// saw records when the deadline was first seen passed.
func (c *onTimeConn) saw() {
	if c.seen.IsZero() {
		c.seen = time.Now()
	}
}

// keep makes c the idle connection, or closes it if there is one
// already (two probes of one node at once: a reload's and a round's).
func (p *probeClient) keep(c net.Conn) {
	p.mu.Lock()
	if p.idle == nil {
		p.idle, c = c, nil
	}
	p.mu.Unlock()
	if c != nil {
		c.Close()
	}
}
