package h1

import "syscall"

// On 386 socket calls go through socketcall(2), which package syscall
// makes for these: the scheduler sees them (see nowait_linux.go).

// peek is recv(2) of one byte with MSG_PEEK|MSG_DONTWAIT.
func peek(fd uintptr) (int, syscall.Errno) {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	errno, _ := err.(syscall.Errno)
	return n, errno
}

// accept4 is accept4(2) on a non-blocking listening socket, with the
// peer's address.
func accept4(fd int, flags int) (int, syscall.Sockaddr, error) {
	return syscall.Accept4(fd, flags)
}

// dropsTrunc is false on 386: socketcall's recvfrom, as package syscall
// makes it, takes no length without a buffer, so dropped bytes are read.
const dropsTrunc = false

// sysDrop is never called on 386 (dropsTrunc).
func sysDrop(uintptr, int) (int, error) { return 0, syscall.EINVAL }
