package h1

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// readsAhead reports whether req's body is to be read whole before its
// handler runs: it is not all buffered yet, the connection can wait in
// the poller, and the handler takes that much (Server.BodyLimit).
func (c *conn) readsAhead(req *http.Request) bool {
	s := c.srv
	return s.BodyLimit != nil && c.canPark() && req.ContentLength > int64(c.in.Buffered()) &&
		req.ContentLength <= s.BodyLimit(req)
}

// awaitBody keeps a body read ahead from taking a buffer, and its part
// of the budget, until a first buffer's worth of it has come: aheadChunk,
// or the whole of a smaller body, read with the head or waiting in the
// socket. Until then the connection waits in the poller, what came with
// the head stashed in a slice of its own size and the rest left in the
// socket, so that a client that declares a body and sends nothing, or a
// few bytes, holds none of the budget: 4,096 such heads, holding 16 KiB
// each for the read timeout, took the whole 64 MiB default budget, and
// every other client's large body or value got 503. A body whose client
// expects 100 Continue gets it first, if the budget has room for its
// first buffer (else it comes when room does, in readAhead). goOn
// reports that readAhead goes on (the bytes came, the client's side ended
// or failed, the read timeout passed, the budget has no room for the 100
// Continue, or the poller is closing: readAhead reads what came and
// meets the rest as before); else readAhead returns req and res: the
// connection is parked, or the 100 Continue could not be written.
func (c *conn) awaitBody(b *body, cl int) (req *http.Request, res readResult, goOn bool) {
	s := c.srv
	first := min(cl, aheadChunk)
	for {
		c.in.unstash()
		if b.owe100 {
			if s.Budget != nil && s.Budget.Room() < int64(c.bufCap(first)) {
				return nil, readOK, true
			}
			b.owe100 = false
			if err := c.continue100(); err != nil {
				req, res = c.endAhead(b, err)
				return req, res, false
			}
		}
		c.in.tryFill() // what the socket holds, as far as the read buffer goes; an EOF shows here
		if c.in.Buffered()+c.queued() >= first || c.in.err != nil {
			return nil, readOK, true // readAhead reads it, and meets the error with what came
		}
		if dl := c.deadline(s.ReadTimeout); !dl.IsZero() && !time.Now().Before(dl) {
			return nil, readOK, true // readAhead reads what came, and ends the body there
		}
		c.in.stash()
		if c.readDL {
			c.setReadTimeout(0) // the poller keeps the deadline while parked
		}
		switch s.poller.parkBody(c, c.deadline(s.ReadTimeout), time.Time{}) {
		case parked:
			return nil, readParked, false
		case notParked:
			c.in.unstash()
			c.setDeadline(c.deadline(s.ReadTimeout))
			return nil, readOK, true // the poller is closing: readAhead waits in reads
		}
		// Readable: bytes came since the last look.
	}
}

// errBodyTimeout cuts short a body read ahead that is not whole by the
// read timeout. It wraps os.ErrDeadlineExceeded, a net.Error whose
// Timeout is true, so that a handler tells it as it tells a read from
// the connection that reached its deadline (the gateway answers 408).
var errBodyTimeout = fmt.Errorf("h1: request body not whole within the read timeout: %w", os.ErrDeadlineExceeded)

// aheadTurn is how much of a body a worker reads ahead before it lets the
// connections queued behind it go first.
const aheadTurn = 128 << 10

// aheadChunk is the first allocation for a body read ahead: it then
// doubles as the body's bytes come, so that memory follows what the
// client sent, not what its Content-Length says.
const aheadChunk = 16 << 10

// reserveAfter is how much of a body must have come (read, or waiting in
// the socket) before it is read into a buffer of its whole
// Content-Length, held against the budget at once: 16 KiB, and an eighth
// of the body. Before that its buffer doubles from aheadChunk as bytes
// come. A body that has proved it is coming either gets room for the
// rest or waits for it before more of it is read: growing a step at a
// time, bodies that together passed the budget each held part of it and
// were each refused halfway, all that reading lost; and each step copied
// what came before. The eighth bounds what a client that stops sending
// holds: eight times what it sent, where the doubling held twice, and
// only for bodyStall: one that has not sent half of itself by then gives
// back the rest (shrinkAhead).
func reserveAfter(cl int) int { return min(cl, max(aheadChunk, cl/8)) }

// bodyStall is how long a body held whole may take to send its first
// half before it counts as stopped: it then holds twice what it sent, as
// under the doubling, not eight times. A client on a link slower than
// half a body a second pays the doubling's copies; one that sent an
// eighth of many large bodies and stopped holds the budget for a second,
// not for the read timeout.
const bodyStall = time.Second

// bypassLine is the most a body may hold of the budget and still take it
// while others wait in the room line (first come first served for the
// rest): a small body is not held up behind a large one for the whole
// BudgetWait, and cannot hold the first in line up by much.
const bypassLine = 64 << 10

// readAhead reads c.ahead's body into c.abuf as it arrives, with the
// connection parked (up to the read timeout) while none is there, and
// returns the request once the body is whole. The bytes are held against
// Server.Budget; if it refuses them, the client stops early, or the body
// is not whole by the read timeout (errBodyTimeout), the handler gets
// the request with a body that fails with that error, and answers it.
func (c *conn) readAhead() (*http.Request, readResult) {
	s := c.srv
	req := c.ahead
	b := req.Body.(*body)
	cl := int(req.ContentLength)
	turn := 0        // bytes read from the socket since a worker took the connection
	lastTry := false // it waited BudgetWait in the room line: take room now or fail
	for len(c.abuf) < cl {
		if c.roomGaveUp {
			c.roomGaveUp, c.roomTurn, lastTry = false, true, true
		}
		if turn >= aheadTurn && s.poller.requeue(c) {
			// Others' turn: a large body arriving fast must not keep
			// the worker from connections queued behind it.
			return nil, readParked
		}
		if cap(c.abuf) == 0 {
			if req, res, goOn := c.awaitBody(b, cl); !goOn {
				return req, res
			}
		}
		if len(c.abuf) == cap(c.abuf) {
			// Twice the buffer, or all the client has sent if more:
			// what came with the head and what waits in the socket.
			sent := len(c.abuf) + c.in.Buffered() + c.queued()
			size := min(cl, max(2*cap(c.abuf), aheadChunk, sent))
			whole := sent >= reserveAfter(cl) && !c.aheadShrunk
			if whole {
				size = cl // held whole from here: read into one buffer
			}
			hold := c.bufCap(size)
			need := int64(hold) - c.aheld
			if !c.roomTurn && hold > bypassLine && s.poller.roomWaiting() && c.waitRoom(need, false) {
				return nil, readParked // behind the bodies waiting first
			}
			err := c.growAhead(size, !lastTry)
			if err == errNoRoomYet && c.waitRoom(need, c.roomTurn) {
				return nil, readParked
			}
			if err == errNoRoomYet {
				err = c.growAhead(size, false) // the budget's answer, counted as its refusal
			}
			c.roomTurn, c.roomSince = false, time.Time{}
			if err != nil {
				return c.endAhead(b, err)
			}
			if whole {
				c.aheldAt = time.Now()
			}
		}
		// The buffer may be larger than the body (Server.Buffers lends
		// whole classes): what follows the body is the next request's.
		room := c.abuf[len(c.abuf):min(cap(c.abuf), cl)]
		if k := c.in.Buffered(); k > 0 { // the body's start, read with the head
			k = min(k, len(room))
			c.abuf = append(c.abuf, c.in.bytes()[:k]...)
			c.in.Discard(k)
			continue
		}
		if b.owe100 {
			// The budget has room for the body's first bytes: its
			// client may be waiting for this before it sends them.
			b.owe100 = false
			if err := c.continue100(); err != nil {
				return c.endAhead(b, err)
			}
		}
		c.in.release()
		n, blocked, err := c.in.readNoWait(room)
		c.abuf = c.abuf[:len(c.abuf)+n]
		turn += n
		switch {
		case err == io.EOF:
			return c.endAhead(b, io.ErrUnexpectedEOF)
		case err != nil:
			return c.endAhead(b, err)
		case !blocked:
			continue
		}
		now := time.Now()
		if dl := c.deadline(s.ReadTimeout); !dl.IsZero() && !now.Before(dl) {
			return c.endAhead(b, errBodyTimeout) // parkBody's deadline, or passed before it
		}
		if at := c.stallAt(); !at.IsZero() && !now.Before(at) {
			c.shrinkAhead()
		}
		if c.readDL {
			c.setReadTimeout(0) // the poller keeps the deadline while parked
		}
		switch s.poller.parkBody(c, c.deadline(s.ReadTimeout), c.stallAt()) {
		case parked:
			return nil, readParked
		case notParked:
			// The poller is closing: wait in reads from here.
			c.setDeadline(c.deadline(s.ReadTimeout))
			n, err := c.in.Read(room)
			c.abuf = c.abuf[:len(c.abuf)+n]
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return c.endAhead(b, err)
			}
		}
	}
	return c.endAhead(b, nil)
}

// waitRoom parks c in the poller's room line until the budget has room
// for need more bytes for its body, first (by the order it first came
// in) if front: it had its turn and lost the room to another taker. It
// waits up to Server.BudgetWait from when it first came in, and no
// longer than the read timeout. It reports whether it parked c.
func (c *conn) waitRoom(need int64, front bool) bool {
	s := c.srv
	wait := s.budgetWaitNow()
	if s.Budget == nil || wait <= 0 || !c.canPark() {
		return false
	}
	now := time.Now()
	if c.roomSince.IsZero() {
		c.roomSince = now
	}
	deadline := c.roomSince.Add(wait)
	if rd := c.deadline(s.ReadTimeout); !rd.IsZero() && rd.Before(deadline) {
		deadline = rd
	}
	if !deadline.After(now) {
		return false
	}
	c.in.release()
	hadDL := c.readDL
	if hadDL {
		c.setReadTimeout(0) // the poller keeps the deadline while parked
	}
	if s.poller.waitRoom(c, s.Budget, need, deadline, front) != parked {
		if hadDL {
			c.setDeadline(c.deadline(s.ReadTimeout))
		}
		return false
	}
	return true
}

// stallAt is when c's body, held whole, counts as stopped if its first
// half has not come by then; zero if it cannot: not held whole, or half
// of it there.
func (c *conn) stallAt() time.Time {
	if c.aheldAt.IsZero() || 2*int64(len(c.abuf)) >= c.ahead.ContentLength {
		return time.Time{}
	}
	return c.aheldAt.Add(bodyStall)
}

// shrinkAhead gives back what c's body, held whole and stopped
// (bodyStall), holds beyond twice what it sent: from here its buffer
// doubles as its bytes come, and it is never held whole at once again.
func (c *conn) shrinkAhead() {
	s := c.srv
	c.aheldAt, c.aheadShrunk = time.Time{}, true
	size := max(2*len(c.abuf), aheadChunk)
	hold := c.bufCap(size)
	if hold >= cap(c.abuf) {
		return
	}
	c.moveAhead(size)
	if s.Budget != nil && c.aheld > int64(hold) {
		s.Budget.Release(c.aheld - int64(hold))
		c.aheld = int64(hold)
	}
}

// bufCap is the capacity of the buffer growAhead takes for size bytes.
func (c *conn) bufCap(size int) int {
	if s := c.srv; s.Buffers != nil {
		return s.Buffers.Cap(size)
	}
	return size
}

// errNoRoomYet is growAhead's answer, with look, when the budget has no
// room now: the body may wait for it, which is not a refusal.
var errNoRoomYet = errors.New("h1: no room in the budget yet")

// growAhead grows c.abuf to at least size bytes, holding them against
// the budget, and gives the buffer it outgrew back to Server.Buffers.
// The buffer's capacity is held before the buffer is taken, so that a
// body the budget refuses costs no allocation; when it refuses, nothing
// changes. With look, a lack of room is errNoRoomYet, found without
// asking (the budget counts what it refuses).
func (c *conn) growAhead(size int, look bool) error {
	s := c.srv
	hold := c.bufCap(size)
	if look && s.Budget != nil && int64(hold)-c.aheld > s.Budget.Room() {
		return errNoRoomYet
	}
	if err := c.holdAhead(hold); err != nil {
		if look {
			return errNoRoomYet // taken by another since Room said
		}
		return err
	}
	c.moveAhead(size)
	return nil
}

// moveAhead moves c.abuf into a buffer of size bytes, and gives the one
// it leaves back to Server.Buffers.
func (c *conn) moveAhead(size int) {
	var nb []byte
	if s := c.srv; s.Buffers != nil {
		nb = s.Buffers.Get(size)
	} else {
		nb = make([]byte, 0, size)
	}
	nb = append(nb, c.abuf...)
	c.putBuffer(c.abuf)
	c.abuf = nb
}

// holdAhead holds n bytes of Server.Budget for c.abuf in all, acquiring
// what c.aheld lacks; dropAhead gives them back.
func (c *conn) holdAhead(n int) error {
	more := int64(n) - c.aheld
	if c.srv.Budget == nil || more <= 0 {
		return nil
	}
	if err := c.srv.Budget.Acquire(more); err != nil {
		return err
	}
	c.aheld += more
	return nil
}

// putBuffer gives b back to Server.Buffers, if any.
func (c *conn) putBuffer(b []byte) {
	if s := c.srv; s.Buffers != nil && b != nil {
		s.Buffers.Put(b)
	}
}

// endAhead hands b the body read ahead, or the error that cut it short,
// and returns its request to serve. The body then reads from memory.
func (c *conn) endAhead(b *body, err error) (*http.Request, readResult) {
	req := c.ahead
	c.ahead, c.phase = nil, phaseIdle
	c.in.release()
	if c.readDL {
		c.setReadTimeout(0)
	}
	// After an error the connection's place in the stream is lost: the
	// body fails once its bytes are read, and the connection closes
	// after the response.
	b.ahead, b.err = c.abuf, err
	return req, readOK
}

// dropAhead lets go of a body read ahead and of its budget. With recycle
// the buffer goes back to Server.Buffers: only when nothing can read it
// any more (the body has read it all, or its request was never served).
func (c *conn) dropAhead(recycle bool) {
	if c.aheld > 0 {
		c.srv.Budget.Release(c.aheld)
		c.aheld = 0
	}
	if recycle {
		c.putBuffer(c.abuf)
	}
	c.abuf = nil
}

// continue100 writes "100 Continue", which a request that said "Expect:
// 100-continue" gets before its body is first read, as on net/http (RFC
// 9110 §10.1.1): its client may wait for it, a second or for good,
// before it sends the body. A body read ahead gets it once the budget
// has room for its first bytes, before its handler runs; one the handler
// reads, at its first read, unless the response has begun. A request
// whose body is not read gets none, and its connection closes after the
// response (response.commit). It waits for the client as a response
// does, up to the WriteTimeout; a write that fails is the connection's
// write error, which closes it after the response.
func (c *conn) continue100() error {
	if c.werr != nil {
		return c.werr
	}
	if d := c.srv.WriteTimeout; d > 0 {
		c.setWriteTimeout(time.Now().Add(d))
	}
	c.armWrite()
	if _, err := io.WriteString(c.rwc, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
		c.werr = err
	}
	return c.werr
}
