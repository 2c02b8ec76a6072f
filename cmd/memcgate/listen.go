package main

import (
	"context"
	"net"
	"syscall"
	"time"
)

// TCP keep-alive of accepted connections: Go's defaults (probes after
// 15 s idle, every 15 s, 9 of them), so that a client that vanished
// without a FIN is found out as before.
const (
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 15 * time.Second
	keepAliveCount    = 9
)

// listenTCP opens a TCP listener whose keep-alive options are set once,
// on the listening socket, and inherited by every connection it accepts
// (where the system does that): Go would otherwise set them on each
// accepted connection, four system calls per connection.
func listenTCP(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{
		KeepAlive: -1, // set on the listener instead, where the system allows
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = setListenerOptions(int(fd)) }); err != nil {
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
