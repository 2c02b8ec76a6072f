package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// Claims holds the bytes gomemcache's pool (Options.PipelineConns 0) is
// about to allocate for values: gomemcache allocates the length a VALUE
// line claims, whole, before a byte of the value comes. The gateway's
// byte budget (*budget.Budget) is one. Acquire either holds n bytes or
// refuses them at once, holding nothing; Release gives back what it held.
type Claims interface {
	Acquire(n int64) error
	Release(n int64)
}

const (
	// maxItem is the largest value memcached can hold: its -I is at most
	// 1 GiB. A VALUE line that claims more is not memcached's.
	maxItem = 1 << 30
	// defaultUnheldClaim is Options.UnheldClaim when zero: mcpipe reads
	// up to 64 KiB before a value's bytes come (0045).
	defaultUnheldClaim = 64 << 10
)

var (
	// errClaimPastItem: a VALUE line claimed more than any memcached item
	// holds. It is the node's failure, as mcpipe's malformed replies are:
	// classify makes it a NodeError (502).
	errClaimPastItem = errors.New("upstream: malformed reply: a VALUE line claims more bytes than memcached's largest item (1 GiB)")
	// errUnasked: the node sent bytes past the end of a reply, before
	// the next request. The node's failure, as errClaimPastItem.
	errUnasked = errors.New("upstream: malformed reply: bytes came that no request asked for")
	// errClaimNoFit: Options.Claims refused a value's claimed length;
	// classify makes it ErrNoFit (503), as mcpipe's Room refusals.
	errClaimNoFit = errors.New("upstream: a value's claimed length does not fit the byte budget")
	// errReadLate: gomemcache's deadline for an operation passed while
	// the node's bytes for it waited in the socket unread, and the
	// deadline could not be renewed: the gateway was late to read them,
	// not the node. A timeout for the caller, but not the node's failure: it wraps
	// context.DeadlineExceeded, which passive health ignores (observe),
	// as mcpipe.ErrBehind does.
	errReadLate = fmt.Errorf("upstream: the deadline passed while the node's reply waited unread in the socket: %w", context.DeadlineExceeded)
)

// claimState is where in the reply stream the next byte of a claimConn is.
type claimState uint8

const (
	lineStart   claimState = iota // first byte of a line: "VALUE " is matched from here
	valuePrefix                   // within "VALUE ", matched so far
	valueFields                   // past "VALUE ": key, flags, size, cas
	otherLine                     // a line that is not a VALUE line, up to its '\n'
	dataBlock                     // a value's bytes and their CRLF
)

// claimConn is a connection of gomemcache's pool that reads its replies'
// framing as gomemcache is handed them: each VALUE line's claimed length
// is checked before gomemcache sees the line end (and so before it
// allocates the length): past maxItem the read fails with
// errClaimPastItem, and a claim that would take the reply's values read
// unheld past unheld bytes is held in claims, or the read fails with
// errClaimNoFit: a reply of one value is read unheld up to unheld bytes,
// and one of many (a multi-key get, the batch of parked Gets) reads no
// more than that unheld in all, whatever its number of keys. What is held is given back when the
// reply ends (its first line that is not a VALUE line: END, or an error)
// or when the connection closes; a request written while a reply is not
// yet read to its end fails (Write).
// gomemcache closes a connection whose read failed. A read its deadline
// failed while the reply's bytes wait in the socket reads them instead,
// with one more timeout: the gateway was late, not the node. A read or
// write that came to the deadline a quarter of the timeout or more late
// gets one more timeout too, once per deadline (lateGrace).
//
// It scans only the bytes of lines; a value's bytes are counted, not
// read, and no read allocates. gomemcache uses a connection from one
// goroutine at a time and closes it from that goroutine or once idle,
// so its fields need no lock.
type claimConn struct {
	net.Conn
	claims Claims    // nil: only maxItem bounds a claim
	share  *readHold // the node's share of claims (readshare.go), taken before them; nil: none
	unheld int64     // the most bytes of a reply's values not held in claims
	loose  int64     // bytes of the reply being read claimed and not held
	// timeout is gomemcache's (Options.Timeout): a read late past its
	// deadline with the reply in the socket gets it once more (Read).
	timeout time.Duration
	// by is the deadline gomemcache last set (SetDeadline), and graced
	// whether a read or write gave it one more timeout for coming to it
	// late (lateGrace).
	by     time.Time
	graced bool

	state claimState
	pos   int    // valuePrefix: bytes of "VALUE " matched; valueFields: spaces seen
	size  uint64 // the size field's digits so far
	sized bool   // the size field has a digit
	bad   bool   // the size field has a byte that is no digit: gomemcache fails the line
	skip  int64  // dataBlock: bytes still to come
	held  int64  // bytes held in claims for the reply being read
	err   error  // the failed read's, returned from then on
}

var valueLine = []byte("VALUE ")

func (c *claimConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	switch {
	case n != 0 || !errors.Is(err, os.ErrDeadlineExceeded):
	case c.unread() > 0:
		// Go fails a read past its deadline before it looks at the
		// socket: the bytes there came in time, and it is the gateway
		// that was late to read them. They are read, with one more
		// timeout from now: each time that is given, a byte or more
		// is read, so a reply ends within its length of them.
		// lateGrace counts lateness from this deadline on.
		if dl := time.Now().Add(c.timeout); c.timeout <= 0 || c.Conn.SetDeadline(dl) != nil {
			err = fmt.Errorf("%w (%w)", errReadLate, err)
		} else {
			c.by = dl
			n, err = c.Conn.Read(p)
		}
	case c.lateGrace():
		n, err = c.Conn.Read(p)
	}
	if ferr := c.scan(p[:n]); ferr != nil {
		c.err = ferr
		c.release()
		return 0, ferr
	}
	return n, err
}

// unread returns how many bytes the connection's socket holds that
// nobody has read (unreadBytes).
func (c *claimConn) unread() int { return unreadBytes(c.Conn) }

// unreadBytes returns how many bytes nc's socket holds that nobody has
// read, 0 if it cannot tell (a connection that is no socket of this
// process, as TLS's, whose records hide what is unread).
func unreadBytes(nc net.Conn) int {
	if cc, ok := nc.(*countedConn); ok {
		nc = cc.Conn
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	if rc.Control(func(fd uintptr) { n = unreadFD(fd) }) != nil {
		return 0
	}
	return n
}

// scan follows the reply framing through b, the bytes about to be handed
// to gomemcache, and fails on a VALUE line whose claim is past maxItem or
// refused by claims.
func (c *claimConn) scan(b []byte) error {
	for len(b) > 0 {
		switch c.state {
		case dataBlock:
			k := min(int64(len(b)), c.skip)
			b, c.skip = b[k:], c.skip-k
			if c.skip == 0 {
				c.state = lineStart
			}
			continue
		case otherLine:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				return nil
			}
			b = b[i+1:]
			c.state = lineStart
			c.release() // a line that is not a VALUE line ends the reply
			continue
		case lineStart:
			c.state, c.pos, c.size, c.sized, c.bad = valuePrefix, 0, 0, false, false
		}
		ch := b[0]
		b = b[1:]
		switch c.state {
		case valuePrefix:
			switch {
			case ch == valueLine[c.pos]:
				if c.pos++; c.pos == len(valueLine) {
					c.state, c.pos = valueFields, 0
				}
			case ch == '\n':
				c.state = lineStart
				c.release()
			default:
				c.state = otherLine
			}
		case valueFields:
			switch {
			case ch == '\n':
				c.state = lineStart
				if err := c.claim(); err != nil {
					return err
				}
			case ch == ' ':
				c.pos++
			case c.pos != 2 || ch == '\r':
				// the key, the flags, the cas, or the line's end:
				// gomemcache checks them
			case c.bad:
			case ch >= '0' && ch <= '9':
				c.sized = true
				if c.size = c.size*10 + uint64(ch-'0'); c.size > maxItem {
					return errClaimPastItem // a lie whatever follows
				}
			default:
				c.bad = true
			}
		}
	}
	return nil
}

// claim ends a VALUE line: the value's bytes and CRLF follow, and a claim
// that would take the reply's unheld values past unheld is held in
// claims.
func (c *claimConn) claim() error {
	if c.bad || !c.sized {
		return nil // gomemcache refuses the line and fails the reply
	}
	n := int64(c.size)
	c.state, c.skip = dataBlock, n+2
	if c.claims == nil {
		return nil
	}
	if c.loose+n <= c.unheld {
		c.loose += n
		return nil
	}
	if c.share != nil && !c.share.Take(int(n)) { // n is at most maxItem
		return fmt.Errorf("%w: %d bytes: the node's reads hold their share of it", errClaimNoFit, n)
	}
	if err := c.claims.Acquire(n); err != nil {
		if c.share != nil {
			c.share.Give(int(n))
		}
		return fmt.Errorf("%w: %d bytes: %w", errClaimNoFit, n, err)
	}
	c.held += n
	return nil
}

// release gives back what the reply being read holds, at its end.
func (c *claimConn) release() {
	c.loose = 0
	if c.held > 0 {
		c.claims.Release(c.held)
		if c.share != nil {
			c.share.Give(int(c.held))
		}
		c.held = 0
	}
}

// Write writes a request, once the reply before it was read: the
// stream is then at a line's start with nothing held. Else the node sent
// bytes no request asked for, which gomemcache keeps in its reader when
// it takes a reply for a cache error (a NOT_FOUND) and puts the
// connection back in its pool, and reads as the next request's reply: a
// VALUE line among them, its claim held and given back here, would be
// allocated unheld. The write fails with errUnasked instead, and
// gomemcache closes the connection.
func (c *claimConn) Write(p []byte) (int, error) {
	if c.err == nil && (c.state != lineStart || c.held > 0) {
		c.err = errUnasked
		c.release()
	}
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) && c.lateGrace() {
		m, merr := c.Conn.Write(p[n:])
		n, err = n+m, merr
	}
	return n, err
}

// SetDeadline is gomemcache's deadline for an operation, from its start.
func (c *claimConn) SetDeadline(t time.Time) error {
	c.by, c.graced = t, false
	return c.Conn.SetDeadline(t)
}

// lateGrace is called when a read or write failed by the deadline with
// nothing waiting to be read. If it came to the deadline a quarter of
// the timeout or more after it passed, the first time for this
// deadline, the gateway, not memcached, was not running (a process
// stopped or starved of CPU, a container throttled), and memcached had
// less time than it was given: the deadline moves to one timeout from
// now and lateGrace reports true, as mcpipe's reader and writer forgive
// such a deadline (0069) and probes are sent again (0087). Without it a
// pooled operation the gateway came to late failed with a timeout, held
// against the node (PASSIVE_FAILS).
func (c *claimConn) lateGrace() bool {
	if c.graced || c.timeout <= 0 || c.by.IsZero() || time.Since(c.by) < c.timeout/4 {
		return false
	}
	c.graced = true
	return c.Conn.SetDeadline(time.Now().Add(c.timeout)) == nil
}

// redialLate dials with dial under ctx, and once more under a timeout of
// its own if the dial timed out at ctx's deadline seen a quarter of
// timeout or more after it passed: the gateway was not running, as
// mcpipe's dialTimely forgives for pipelined connections (0085). For
// gomemcache's pool, whose dial gives ctx a deadline and nothing else.
func redialLate(ctx context.Context, timeout time.Duration, dial func(context.Context) (net.Conn, error)) (net.Conn, error) {
	c, err := dial(ctx)
	d, ok := ctx.Deadline()
	if err == nil || !ok || !timedOut(err) || time.Since(d) < timeout/4 || cutShortBy(ctx) {
		return c, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return dial(ctx)
}

func (c *claimConn) Close() error {
	c.release()
	return c.Conn.Close()
}
