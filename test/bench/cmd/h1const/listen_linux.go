package main

import (
	"fmt"
	"syscall"
)

// listenerKeepAlive: on Linux accepted sockets inherit the listener's options.
const listenerKeepAlive = true

const tcpDeferAccept = syscall.TCP_DEFER_ACCEPT

// setListenerOptions is cmd/memcgate's (listen_linux.go there): keep-alive
// probes, TCP_DEFER_ACCEPT of 1 s, and SO_SNDBUF if sndbuf > 0.
func setListenerOptions(fd, sndbuf int) error {
	opts := [][3]int{
		{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(keepAliveIdle.Seconds())},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(keepAliveInterval.Seconds())},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepAliveCount},
		{syscall.IPPROTO_TCP, tcpDeferAccept, 1},
	}
	if sndbuf > 0 {
		opts = append(opts, [3]int{syscall.SOL_SOCKET, syscall.SO_SNDBUF, sndbuf})
	}
	for _, o := range opts {
		if err := syscall.SetsockoptInt(fd, o[0], o[1], o[2]); err != nil {
			return fmt.Errorf("setsockopt %d/%d: %w", o[0], o[1], err)
		}
	}
	return nil
}
