package h1

import "net"

// An accepter is how Serve takes connections from its listener, and the
// listener Serve closes.
type accepter interface {
	net.Listener
	// accept returns the next connection, and the same as a *sock if
	// the Server accepted it itself (nil otherwise).
	accept() (net.Conn, *sock, error)
}

// goAccepter accepts through net.Listener.Accept.
type goAccepter struct{ net.Listener }

func (a goAccepter) accept() (net.Conn, *sock, error) {
	c, err := a.Accept()
	return c, nil, err
}
