package h1

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// A sock is a client connection the Server accepted itself, with
// accept4(2) on the listening socket, rather than through net.Listener.
// Go's net package does, for every connection it accepts, four things
// the fast path does not need: it registers the socket with the
// runtime's network poller (and removes it at close), reads its local
// address (getsockname), sets TCP_NODELAY, and builds its netFD with a
// finalizer. On a connection that sends one request and closes, that was
// about a fifth of the gateway's CPU (docs/decisions/0013).
//
// A sock reads and writes with system calls that never wait. The first
// time an operation must wait (the client is slow to send or to read)
// the socket is handed to Go's network poller, as an *os.File of the
// same descriptor (os.NewFile registers a non-blocking descriptor), and
// that operation and every later one go through it, deadlines included;
// a fast client's connection never needs it. Deadlines set before then
// are kept and applied at that moment; until then an operation only
// compares its deadline with the clock, and fails once it has passed,
// whether or not it would wait, as on a *net.TCPConn.
//
// The descriptor is closed only when no operation uses it, so that a
// Close from another goroutine (Server.Close, a timeout) never lets an
// operation in progress reach a descriptor number the kernel has since
// given to another client. Such a Close shuts the socket down instead
// (shutdown(2), which also wakes an operation waiting in the poller);
// the last operation to end closes it.
//
// sock implements net.Conn, syscall.Conn and CloseWrite, with the errors
// of a *net.TCPConn (or *net.UnixConn): *net.OpError around the cause,
// net.ErrClosed after Close, os.ErrDeadlineExceeded for deadlines.
type sock struct {
	fd     int
	net    string   // "tcp" or "unix"
	lnAddr net.Addr // the listener's address
	raddr  net.Addr
	raw    sockRaw // SyscallConn's

	wmu sync.Mutex // serializes writeBuffers
	wv  sockWrite  // writeBuffers', under wmu

	mu       sync.Mutex
	laddr    net.Addr // LocalAddr's; nil until known
	refs     int      // operations using fd
	closed   bool     // Close was called
	gone     bool     // fd is closed
	file     *os.File // set once an operation had to wait
	frc      syscall.RawConn
	rdl, wdl time.Time // deadlines, for file
}

// dropsUncopied reports whether the kernel can drop what s holds to read
// without copying it out (recv with MSG_TRUNC): TCP can, Unix sockets
// cannot.
func (s *sock) dropsUncopied() bool { return dropsTrunc && s != nil && s.net == "tcp" }

// sockRaw is a sock's syscall.RawConn.
type sockRaw struct{ s *sock }

// newSock returns a sock for the accepted descriptor fd, whose peer's
// address is sa. laddr is the local address if the listener's tells it
// (nil for a wildcard address: LocalAddr asks the kernel on demand).
func newSock(fd int, network string, sa syscall.Sockaddr, lnAddr, laddr net.Addr) *sock {
	s := &sock{fd: fd, net: network, lnAddr: lnAddr, laddr: laddr, raddr: sockaddrAddr(sa)}
	s.raw.s = s
	return s
}

// sockaddrAddr is sa as net reports it.
func sockaddrAddr(sa syscall.Sockaddr) net.Addr {
	switch sa := sa.(type) {
	case *syscall.SockaddrInet4:
		return &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
	case *syscall.SockaddrInet6:
		a := &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
		if sa.ZoneId != 0 {
			if ifi, err := net.InterfaceByIndex(int(sa.ZoneId)); err == nil {
				a.Zone = ifi.Name
			}
		}
		return a
	case *syscall.SockaddrUnix:
		return &net.UnixAddr{Name: sa.Name, Net: "unix"}
	}
	return nil
}

// acquire takes fd for an operation, or fails once Close was called. It
// returns the socket's RawConn in Go's poller if an operation had to wait
// before (nil: use fd directly), and the deadline of the operation's
// direction (write: the write deadline, else the read deadline), which
// a caller that uses fd directly must look at itself.
func (s *sock) acquire(write bool) (rc syscall.RawConn, deadline time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, time.Time{}, net.ErrClosed
	}
	s.refs++
	if write {
		return s.frc, s.wdl, nil
	}
	return s.frc, s.rdl, nil
}

// release ends an operation acquire began, closing fd if Close was
// called meanwhile and this was the last one.
func (s *sock) release() {
	s.mu.Lock()
	s.refs--
	if s.refs == 0 && s.closed {
		s.destroyLocked()
	}
	s.mu.Unlock()
}

func (s *sock) destroyLocked() {
	if s.gone {
		return
	}
	s.gone = true
	if s.file != nil {
		s.file.Close() // removes it from Go's poller too
	} else {
		closeFD(s.fd)
	}
}

// toPoller hands the socket to Go's network poller, for an operation
// (which holds fd) that must wait, and returns its RawConn there.
func (s *sock) toPoller() (syscall.RawConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, net.ErrClosed
	}
	if s.frc != nil {
		return s.frc, nil
	}
	f := os.NewFile(uintptr(s.fd), "")
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	if !s.rdl.IsZero() {
		f.SetReadDeadline(s.rdl)
	}
	if !s.wdl.IsZero() {
		f.SetWriteDeadline(s.wdl)
	}
	s.file, s.frc = f, rc
	return rc, nil
}

// do runs fn on fd as RawConn.Read or Write does: again after waiting,
// in Go's poller, while it reports false. Like those, it fails with
// os.ErrDeadlineExceeded, without calling fn, once the deadline has
// passed, even if fn would not have waited: h1 (conn.setWriteTimeout)
// and net/http count on an expired deadline failing every later read or
// write, as on a *net.TCPConn.
func (s *sock) do(fn func(fd uintptr) bool, write bool) error {
	rc, deadline, err := s.acquire(write)
	if err != nil {
		return err
	}
	defer s.release()
	if rc == nil {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return os.ErrDeadlineExceeded // Go's poller checks it itself
		}
		if fn(uintptr(s.fd)) {
			return nil
		}
		if rc, err = s.toPoller(); err != nil {
			return err
		}
	}
	if write {
		err = rc.Write(fn)
	} else {
		err = rc.Read(fn)
	}
	if err != nil && s.isClosed() {
		err = net.ErrClosed // the file's own "use of closed file"
	}
	return err
}

func (s *sock) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Control implements syscall.RawConn.
func (r *sockRaw) Control(fn func(fd uintptr)) error {
	s := r.s
	if _, _, err := s.acquire(false); err != nil {
		return err
	}
	fn(uintptr(s.fd))
	s.release()
	return nil
}

// Read implements syscall.RawConn.
func (r *sockRaw) Read(fn func(fd uintptr) bool) error { return r.s.do(fn, false) }

// Write implements syscall.RawConn.
func (r *sockRaw) Write(fn func(fd uintptr) bool) error { return r.s.do(fn, true) }

// SyscallConn implements syscall.Conn.
func (s *sock) SyscallConn() (syscall.RawConn, error) { return &s.raw, nil }

// Read implements net.Conn.
func (s *sock) Read(b []byte) (int, error) {
	if len(b) == 0 {
		// As a *net.TCPConn's: no system call and no deadline, only
		// the error of a closed connection.
		if s.isClosed() {
			return 0, s.opError("read", net.ErrClosed)
		}
		return 0, nil
	}
	var n int
	var rerr error
	err := s.do(func(fd uintptr) bool {
		for {
			n, rerr = sysRead(fd, b)
			if rerr != syscall.EINTR {
				break
			}
		}
		return rerr != syscall.EAGAIN
	}, false)
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case rerr != nil:
		return 0, s.opError("read", os.NewSyscallError("read", rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write implements net.Conn: it writes all of b unless an error stops it.
func (s *sock) Write(b []byte) (int, error) {
	var iov [1][]byte
	iov[0] = b
	bufs := net.Buffers(iov[:])
	n, err := s.writeBuffers(&bufs)
	return int(n), err
}

// writeBuffers writes all of *v, with writev(2), unless an error stops
// it, consuming *v as net.Buffers.WriteTo does. Writes are serialized,
// as net.Conn's are.
func (s *sock) writeBuffers(v *net.Buffers) (int64, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	w := &s.wv
	if w.fn == nil {
		w.fn = w.write
	}
	w.v, w.total, w.err = v, 0, nil
	err := s.do(w.fn, true)
	total, werr := w.total, w.err
	w.v, w.err = nil, nil
	switch {
	case err != nil:
		return total, s.opError("write", err)
	case werr != nil:
		return total, s.opError("write", os.NewSyscallError("writev", werr))
	}
	return total, nil
}

// sockWrite is writeBuffers' state, kept in the sock so that a write
// allocates nothing: the function given to do, made once, and its
// arguments and results.
type sockWrite struct {
	v     *net.Buffers
	total int64
	err   error
	iov   [8]syscall.Iovec
	fn    func(fd uintptr) bool
}

func (w *sockWrite) write(fd uintptr) bool {
	for len(*w.v) > 0 {
		k := 0
		for _, b := range *w.v {
			if k == len(w.iov) {
				break
			}
			if len(b) > 0 {
				w.iov[k].Base = &b[0]
				w.iov[k].SetLen(len(b))
				k++
			}
		}
		if k == 0 {
			*w.v = (*w.v)[:0]
			break
		}
		n, err := writev(fd, w.iov[:k])
		w.iov = [8]syscall.Iovec{} // let go of the buffers
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return false
		}
		if err != nil {
			w.err = err
			break
		}
		w.total += int64(n)
		consume(w.v, int64(n))
	}
	return true
}

// consume drops the first n bytes of *v.
func consume(v *net.Buffers, n int64) {
	for len(*v) > 0 {
		l := int64(len((*v)[0]))
		if l > n {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= l
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}

// Close implements net.Conn. Called while an operation uses the socket,
// it shuts the socket down; the operation then fails or sees the end,
// and closes it as it ends.
func (s *sock) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.opError("close", net.ErrClosed)
	}
	s.closed = true
	if s.refs == 0 {
		s.destroyLocked()
	} else {
		syscall.Shutdown(s.fd, syscall.SHUT_RDWR)
	}
	return nil
}

// CloseWrite shuts down the writing side, as *net.TCPConn's does.
func (s *sock) CloseWrite() error {
	if _, _, err := s.acquire(true); err != nil {
		return s.opError("close", err)
	}
	defer s.release()
	if err := syscall.Shutdown(s.fd, syscall.SHUT_WR); err != nil {
		return s.opError("close", os.NewSyscallError("shutdown", err))
	}
	return nil
}

// LocalAddr implements net.Conn. Behind a listener on a wildcard address
// it asks the kernel, once.
func (s *sock) LocalAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.laddr == nil && !s.gone {
		if sa, err := syscall.Getsockname(s.fd); err == nil {
			s.laddr = sockaddrAddr(sa)
		}
	}
	if s.laddr == nil {
		return s.lnAddr
	}
	return s.laddr
}

// RemoteAddr implements net.Conn.
func (s *sock) RemoteAddr() net.Addr { return s.raddr }

// SetDeadline implements net.Conn.
func (s *sock) SetDeadline(t time.Time) error {
	if err := s.SetReadDeadline(t); err != nil {
		return err
	}
	return s.SetWriteDeadline(t)
}

// SetReadDeadline implements net.Conn.
func (s *sock) SetReadDeadline(t time.Time) error { return s.setDeadline(t, false) }

// SetWriteDeadline implements net.Conn.
func (s *sock) SetWriteDeadline(t time.Time) error { return s.setDeadline(t, true) }

func (s *sock) setDeadline(t time.Time, write bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.opError("set", net.ErrClosed)
	}
	if write {
		s.wdl = t
	} else {
		s.rdl = t
	}
	if s.file == nil {
		return nil
	}
	var err error
	if write {
		err = s.file.SetWriteDeadline(t)
	} else {
		err = s.file.SetReadDeadline(t)
	}
	if err != nil {
		return s.opError("set", err)
	}
	return nil
}

// opError wraps err as net.Conn's methods do. It does not ask the kernel
// for the local address (LocalAddr may, and may hold s.mu).
func (s *sock) opError(op string, err error) error {
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	oe := &net.OpError{Op: op, Net: s.net, Addr: s.raddr, Err: err}
	if s.lnAddr != nil {
		oe.Source = s.lnAddr
	}
	return oe
}

// refuseNow answers rw, a connection over Server.MaxConns, with answer
// and closes it, with system calls that never wait. What the client has
// sent is read first (4 KiB at most), so that the close ends the
// connection with a FIN: with unread bytes it would reset it, and a
// client may then lose the answer before reading it. A connection not
// accepted as a sock is only closed.
func refuseNow(rw net.Conn, sk *sock, answer string) {
	if sk != nil {
		sk.raw.Control(func(fd uintptr) {
			var buf [readBufSize]byte
			sysRead(fd, buf[:])
			syscall.Write(int(fd), []byte(answer))
		})
	}
	rw.Close()
}
