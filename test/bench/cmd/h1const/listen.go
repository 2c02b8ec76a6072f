package main

import (
	"context"
	"math"
	"net"
	"syscall"
	"time"
)

// The keep-alive probes of accepted connections, as cmd/memcgate sets
// them (listen.go there): Go's defaults.
const (
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 15 * time.Second
	keepAliveCount    = 9
)

// listenTCP opens the listener as cmd/memcgate's listenTCP does: the
// keep-alive options, TCP_DEFER_ACCEPT and the send buffer set once on
// the listening socket where the system lets accepted connections
// inherit them, else Go's per-connection keep-alive.
func listenTCP(ctx context.Context, addr string, sndbuf int) (net.Listener, error) {
	lc := net.ListenConfig{
		KeepAlive: -1,
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = setListenerOptions(int(fd), sndbuf) }); err != nil {
				return err
			}
			return serr
		},
	}
	if !listenerKeepAlive {
		lc.KeepAliveConfig = net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount}
	}
	return lc.Listen(ctx, "tcp", addr)
}

// connCap is cmd/memcgate's cap on client connections for the
// MAX_CLIENT_CONNS setting (conncap.go there): the setting, or the
// open-file limit less a reserve of a quarter of it, at most 4096.
func connCap(setting int) int {
	const reserveMax = 4096
	var rl syscall.Rlimit
	switch {
	case setting > 0:
		return setting
	case setting < 0:
		return 0
	case syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) != nil || rl.Cur == math.MaxUint64:
		return 0
	}
	n := rl.Cur
	return int(min(n-min(n/4, reserveMax), math.MaxInt32))
}
