//go:build !linux

package mcpipe

import "net"

// sockIO is, on Linux, a socket read and written with raw system calls;
// elsewhere connections are read and written through net.Conn.
type sockIO struct {
	wwait func(moved bool, held int)        // never called
	wlate func(drained bool, held int) bool // never called
}

func newSockIO(net.Conn) *sockIO { return nil }

func (*sockIO) read([]byte) (int, error)           { panic("mcpipe: no sockIO") }
func (*sockIO) readNow([]byte) (int, error)        { panic("mcpipe: no sockIO") }
func (*sockIO) writev(*net.Buffers) (int64, error) { panic("mcpipe: no sockIO") }
func (*sockIO) unsent() int                        { return -1 }
