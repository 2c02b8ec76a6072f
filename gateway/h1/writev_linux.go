package h1

import (
	"syscall"
	"unsafe"
)

// writev is writev(2) on a socket descriptor.
func writev(fd uintptr, iov []syscall.Iovec) (int, error) {
	n, _, errno := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
