//go:build linux && (amd64 || arm64 || 386 || arm || riscv64 || s390x || loong64)

package h1

import (
	"syscall"
	"unsafe"
)

// fionread is FIONREAD (SIOCINQ) in Linux's generic ioctl numbering,
// which these architectures use.
const fionread = 0x541B

// queued returns how many bytes the socket holds that have not been read
// (FIONREAD), 0 if it cannot tell: what a body read ahead may grow to at
// once, bytes the client has sent, instead of doubling towards them.
func (c *conn) queued() int {
	n := 0
	c.in.rc.Control(func(fd uintptr) {
		if q, ok := inq(fd); ok {
			n = q
		}
	})
	return n
}

// inq is ioctl(FIONREAD): the bytes a socket holds unread. A raw call,
// as in nowait_linux.go: it does not block.
func inq(fd uintptr) (int, bool) {
	var q int32
	_, _, errno := syscall.RawSyscall(syscall.SYS_IOCTL, fd, fionread, uintptr(unsafe.Pointer(&q)))
	return int(q), errno == 0
}
