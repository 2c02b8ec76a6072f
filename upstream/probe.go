package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// maxProbes bounds the probes run at once, each a goroutine and a
// connection: by a health-check round (checkAll), and by SetServers for
// the nodes it adds (probeAdded). MEMCGATE_MAX_NODES allows 256 nodes,
// each with a UDP port too. A probe ends within one Health.Timeout, so
// a node waits behind those that hang at most one Health.Timeout per
// maxProbes of them.
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
// (shutdown), the socket's deadline moved to the past.
type probeClient struct {
	addr    string
	timeout time.Duration
	dial    func(ctx context.Context, network, address string) (net.Conn, error)

	mu   sync.Mutex // guards idle; never held across I/O
	idle net.Conn   // the connection kept from the last probe; nil if none
}

// probeLineMax bounds an answer's line: memcached's VERSION and OK are
// a few dozen bytes.
const probeLineMax = 256

// errProbeCut says a probe's context ended before its answer came.
var errProbeCut = errors.New("probe cut short")

// Ping sends memcached's version command and waits for its answer.
func (p *probeClient) Ping(ctx context.Context) error {
	return p.roundTrip(ctx, "version", func(line []byte) bool { return bytes.HasPrefix(line, []byte("VERSION ")) })
}

// FlushAll sends flush_all and waits for memcached's OK.
func (p *probeClient) FlushAll(ctx context.Context) error {
	return p.roundTrip(ctx, "flush_all", func(line []byte) bool { return string(line) == "OK\r\n" })
}

// Close closes the idle connection; a probe in flight closes its own
// when it ends. The client may be used again.
func (p *probeClient) Close() error {
	p.mu.Lock()
	c := p.idle
	p.idle = nil
	p.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Close()
}

// roundTrip sends cmd on the idle connection or a new one and reads
// one line, which ok judges. The errors are those of the socket
// (*net.OpError, os.ErrDeadlineExceeded, io.EOF) or an unexpected line
// worded as gomemcache words it, which classify tells apart.
func (p *probeClient) roundTrip(ctx context.Context, cmd string, ok func(line []byte) bool) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	p.mu.Lock()
	c := p.idle
	p.idle = nil
	p.mu.Unlock()
	if c == nil {
		var err error
		if c, err = p.dial(ctx, "tcp", p.addr); err != nil {
			return cutShort(ctx, err)
		}
	}
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return err
	}
	// A context that ends otherwise than by its deadline (shutdown)
	// wakes the reads and writes at once; its deadline is the socket's
	// already, and is left to onTimeConn.
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			c.SetDeadline(time.Unix(1, 0))
		}
	})
	line, buffered, err := exchange(&onTimeConn{Conn: c, ctx: ctx, timeout: p.timeout}, cmd)
	if !stop() && cutShortBy(ctx) || err != nil || buffered {
		// Cut short, failed, or more than one line came: the connection
		// is in no known state. One whose answer was read past the
		// deadline is kept: a probe that dials again when the gateway
		// is late may time out dialling a node that is up.
		c.Close()
	} else {
		p.keep(c)
	}
	switch {
	case err != nil:
		return cutShort(ctx, err)
	case !ok(line):
		return fmt.Errorf("memcache: unexpected response line from %s: %q", cmd, line)
	}
	return nil
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

// exchange writes cmd and reads one line of at most probeLineMax bytes.
// buffered reports whether more bytes came after it.
func exchange(c net.Conn, cmd string) (line []byte, buffered bool, err error) {
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return nil, false, err
	}
	br := bufio.NewReaderSize(c, probeLineMax)
	line, err = br.ReadSlice('\n')
	if err != nil {
		return nil, false, err
	}
	return line, br.Buffered() > 0, nil
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
}

func (c *onTimeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && !cutShortBy(c.ctx) &&
		unreadBytes(c.Conn) > 0 && c.Conn.SetDeadline(time.Now().Add(c.timeout)) == nil {
		n, err = c.Conn.Read(p)
	}
	return n, err
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
