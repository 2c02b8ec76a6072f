package sdlisten

import (
	"errors"
	"syscall"
)

// listening fails unless fd is a stream socket that listens
// (SO_ACCEPTCONN): a datagram socket (ListenDatagram=) or a connected
// one (Accept=yes) cannot serve HTTP.
func listening(fd int) error {
	typ, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE)
	if err != nil {
		return err
	}
	if typ != syscall.SOCK_STREAM {
		return errors.New("not a stream socket (ListenStream= in the socket unit)")
	}
	acc, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	if err != nil {
		return err
	}
	if acc != 1 {
		return errors.New("a socket that does not listen (Accept=no in the socket unit)")
	}
	return nil
}
