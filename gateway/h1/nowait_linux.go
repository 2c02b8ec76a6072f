package h1

import (
	"syscall"
	"unsafe"
)

// System calls on non-blocking descriptors, which return at once, made
// with RawSyscall: the Go scheduler does not see them (no entersyscall or
// exitsyscall). A call it sees wakes the runtime's sysmon thread if every
// processor was idle, as a gateway's are between the pages of a PHP site;
// sysmon then ticks every 20 µs (nanosleep) until they are idle again, and
// one it sees in a call for more than about 20 µs (a loopback write that
// also delivers, on a busy machine) makes it hand the processor to
// another thread. Neither does anything for a call that cannot block.
// Only calls bounded by what they move belong here: nothing that waits
// for a peer, a lock or the disk. upstream/mcpipe reads and writes
// memcached's sockets the same way; decisions/0014 has the measurements.

// rawReads reports that inbuf reads sockets with read(2) through their
// RawConn, waiting without a buffer.
const rawReads = true

// rawMax is the most a read or write made with RawSyscall may move. A
// larger one is made with Syscall, so that the scheduler sees it: it can
// take long enough for other clients to need the processor (sysmon hands
// it over past 20 µs, and the thread that takes it polls the network).
// With every large body read and value write out of its sight, a flood
// of 256 KiB asynchronous PUTs (the abuse suite's attack 5) slowed other
// clients' GETs (decisions/0014 has the figures).
const rawMax = 64 << 10

// sysRead is read(2) on a non-blocking socket.
func sysRead(fd uintptr, p []byte) (int, error) {
	call := syscall.RawSyscall
	if len(p) > rawMax {
		call = syscall.Syscall
	}
	n, _, errno := call(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// writev is writev(2) on a non-blocking socket.
func writev(fd uintptr, iov []syscall.Iovec) (int, error) {
	call := syscall.RawSyscall
	if iovLen(iov) > rawMax {
		call = syscall.Syscall
	}
	n, _, errno := call(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// iovLen is the bytes iov holds.
func iovLen(iov []syscall.Iovec) uint64 {
	var n uint64
	for i := range iov {
		n += uint64(iov[i].Len)
	}
	return n
}

// closeFD is close(2) of a socket without SO_LINGER, which does not wait
// (newAccepter leaves a listener with SO_LINGER, whose sockets inherit it,
// to Go's Accept).
func closeFD(fd int) { syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(fd), 0, 0) }

// epollPoll is epoll_wait(2) with a timeout of 0.
func epollPoll(epfd int, events []syscall.EpollEvent) (int, error) {
	n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// sockaddr is the address accept4 filled in, as syscall.Accept4 returns
// it.
func sockaddr(rsa *syscall.RawSockaddrAny) syscall.Sockaddr {
	switch rsa.Addr.Family {
	case syscall.AF_INET:
		pp := (*syscall.RawSockaddrInet4)(unsafe.Pointer(rsa))
		sa := &syscall.SockaddrInet4{Addr: pp.Addr}
		p := (*[2]byte)(unsafe.Pointer(&pp.Port))
		sa.Port = int(p[0])<<8 + int(p[1])
		return sa
	case syscall.AF_INET6:
		pp := (*syscall.RawSockaddrInet6)(unsafe.Pointer(rsa))
		sa := &syscall.SockaddrInet6{Addr: pp.Addr, ZoneId: pp.Scope_id}
		p := (*[2]byte)(unsafe.Pointer(&pp.Port))
		sa.Port = int(p[0])<<8 + int(p[1])
		return sa
	case syscall.AF_UNIX:
		pp := (*syscall.RawSockaddrUnix)(unsafe.Pointer(rsa))
		if pp.Path[0] == 0 {
			pp.Path[0] = '@' // abstract or unnamed, written as syscall does
		}
		n := 0
		for n < len(pp.Path) && pp.Path[n] != 0 {
			n++
		}
		b := unsafe.Slice((*byte)(unsafe.Pointer(&pp.Path[0])), n)
		return &syscall.SockaddrUnix{Name: string(b)}
	}
	return nil
}
