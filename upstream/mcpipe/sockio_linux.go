package mcpipe

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// sockIO reads and writes a connection's socket with read(2) and
// writev(2) on its descriptor, made with RawSyscall: the Go scheduler
// does not see them. A system call it sees wakes the runtime's sysmon
// thread when every processor was idle (a gateway between the pages of
// a PHP site), and sysmon then ticks every 20 µs until they are idle
// again; a call it sees running for more than about 20 µs makes it hand
// the processor to another thread. Neither helps a call on a
// non-blocking socket, which returns at once. Waits still go through
// Go's network poller (RawConn.Read and Write), with the connection's
// deadlines. gateway/h1 does the same on the client side
// (docs/decisions/0014).
//
// The reader's state is the read loop's and the writer's the writer's:
// one reader and one writer at a time, as conn has.
type sockIO struct {
	nc net.Conn // for the addresses in errors
	rc syscall.RawConn

	rp     []byte
	rn     int
	rerr   syscall.Errno
	rfn    func(fd uintptr) bool
	ragain bool             // readNow's: the socket held nothing
	nfn    func(fd uintptr) // readNow's

	wv    *net.Buffers
	wn    int64
	wmark int64 // wn when wwait was last called
	werr  syscall.Errno
	iov   [64]syscall.Iovec
	wfn   func(fd uintptr) bool
	wq    int // bytes the kernel held unacknowledged when the write last looked (waited, or saw its deadline pass); -1: not known
	wqNow int // wqfn's
	wqfn  func(fd uintptr)

	q   int // unsent's
	qfn func(fd uintptr)

	// wwait, if not nil, is called by writev each time the socket has no
	// room and the write must wait for it, with whether bytes moved
	// since the last call (or since writev began) and how many bytes the
	// kernel holds unacknowledged (unsent; -1: not known). It runs
	// before the wait, so a write deadline it sets bounds that wait:
	// conn moves its deadlines on progress there, and a write that never
	// waits costs nothing more.
	wwait func(moved bool, held int)

	// wlate, if not nil, is called by writev when its write deadline has
	// passed, with whether bytes left the kernel's send queue since the
	// write last looked (drained) and how many it holds now (-1: not
	// known); it reports whether the write goes on, the deadline moved.
	wlate func(drained bool, held int) bool
}

// rawMax is the most a read or write made with RawSyscall may move; a
// larger one is made with Syscall, which the scheduler sees, as gateway/h1
// does and for its reason: a long call must be able to give its processor
// to other clients.
const rawMax = 64 << 10

// newSockIO returns a sockIO for nc if it is a socket, a *net.TCPConn or
// *net.UnixConn, else nil: a TLS connection, or any other wrapper, is
// read and written through its own methods. (A wrapper that embeds a
// socket offers its SyscallConn too, but its Read and Write may do more
// than the socket's.)
func newSockIO(nc net.Conn) *sockIO {
	var sc syscall.Conn
	switch nc := nc.(type) {
	case *net.TCPConn:
		sc = nc
	case *net.UnixConn:
		sc = nc
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &sockIO{nc: nc, rc: rc}
	s.rfn, s.wfn, s.qfn = s.readFD, s.writeFD, s.unsentFD
	s.wqfn = func(fd uintptr) { s.wqNow = outq(fd) }
	s.nfn = func(fd uintptr) { s.ragain = !s.readFD(fd) }
	return s
}

// readNow reads into p what the socket holds now, without waiting and
// whatever its read deadline says: 0 and no error if it holds nothing.
// A read whose deadline has passed fails before it looks at the socket;
// readNow tells a reply that is there, its reader late for it, from one
// that never came.
func (s *sockIO) readNow(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.rp, s.rn, s.rerr, s.ragain = p, 0, 0, false
	err := s.rc.Control(s.nfn)
	s.rp = nil
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case s.ragain:
		return 0, nil
	case s.rerr != 0:
		return 0, s.opError("read", os.NewSyscallError("read", s.rerr))
	case s.rn == 0:
		return 0, io.EOF
	}
	return s.rn, nil
}

// read reads into p once, waiting for the socket to be readable; it
// returns io.EOF at the end of the stream.
func (s *sockIO) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.rp, s.rn, s.rerr = p, 0, 0
	err := s.rc.Read(s.rfn)
	s.rp = nil
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case s.rerr != 0:
		return 0, s.opError("read", os.NewSyscallError("read", s.rerr))
	case s.rn == 0:
		return 0, io.EOF
	}
	return s.rn, nil
}

func (s *sockIO) readFD(fd uintptr) bool {
	for {
		call := syscall.RawSyscall
		if len(s.rp) > rawMax {
			call = syscall.Syscall
		}
		n, _, errno := call(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&s.rp[0])), uintptr(len(s.rp)))
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case 0:
			s.rn = int(n)
		default:
			s.rerr = errno
		}
		return true
	}
}

// unsent returns how many bytes written to the socket the peer has not
// yet acknowledged (SIOCOUTQ, which is TIOCOUTQ), or -1 if the kernel
// does not say. Its callers hold their conn's mutex.
func (s *sockIO) unsent() int {
	s.q = -1
	s.rc.Control(s.qfn)
	return s.q
}

func (s *sockIO) unsentFD(fd uintptr) { s.q = outq(fd) }

// outq is how many bytes written to socket fd the peer has not yet
// acknowledged (TIOCOUTQ), or -1 if the kernel does not say.
func outq(fd uintptr) int {
	var q int32
	if _, _, errno := syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&q))); errno != 0 {
		return -1
	}
	return int(q)
}

// writev writes all of *v, consuming it, waiting for the socket to take
// it; it returns how much it wrote. A write deadline that passes while
// the write waits is put to wlate, which may move it: the write then
// goes on.
func (s *sockIO) writev(v *net.Buffers) (int64, error) {
	s.wv, s.wn, s.wmark, s.werr, s.wq = v, 0, 0, 0, -1
	err := s.rc.Write(s.wfn)
	for err != nil && s.wlate != nil && errors.Is(err, os.ErrDeadlineExceeded) && s.wlate(s.drained()) {
		err = s.rc.Write(s.wfn)
	}
	n, errno := s.wn, s.werr
	s.wv = nil
	switch {
	case err != nil:
		return n, s.opError("write", err)
	case errno != 0:
		return n, s.opError("write", os.NewSyscallError("writev", errno))
	}
	return n, nil
}

func (s *sockIO) writeFD(fd uintptr) bool {
	defer clear(s.iov[:]) // keep no value alive
	for v := s.wv; len(*v) > 0; {
		k, size := 0, 0
		for _, b := range *v {
			if k == len(s.iov) {
				break
			}
			if len(b) > 0 {
				s.iov[k].Base = &b[0]
				s.iov[k].SetLen(len(b))
				size += len(b)
				k++
			}
		}
		if k == 0 {
			*v = (*v)[:0]
			break
		}
		call := syscall.RawSyscall
		if size > rawMax {
			call = syscall.Syscall
		}
		n, _, errno := call(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(k))
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if s.wwait != nil {
				s.wq = outq(fd)
				s.wwait(s.wn > s.wmark, s.wq)
				s.wmark = s.wn
			}
			return false
		case 0:
		default:
			s.werr = errno
			return true
		}
		s.wn += int64(n)
		consume(v, int64(n))
	}
	return true
}

// drained reports whether bytes left the kernel's send queue since the
// write last looked (s.wq), and how many it holds now; this look is the
// next one's reference. The write's own: its callers hold no mutex.
func (s *sockIO) drained() (bool, int) {
	s.wqNow = -1
	s.rc.Control(s.wqfn)
	q, was := s.wqNow, s.wq
	if q >= 0 {
		s.wq = q
	}
	return q >= 0 && q < was, q
}

// consume drops the first n bytes of *v, setting the buffers it empties
// to nil.
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

// opError wraps err as net.Conn's methods do. An error of RawConn's
// Read or Write (a deadline, a closed connection) is unwrapped first: it
// says "raw-read" or "raw-write".
func (s *sockIO) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	oe := &net.OpError{Op: op, Addr: s.nc.RemoteAddr(), Err: err}
	if la := s.nc.LocalAddr(); la != nil {
		oe.Net, oe.Source = la.Network(), la
	}
	return oe
}
