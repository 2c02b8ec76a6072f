// Package slowreader dials TCP connections for tests that play a client
// reading slowly, with a receive buffer smaller than the kernel's default.
//
// The buffer is set before the handshake. Shrinking it on a connected
// socket leaves the window already offered to the server larger than the
// buffer: when the test reads late, the kernel drops segments that arrive
// within that window (nstat: TcpExtRcvPruned, TcpExtTCPRcvQDrop) and the
// server sends them again only after its retransmission timeout, 200 ms at
// least, so the test would measure a stall the client made.
package slowreader

import (
	"net"
	"os"
	"syscall"
	"testing"
)

// Dial connects to the TCP address addr with a receive buffer of rcvbuf
// bytes (the kernel doubles it for its bookkeeping) and closes the
// connection when the test ends.
func Dial(t testing.TB, addr string, rcvbuf int) *net.TCPConn {
	t.Helper()
	c, err := DialErr(addr, rcvbuf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// DialErr is Dial for callers outside the test's goroutine: it returns the
// error, and the caller closes the connection.
func DialErr(addr string, rcvbuf int) (*net.TCPConn, error) {
	d := Dialer(rcvbuf)
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// Dialer returns a dialer whose connections have a receive buffer of
// rcvbuf bytes, set before the handshake, for callers that dial many.
func Dialer(rcvbuf int) *net.Dialer {
	return &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
		}); err != nil {
			return err
		}
		return os.NewSyscallError("setsockopt", serr)
	}}
}
