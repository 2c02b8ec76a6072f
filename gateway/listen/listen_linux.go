package listen

import (
	"fmt"
	"syscall"
)

// inheritsKeepAlive reports that the keep-alive options set on a
// listening socket carry over to the connections it accepts, as they do
// on Linux (the accepted socket is a copy of the listener's).
const inheritsKeepAlive = true

// deferAccept is TCP_DEFER_ACCEPT on the listening socket, in seconds:
// the kernel hands over a connection once its first bytes have come, so
// a client that sends its request right after connecting (ab, curl, PHP)
// is accepted with the request ready to read, and the gateway skips
// the empty read, the trip through the epoll set and the wake-up that a
// connection accepted before its bytes costs. One that stays silent is
// handed over anyway when the kernel resends its SYN-ACK (after about a
// second), and the header timeout counts from then on, as for any other.
// Measured in docs/benchmarks.md ("The cost of a new connection").
const deferAccept = 1

// SetOptions sets, on the listening socket fd, what its accepted
// connections inherit (keep-alive probes, and the send buffer if sndbuf
// > 0) and when they are accepted (TCP_DEFER_ACCEPT). TCP sets them on
// the sockets it opens; a socket passed by a service manager needs them
// set too.
func SetOptions(fd, sndbuf int) error {
	opts := []sockopt{
		{"SO_KEEPALIVE", syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(KeepAliveIdle.Seconds())},
		{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(KeepAliveInterval.Seconds())},
		{"TCP_KEEPCNT", syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, KeepAliveCount},
		{"TCP_DEFER_ACCEPT", syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, deferAccept},
	}
	if sndbuf > 0 {
		opts = append(opts, sockopt{"SO_SNDBUF", syscall.SOL_SOCKET, syscall.SO_SNDBUF, sndbuf})
	}
	for _, o := range opts {
		if err := syscall.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return fmt.Errorf("setsockopt %s: %w", o.name, err)
		}
	}
	return nil
}

// IPv6Only reports whether the socket fd is an IPv6 socket that takes no
// IPv4 connections (IPV6_V6ONLY); false for any other socket.
func IPv6Only(fd int) (bool, error) {
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return false, fmt.Errorf("getsockname: %w", err)
	}
	if _, ok := sa.(*syscall.SockaddrInet6); !ok {
		return false, nil
	}
	v, err := syscall.GetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY)
	if err != nil {
		return false, fmt.Errorf("getsockopt IPV6_V6ONLY: %w", err)
	}
	return v != 0, nil
}

// sockopt is one integer socket option.
type sockopt struct {
	name       string
	level, opt int
	v          int
}

// OpenFileLimit is the process's open-file limit (RLIMIT_NOFILE, whose
// soft value Go's runtime raises to the hard one at start), or 0 if it
// is unlimited or unknown.
func OpenFileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == ^uint64(0) {
		return 0
	}
	return rl.Cur
}
