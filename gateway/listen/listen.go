// Package listen opens the gateway's TCP listeners with what their
// accepted connections inherit (keep-alive probes, the send buffer) and
// when they are accepted (TCP_DEFER_ACCEPT), set once on the listening
// socket rather than on every connection, and says how many client
// connections the process's open-file limit leaves room for.
//
// cmd/memcgate listens with it, and so does the benchmark's floor of
// memcgate's own HTTP server (test/bench/cmd/h1const), so that the two
// accept connections alike.
package listen

import (
	"context"
	"math"
	"net"
	"syscall"
	"time"
)

// TCP keep-alive of accepted connections: Go's defaults (probes after
// 15 s idle, every 15 s, 9 of them), so that a client that vanished
// without a FIN is found out as Go would find it.
const (
	KeepAliveIdle     = 15 * time.Second
	KeepAliveInterval = 15 * time.Second
	KeepAliveCount    = 9
)

// TCP opens a TCP listener whose keep-alive options are set once, on the
// listening socket, and inherited by every connection it accepts (where
// the system does that): Go would otherwise set them on each accepted
// connection, four system calls per connection. So is the send buffer,
// if sndbuf > 0 (SO_SNDBUF; Linux only).
func TCP(ctx context.Context, addr string, sndbuf int) (net.Listener, error) {
	lc := net.ListenConfig{
		KeepAlive: -1, // set on the listener instead, where the system allows
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = SetOptions(int(fd), sndbuf) }); err != nil {
				return err
			}
			return serr
		},
	}
	if !inheritsKeepAlive {
		lc.KeepAliveConfig = net.KeepAliveConfig{Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount}
	}
	return lc.Listen(ctx, "tcp", addr)
}

// reserveMax bounds what ConnCap keeps of the open-file limit for the
// process's other descriptors: memcached connections (PIPELINE_CONNS
// and a probe per node, up to MAX_CONNS_PER_NODE without pipelining),
// the admin listener's clients, files. A quarter, but no more than
// reserveMax: a limit of 1024 leaves 768 client connections, one of
// 1048576 all but 4096.
const reserveMax = 4096

// ConnCap is the cap on client connections for the MAX_CLIENT_CONNS
// setting, given the open-file limit nofile (0: unknown or unlimited):
// the setting if positive, none (0) for -1, and for 0 nofile less a
// reserve for the process's other descriptors (a quarter of it, at most
// 4096).
func ConnCap(setting int, nofile uint64) int {
	switch {
	case setting > 0:
		return setting
	case setting < 0 || nofile == 0:
		return 0
	}
	return int(min(nofile-min(nofile/4, reserveMax), math.MaxInt32)) // RLIM_INFINITY too, on 32-bit
}
