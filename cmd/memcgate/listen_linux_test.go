package main

import (
	"net"
	"syscall"
	"testing"
)

// TestListenerKeepAlive checks that a connection accepted from listenTCP
// has the keep-alive probes Go would have set on it, set on the listener
// once instead.
func TestListenerKeepAlive(t *testing.T) {
	ln, err := listenTCP(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		level, opt int
		want       int
	}{
		{"SO_KEEPALIVE", syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(keepAliveIdle.Seconds())},
		{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(keepAliveInterval.Seconds())},
		{"TCP_KEEPCNT", syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepAliveCount},
		{"TCP_NODELAY", syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got int
			var gerr error
			if err := rc.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), tt.level, tt.opt) }); err != nil {
				t.Fatal(err)
			}
			if gerr != nil {
				t.Fatalf("getsockopt: %v", gerr)
			}
			if got != tt.want {
				t.Errorf("%s on the accepted connection = %d, want %d", tt.name, got, tt.want)
			}
		})
	}
}
