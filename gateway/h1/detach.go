package h1

import "syscall"

// Detached responses. A handler that waits on something that will call it
// back (the gateway's memcached replies) can Detach its response and
// return: the worker goes on to serve other connections, and whoever gets
// the result writes the response and calls finish. The connection serves
// nothing else until then.
//
// finish may run on a goroutine that must not wait, memcached's reply
// reader: it never blocks on the client. The response is written with
// non-blocking writes; what the socket does not take at once is copied
// and written by a goroutine of its own (a client that does not read
// holds that goroutine, not the caller of finish). Then the connection is
// parked for its next request, or queued for a worker if it has sent one.
//
// Two parties end a detached request: the handler's return on the
// connection's goroutine, and finish, in either order. c.pending counts
// them, and the last one moves the connection on (detachDone). Until both
// are done, the connection's goroutine touches nothing of the response,
// and finish nothing of the connection's reading side.

// Detach lets the handler finish the response after ServeHTTP returns,
// from any goroutine, and returns the function that does so. It returns
// nil, and the response stays an ordinary one, if it cannot be detached:
// the server parks no connections (not Linux), the request body was not
// read to its end, or the response was started (WriteHeader, Write or
// Flush). (Nor after the poller gave up on epoll: a detached connection
// could then not be queued again.)
//
// After a successful Detach the handler may go on using the ResponseWriter
// and the request, but must call finish exactly once, after its last use
// of them; finish completes the response as the handler's return would.
// If it is never called the connection is stuck until Close.
func (w *response) Detach() (finish func()) {
	c := w.c
	if c.srv.poller == nil || c.srv.poller.abandoned.Load() || c.in.rc == nil || w.wroteHeader || w.committed || c.werr != nil ||
		w.body != nil && !w.body.sawEOF || w.fullDuplex {
		return nil
	}
	if c.finishFn == nil {
		c.finishFn = c.finishDetached
	}
	c.detached = true
	c.nonBlocking, c.waitRefused = true, false
	c.pending.Store(2)
	return c.finishFn
}

// ReleaseRequest gives the request back to the server when it ends: the
// handler promises that neither it nor anything it started uses the
// *http.Request, its URL or its Header (maps and slices) after ServeHTTP
// has returned and, for a detached response, after finish was called.
// The server then reuses them for a later request, on any connection.
// The request's strings (its path, its header values) and its context
// are never reused: they may be kept. Without it the request stays with
// whoever holds it, as net/http's does. Call it from the handler, before
// the request ends.
func (w *response) ReleaseRequest() { w.c.rqBack = true }

// Block makes the writes of a detached response wait for the client from
// now on, as an ordinary response's do (up to the WriteTimeout), rather
// than copy what the socket does not take at once: for a response that
// is written on a goroutine of its own and is larger than memory should
// hold (the gateway streams values of many megabytes so). Call it after
// Detach, before the response is started; it does nothing otherwise.
func (w *response) Block() {
	if c := w.c; c.nonBlocking && !w.wroteHeader && len(c.spill) == 0 {
		c.nonBlocking = false
	}
}

// WaitIfRefused makes the writes of a detached response wait for the
// client, as an ordinary response's do (up to the WriteTimeout), from
// the moment Server.Budget refuses to hold what the socket does not take
// at once, where the response would otherwise be cut short and the
// connection closed: for a response written on a goroutine of its own,
// which may wait. Until then its writes do not wait, as without it. Call
// it after Detach; it does nothing otherwise.
func (w *response) WaitIfRefused() {
	if c := w.c; c.nonBlocking {
		c.waitRefused = true
	}
}

// finishDetached is Detach's finish.
func (c *conn) finishDetached() {
	c.w.finish()
	if len(c.spill) > 0 {
		go c.writeSpill()
		return
	}
	c.endDetached()
}

// writeSpill writes what the socket did not take at once, waiting for the
// client as an ordinary response does (up to the WriteTimeout).
func (c *conn) writeSpill() {
	if c.werr == nil {
		c.armWrite()
		if _, err := c.rwc.Write(c.spill); err != nil {
			c.werr = err
		}
	}
	c.dropSpill()
	c.endDetached()
}

// dropSpill lets go of the spill, written or failed, and of its budget.
func (c *conn) dropSpill() {
	if bs := c.srv.Buffers; bs != nil {
		bs.Put(c.spill) // nothing reads it now
	}
	c.spill = nil // it held a copy of a large or unread response: let it go
	if c.spilled > 0 {
		c.srv.Budget.Release(c.spilled)
		c.spilled = 0
	}
}

// endDetached ends finish's part of a detached request: the rest of what
// serveRequest does after the handler returned.
func (c *conn) endDetached() {
	w := &c.w
	c.nonBlocking, c.waitRefused = false, false
	c.reuse = w.reusable()
	w.forget()
	c.releaseOut()
	c.detachDone()
}

// detachDone is finish's end of a detached request. If the handler has
// returned too, it moves the connection on: closed if it cannot serve
// another request, else parked or queued for a worker. (If the handler returns
// last, its loop goes on with the connection itself.)
func (c *conn) detachDone() {
	if c.pending.Add(-1) != 0 {
		return
	}
	c.endRequest()
	s := c.srv
	if !c.reuse || !s.keepAlives() || c.state.Load() == stateClosed {
		c.close()
		c.finish()
		return
	}
	// Lift the deadlines its request armed, as parking does, or one
	// armed long ago would fire while a busy client's requests keep
	// arriving before a worker looks (which never parks them).
	if c.readDL {
		c.setReadTimeout(0)
	}
	// Idle from here on, for closeIdle; keep-alives are looked at again
	// after, as startRequest does, or a Close or SetKeepAlivesEnabled
	// (false) since the check above, which found the connection active,
	// would go unseen by a connection parked from here.
	if !c.state.CompareAndSwap(stateActive, stateIdle) || !s.keepAlives() {
		c.close()
		c.finish()
		return
	}
	// With nothing buffered it parks from here, as a worker would after
	// a read that found nothing: the client reads the response before
	// it sends again, so that read almost always would, and a worker
	// woken for it costs a thread wake-up and a system call per request.
	// Whatever the client sent since the request was read is an event
	// (poller.park), so a request already here is queued at once.
	if c.phase == phaseIdle && c.in.Buffered() == 0 && c.in.err == nil && s.poller.park(c) == parked {
		return
	}
	// Else a worker resumes it as a parked connection whose request came.
	if !s.poller.requeue(c) {
		c.close()
		c.finish()
	}
}

// flushNonBlocking is flush for a detached response: it writes what the
// socket takes now and keeps the rest in c.spill, in order.
func (c *conn) flushNonBlocking(bufs [][]byte) {
	if len(c.spill) == 0 {
		n, err := c.writeNow(bufs)
		if err != nil {
			c.werr = err
			return
		}
		for len(bufs) > 0 && n >= len(bufs[0]) {
			n -= len(bufs[0])
			bufs = bufs[1:]
		}
		if len(bufs) == 0 {
			return
		}
		bufs[0] = bufs[0][n:]
	}
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	if bg := c.srv.Budget; bg != nil {
		if err := bg.Acquire(int64(n)); err != nil {
			if c.waitRefused {
				c.writeWaiting(bufs)
				return
			}
			c.werr = err // the response is cut short: the connection closes
			return
		}
		c.spilled += int64(n)
	}
	if bs := c.srv.Buffers; bs != nil && cap(c.spill)-len(c.spill) < n {
		// In a buffer of the pool, given back once written: a GET of
		// a large value whose client reads slowly spills most of it,
		// and a fresh buffer each time was as much garbage as the
		// value's own buffer before it was pooled.
		nb := append(bs.Get(len(c.spill)+n), c.spill...)
		if c.spill != nil {
			bs.Put(c.spill)
		}
		c.spill = nb
	}
	for _, b := range bufs {
		c.spill = append(c.spill, b...)
	}
}

// writeWaiting writes the spill and then bufs, waiting for the client
// as an ordinary response does, and makes the response's later writes
// wait too: for a response that may wait (WaitIfRefused) whose rest the
// budget refused to hold.
func (c *conn) writeWaiting(bufs [][]byte) {
	c.nonBlocking = false
	c.armWrite()
	if len(c.spill) > 0 {
		if _, err := c.rwc.Write(c.spill); err != nil {
			c.werr = err
		}
		c.dropSpill()
	}
	if c.werr != nil {
		return
	}
	c.iov = append(c.iov[:0], bufs...)
	var err error
	if c.sk != nil {
		_, err = c.sk.writeBuffers(&c.iov)
	} else {
		_, err = c.iov.WriteTo(c.rwc)
	}
	if err != nil {
		c.werr = err
	}
}

// writeNow writes bufs with one writev that does not wait, and returns
// how much the socket took.
func (c *conn) writeNow(bufs [][]byte) (n int, err error) {
	k := 0
	for _, b := range bufs {
		if len(b) > 0 {
			c.wv.iov[k].Base = &b[0]
			c.wv.iov[k].SetLen(len(b))
			k++
		}
	}
	if k == 0 {
		return 0, nil
	}
	if c.wv.fn == nil {
		c.wv.fn = c.wv.write
	}
	c.wv.k = k
	cerr := c.in.rc.Write(c.wv.fn)
	n, err = c.wv.n, c.wv.err
	c.wv = writevState{fn: c.wv.fn} // let go of the buffers
	if err == nil {
		err = cerr
	}
	return n, err
}

// writevState is writeNow's, kept in the connection so that a write
// allocates nothing: the function given to RawConn.Write, made once, and
// its arguments and results.
type writevState struct {
	iov [3]syscall.Iovec
	k   int
	n   int
	err error
	fn  func(fd uintptr) bool
}

func (s *writevState) write(fd uintptr) bool {
	for {
		s.n, s.err = writev(fd, s.iov[:s.k])
		if s.err != syscall.EINTR {
			break
		}
	}
	if s.err == syscall.EAGAIN {
		s.n, s.err = 0, nil
	}
	return true // never wait: the rest is spilled
}
