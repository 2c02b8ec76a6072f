//go:build linux && (amd64 || arm64 || 386 || arm || riscv64 || s390x || loong64)

package upstream

import (
	"syscall"
	"unsafe"
)

// fionread is FIONREAD (SIOCINQ) in Linux's generic ioctl numbering,
// which these architectures use.
const fionread = 0x541B

// unreadFD is ioctl(FIONREAD) on fd: the bytes its socket holds that
// nobody has read, 0 if the kernel does not say. A raw call: it does not
// block.
func unreadFD(fd uintptr) int {
	var q int32
	if _, _, errno := syscall.RawSyscall(syscall.SYS_IOCTL, fd, fionread, uintptr(unsafe.Pointer(&q))); errno != 0 {
		return 0
	}
	return int(q)
}
