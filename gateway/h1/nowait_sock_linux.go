//go:build linux && !386

package h1

import (
	"syscall"
	"unsafe"
)

// peek is recv(2) of one byte with MSG_PEEK|MSG_DONTWAIT.
func peek(fd uintptr) (int, syscall.Errno) {
	var b [1]byte
	n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return int(n), errno
}

// accept4 is accept4(2) on a non-blocking listening socket, with the
// peer's address.
func accept4(fd int, flags int) (int, syscall.Sockaddr, error) {
	var rsa syscall.RawSockaddrAny
	l := uint32(syscall.SizeofSockaddrAny)
	nfd, _, errno := syscall.RawSyscall6(syscall.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&l)), uintptr(flags), 0, 0)
	if errno != 0 {
		return -1, nil, errno
	}
	return int(nfd), sockaddr(&rsa), nil
}

// dropsTrunc reports that sysDrop can drop a socket's bytes uncopied.
const dropsTrunc = true

// sysDrop drops up to n bytes a non-blocking TCP socket holds to read,
// without copying them (recv with MSG_TRUNC), and returns how many.
func sysDrop(fd uintptr, n int) (int, error) {
	call := syscall.RawSyscall6
	if n > rawMax {
		call = syscall.Syscall6
	}
	m, _, errno := call(syscall.SYS_RECVFROM, fd, 0, uintptr(n), syscall.MSG_TRUNC|syscall.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(m), nil
}
