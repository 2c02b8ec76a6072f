package h1

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
)

// inbuf is a connection's read buffer: the part of bufio.Reader that h1
// uses, plus one thing bufio.Reader cannot do: wait for data without
// holding a buffer. An empty inbuf gives its buffer back to the pool, and
// on a connection with a syscall.RawConn (TCP and Unix sockets) it waits
// inside the read itself, taking a buffer from the pool only when the
// socket has bytes for it. With thousands of keep-alive clients most
// connections are waiting for their next request at any moment; they
// then hold no buffer at all, where a bufio.Reader would pin 4 KiB each.
//
// Errors are those of net.Conn.Read; a read error is returned once, as
// bufio.Reader does. An inbuf is owned by its connection's goroutine.
type inbuf struct {
	pool pool            // of *[readBufSize]byte; a sync.Pool
	nc   net.Conn        // read with Read when rc is nil, and named in errors
	rc   syscall.RawConn // nil if nc offers none

	// buf is the pooled array arr, or a larger buffer of the
	// connection's own that grow made for a long request head; nil
	// while released.
	buf   []byte
	arr   *[readBufSize]byte // from pool; nil when buf is grown or released
	r, w  int                // buf[r:w] is buffered
	err   error              // a read error not yet returned
	saved []byte             // what stash kept of buf[r:w] while parked; nil otherwise

	// The raw read's target and result; rawRead is the method value
	// passed to rc.Read, made once so that a read allocates nothing.
	dst     []byte // nil: read into buf, taking it from the pool first
	n       int
	rerr    error
	noWait  bool // poll: report a read that would block instead of waiting
	blocked bool // the read would have blocked
	// drained: the last read found the socket empty (it would have
	// blocked, or returned less than it asked for), so what arrives from
	// then on is news to an edge-triggered poll; see poller.park.
	drained bool
	rawRead func(fd uintptr) bool
	// uncopied: the kernel drops what tryDrop drops without copying it
	// (sock.dropsUncopied); dropping: the raw read in progress is tryDrop's.
	uncopied, dropping bool
}

// dropMax is the most tryDrop drops with one call.
const dropMax = 1 << 20

// pool is the part of sync.Pool that inbuf uses.
type pool interface {
	Get() any
	Put(any)
}

func (b *inbuf) init(nc net.Conn, p pool) {
	b.nc, b.pool = nc, p
	if sc, ok := nc.(syscall.Conn); ok && rawReads {
		if rc, err := sc.SyscallConn(); err == nil {
			b.rc = rc
			b.rawRead = b.readFD
		}
	}
}

// Size is the buffer's size: the most that Peek can return.
func (b *inbuf) Size() int {
	if b.buf == nil {
		return readBufSize
	}
	return len(b.buf)
}

// grow makes the buffer at least n bytes long, and up to most if the
// allocation has room for more, keeping what is buffered. The larger
// buffer is allocated, not pooled (a request head longer than
// readBufSize is rare), and is dropped when the buffer is next released
// or freed, so that an idle connection never keeps it.
func (b *inbuf) grow(n, most int) {
	nb := slices.Grow([]byte(nil), n) // its capacity is the allocation's
	nb = nb[:min(cap(nb), max(n, most))]
	b.w = copy(nb, b.bytes())
	b.r = 0
	if b.arr != nil {
		b.pool.Put(b.arr)
		b.arr = nil
	}
	b.buf = nb
}

// Buffered is the number of bytes that can be read without a read call.
func (b *inbuf) Buffered() int { return b.w - b.r }

// bytes returns the buffered bytes, valid until the next call.
func (b *inbuf) bytes() []byte {
	if b.buf == nil {
		return nil
	}
	return b.buf[b.r:b.w]
}

// release gives the buffer back to the pool if it holds nothing.
func (b *inbuf) release() {
	if b.r == b.w {
		b.free()
	}
}

// free gives the buffer back to the pool, or drops a grown one, and
// drops what it holds.
func (b *inbuf) free() {
	b.saved = nil
	if b.arr != nil {
		b.pool.Put(b.arr)
	}
	b.buf, b.arr, b.r, b.w = nil, nil, 0, 0
}

// takeBytes returns what is buffered, in a slice that is the caller's
// from then on, and frees the buffer: a grown one is given as it is, the
// bytes of a pooled one are copied.
func (b *inbuf) takeBytes() []byte {
	p := b.bytes()
	if b.arr != nil {
		p = bytes.Clone(p)
	}
	b.free()
	return p
}

// stash moves what is buffered into a slice of its own size and gives the
// buffer back, so that a connection parked with part of a request head
// holds the bytes it sent, not a whole buffer. unstash puts them back.
// A grown buffer is the connection's own and at most a little larger
// than what it holds (see conn.growHead): it is kept as it is, which
// spares a copy of a long head each time a byte of it comes.
func (b *inbuf) stash() {
	if b.r == b.w || b.saved != nil || b.arr == nil {
		return
	}
	b.saved = append([]byte(nil), b.buf[b.r:b.w]...)
	b.pool.Put(b.arr)
	b.buf, b.arr, b.r, b.w = nil, nil, 0, 0
}

// unstash undoes stash.
func (b *inbuf) unstash() {
	if b.saved == nil {
		return
	}
	if b.buf == nil {
		b.take()
	}
	b.r, b.w = 0, copy(b.buf, b.saved)
	b.saved = nil
}

func (b *inbuf) take() {
	b.arr, _ = b.pool.Get().(*[readBufSize]byte)
	if b.arr == nil {
		b.arr = new([readBufSize]byte)
	}
	b.buf = b.arr[:]
}

// readErr returns the pending read error and clears it.
func (b *inbuf) readErr() error {
	err := b.err
	b.err = nil
	return err
}

// Peek returns the next n bytes without consuming them, reading as
// needed; with fewer it also returns why (the read error, or
// errBufferFull if n is more than Size).
func (b *inbuf) Peek(n int) ([]byte, error) {
	for b.w-b.r < n && b.w-b.r < b.Size() && b.err == nil {
		b.fill()
	}
	if n > b.Size() {
		return b.bytes(), errBufferFull
	}
	var err error
	if avail := b.w - b.r; avail < n {
		n = avail
		if err = b.readErr(); err == nil {
			err = errBufferFull
		}
	}
	if n == 0 {
		return nil, err
	}
	return b.buf[b.r : b.r+n], err
}

// Discard skips the next n bytes, reading as needed, and returns how
// many it skipped: fewer than n only with an error.
func (b *inbuf) Discard(n int) (int, error) {
	done := 0
	for {
		skip := min(b.w-b.r, n-done)
		b.r += skip
		done += skip
		if done == n {
			return done, nil
		}
		if b.err != nil {
			return done, b.readErr()
		}
		b.fill()
	}
}

// Read reads up to len(p) bytes: what is buffered, else what one read
// call returns (straight into p if p is at least as large as the buffer).
func (b *inbuf) Read(p []byte) (int, error) {
	if len(p) == 0 {
		if b.Buffered() > 0 {
			return 0, nil
		}
		return 0, b.readErr()
	}
	if b.r == b.w {
		if b.err != nil {
			return 0, b.readErr()
		}
		if len(p) >= readBufSize {
			n, err := b.read(p)
			return n, err
		}
		b.fill()
		if b.r == b.w {
			return 0, b.readErr()
		}
	}
	n := copy(p, b.buf[b.r:b.w])
	b.r += n
	return n, nil
}

// fill reads once into the buffer's free space, after moving what is
// buffered to its start; an error is kept for readErr.
func (b *inbuf) fill() {
	if b.r > 0 {
		copy(b.buf, b.buf[b.r:b.w])
		b.w -= b.r
		b.r = 0
	}
	if b.buf != nil && b.w == len(b.buf) {
		return
	}
	n, err := b.read(nil)
	b.w += n
	if err != nil {
		b.err = err
	}
}

// read reads once into p, or into the buffer's free space if p is nil,
// and waits until there is something to read. Reading into the buffer
// with nothing buffered, it holds no buffer while it waits.
func (b *inbuf) read(p []byte) (int, error) {
	if b.rc == nil {
		if p == nil {
			if b.buf == nil {
				b.take()
			}
			p = b.buf[b.w:]
		}
		return b.nc.Read(p)
	}
	b.dst, b.n, b.rerr = p, 0, nil
	if err := b.rc.Read(b.rawRead); err != nil {
		b.dst = nil
		return 0, b.opError(err)
	}
	b.dst = nil
	return b.n, b.rerr
}

// poll reads what the socket holds into an empty buffer, without
// waiting, and reports whether there was nothing (a read error is kept
// for the next call). Without a RawConn it reads nothing and reports
// false.
func (b *inbuf) poll() (empty bool) {
	if b.r != b.w {
		return false
	}
	return b.tryFill()
}

// tryFill reads once what the socket holds into the buffer's free space,
// without waiting, and reports whether the read would have blocked (a
// read error is kept for readErr). It reads nothing and reports false
// without a RawConn, with an error pending, or with a full buffer.
func (b *inbuf) tryFill() (blocked bool) {
	if b.rc == nil || b.err != nil || b.buf != nil && b.r == 0 && b.w == len(b.buf) {
		return false
	}
	b.noWait, b.blocked = true, false
	b.fill()
	b.noWait = false
	return b.blocked
}

// readNoWait reads once into p what the socket holds, without waiting,
// after what is buffered; blocked says the socket had nothing. Without a
// RawConn it reads as Read does.
func (b *inbuf) readNoWait(p []byte) (n int, blocked bool, err error) {
	if b.r != b.w || b.err != nil || b.rc == nil {
		n, err = b.Read(p)
		return n, false, err
	}
	b.noWait, b.blocked = true, false
	n, err = b.read(p)
	b.noWait = false
	return n, b.blocked, err
}

// tryDrop drops, without waiting, what the socket holds once nothing is
// buffered, and reports how many bytes it dropped and whether the socket
// had none (a read error is kept for readErr). Where the kernel cannot
// drop them uncopied it reads them into the buffer as tryFill does,
// reports 0, and the caller discards what is then buffered.
func (b *inbuf) tryDrop() (dropped int, blocked bool) {
	if !b.uncopied || b.r != b.w {
		return 0, b.tryFill()
	}
	if b.rc == nil || b.err != nil {
		return 0, false
	}
	b.release()
	b.dst, b.n, b.rerr = nil, 0, nil
	b.noWait, b.blocked, b.dropping = true, false, true
	err := b.rc.Read(b.rawRead)
	b.noWait, b.dropping = false, false
	switch {
	case err != nil:
		b.err = b.opError(err)
	case b.rerr != nil:
		b.err = b.rerr
	}
	return b.n, b.blocked
}

// readFD is the raw read: it reports false, to wait for the socket to
// become readable, when the read would block. For tryDrop (dropping) it
// drops up to dropMax bytes uncopied instead, with no buffer.
func (b *inbuf) readFD(fd uintptr) bool {
	var p []byte
	want, op := dropMax, "recvfrom"
	if !b.dropping {
		if p = b.dst; p == nil {
			if b.buf == nil {
				b.take()
			}
			p = b.buf[b.w:]
		}
		want, op = len(p), "read"
	}
	for {
		var n int
		var err error
		if b.dropping {
			n, err = sysDrop(fd, want)
		} else {
			n, err = sysRead(fd, p)
		}
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			b.release() // wait without a buffer if nothing is buffered
			b.blocked, b.drained = true, true
			return b.noWait
		case err != nil:
			b.rerr = b.opError(os.NewSyscallError(op, err))
		case n == 0:
			b.rerr = io.EOF
		default:
			// A stream socket's read stops short only on an empty queue.
			b.n, b.drained = n, n < want
		}
		return true
	}
}

// opError makes a read error look like net.Conn.Read's: an *net.OpError
// for "read" around the cause (RawConn.Read says "raw-read").
func (b *inbuf) opError(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	oe = &net.OpError{Op: "read", Err: err}
	if la := b.nc.LocalAddr(); la != nil {
		oe.Net, oe.Source = la.Network(), la
	}
	oe.Addr = b.nc.RemoteAddr()
	return oe
}

// errBufferFull is Peek's answer when more is asked than the buffer holds.
var errBufferFull = errors.New("h1: buffer full")
