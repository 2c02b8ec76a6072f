package main

import (
	"fmt"
	"syscall"
)

// listenerKeepAlive reports that the keep-alive options set on a
// listening socket carry over to the connections it accepts, as they do
// on Linux (the accepted socket is a copy of the listener's).
const listenerKeepAlive = true

// setListenerOptions sets, on the listening socket fd, what its accepted
// connections inherit: keep-alive probes.
func setListenerOptions(fd int) error {
	opts := []struct {
		name       string
		level, opt int
		v          int
	}{
		{"SO_KEEPALIVE", syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(keepAliveIdle.Seconds())},
		{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(keepAliveInterval.Seconds())},
		{"TCP_KEEPCNT", syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepAliveCount},
	}
	for _, o := range opts {
		if err := syscall.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return fmt.Errorf("setsockopt %s: %w", o.name, err)
		}
	}
	return nil
}
