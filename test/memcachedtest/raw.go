package memcachedtest

import (
	"bufio"
	"net"
	"testing"
)

// StartRaw starts a server on a free loopback port that serves each
// connection it accepts with serve, given the connection and a reader of
// what it sends, and closes the connection when serve returns: a node
// that lies, streams or is not memcached at all, for what Scripted's
// line-by-line answers cannot say. It runs until the test ends, and
// returns its address.
func StartRaw(t testing.TB, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	return ln.Addr().String()
}
