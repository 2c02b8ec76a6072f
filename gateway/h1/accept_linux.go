package h1

import (
	"errors"
	"net"
	"os"
	"syscall"
	"time"
)

// newAccepter returns how Serve accepts from ln: with accept4(2) on its
// socket, into socks, for the two listeners whose sockets h1 knows how to
// serve that way (*net.TCPListener and *net.UnixListener); through
// ln.Accept for any other, or if the socket cannot be set up for it.
// docs/decisions/0013 says why.
func newAccepter(ln net.Listener) accepter {
	type fileListener interface {
		net.Listener
		syscall.Conn
		File() (*os.File, error)
	}
	var (
		fl      fileListener
		network string
	)
	switch l := ln.(type) {
	case *net.TCPListener:
		fl, network = l, "tcp"
	case *net.UnixListener:
		fl, network = l, "unix"
	default:
		return goAccepter{ln}
	}
	lnRC, err := fl.SyscallConn()
	if err != nil {
		return goAccepter{ln}
	}
	if network == "tcp" {
		// Linux copies the listening socket's options to the sockets it
		// accepts: set once here, TCP_NODELAY costs nothing per
		// connection (Go's Accept sets it on each). SO_LINGER carries
		// over too, and makes close(2) wait for unsent data, which a
		// sock's close (closeFD, a call the scheduler does not see) must
		// not: such a listener keeps Go's Accept. (The option's first
		// field, l_onoff, is what GetsockoptInt reads.)
		var serr error
		linger := 0
		if err := lnRC.Control(func(fd uintptr) {
			if linger, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER); serr == nil && linger == 0 {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
			}
		}); err != nil || serr != nil || linger != 0 {
			return goAccepter{ln}
		}
	}
	// A listener's RawConn cannot wait (its Read fails with EINVAL), so
	// the accepts wait on a duplicate of the socket, which File returns
	// non-blocking and in Go's poller.
	f, err := fl.File()
	if err != nil {
		return goAccepter{ln}
	}
	rc, err := f.SyscallConn()
	if err == nil {
		err = f.SetReadDeadline(time.Now().Add(lnCheck))
	}
	if err != nil {
		f.Close()
		return goAccepter{ln}
	}
	a := &rawAccepter{Listener: ln, lnRC: lnRC, file: f, rc: rc, net: network, lnAddr: ln.Addr()}
	a.fn, a.lnFn = a.wait, a.accept4
	switch addr := ln.Addr().(type) {
	case *net.TCPAddr:
		if !addr.IP.IsUnspecified() {
			a.laddr = addr // every connection's local address
		}
	case *net.UnixAddr:
		a.laddr = addr
	}
	return a
}

// lnCheck is how often a waiting rawAccepter looks whether its listener
// was closed by someone else than Serve's Close (the duplicate it waits
// on would keep the socket listening).
const lnCheck = time.Second

// rawAccepter accepts with accept4(2) on a listening socket, waiting in
// Go's network poller on a duplicate of it. Serve is its only caller,
// one call at a time. Close closes both.
type rawAccepter struct {
	net.Listener
	lnRC   syscall.RawConn // the listener's (Control only)
	file   *os.File        // the duplicate
	rc     syscall.RawConn // file's
	net    string
	lnAddr net.Addr
	laddr  net.Addr              // the local address of every connection; nil: each its own
	fn     func(fd uintptr) bool // a.wait, made once
	lnFn   func(fd uintptr)      // a.accept4, made once

	// accept4's results; done: it did not find the queue empty.
	nfd  int
	sa   syscall.Sockaddr
	err  error
	done bool
}

// Close closes the listener and the duplicate, ending a waiting accept.
func (a *rawAccepter) Close() error {
	err := a.Listener.Close() // first: the accept that ends sees it closed
	a.file.Close()
	return err
}

// wait is the function the accepts give the duplicate's RawConn.Read:
// it accepts on the listener's own descriptor, through its Control,
// which fails once the listener is closed, also by someone else than
// Serve. The duplicate keeps the socket listening until accept notices,
// and the kernel queues connections on it meanwhile; none is taken from
// a listener its owner closed.
func (a *rawAccepter) wait(uintptr) bool {
	a.done = false
	if err := a.lnRC.Control(a.lnFn); err != nil {
		a.err, a.done = net.ErrClosed, true
	}
	return a.done
}

func (a *rawAccepter) accept4(fd uintptr) {
	for {
		a.nfd, a.sa, a.err = accept4(int(fd), syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		switch a.err {
		case syscall.EINTR, syscall.ECONNABORTED: // as Go's Accept: the next one
			continue
		case syscall.EAGAIN:
			return
		}
		a.done = true
		return
	}
}

func (a *rawAccepter) accept() (net.Conn, *sock, error) {
	for {
		err := a.rc.Read(a.fn)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if a.lnRC.Control(func(uintptr) {}) != nil { // closed
				a.file.Close()
				err = net.ErrClosed
			} else if err = a.file.SetReadDeadline(time.Now().Add(lnCheck)); err == nil {
				continue
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrClosed) || a.lnRC.Control(func(uintptr) {}) != nil {
				err = net.ErrClosed
			}
			return nil, nil, &net.OpError{Op: "accept", Net: a.net, Addr: a.lnAddr, Err: err}
		}
		break
	}
	if a.err == net.ErrClosed {
		a.file.Close() // the socket stops listening
		return nil, nil, &net.OpError{Op: "accept", Net: a.net, Addr: a.lnAddr, Err: a.err}
	}
	if a.err != nil {
		return nil, nil, &net.OpError{Op: "accept", Net: a.net, Addr: a.lnAddr, Err: os.NewSyscallError("accept4", a.err)}
	}
	s := newSock(a.nfd, a.net, a.sa, a.lnAddr, a.laddr)
	a.sa = nil
	return s, s, nil
}
