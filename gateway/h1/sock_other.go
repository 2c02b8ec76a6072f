//go:build !linux

package h1

import "net"

// sock is, on Linux, a connection the Server accepted itself; elsewhere
// Serve accepts through net.Listener and there are none.
type sock struct{}

// dropsUncopied is false outside Linux: inbuf reads what it drops.
func (*sock) dropsUncopied() bool { return false }

func (*sock) writeBuffers(*net.Buffers) (int64, error) { panic("h1: no socks outside Linux") }

// newAccepter returns ln's own Accept: outside Linux, every listener's.
func newAccepter(ln net.Listener) accepter { return goAccepter{ln} }

// refuseNow closes rw, a connection over Server.MaxConns: outside Linux
// the Server has no socket it could answer without waiting.
func refuseNow(rw net.Conn, _ *sock, _ string) { rw.Close() }
