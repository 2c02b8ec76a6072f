package listen

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// TestListenerKeepAlive checks that a connection accepted from TCP
// has the keep-alive probes Go would have set on it, set on the listener
// once instead, and the send buffer asked for (which Linux doubles for
// its bookkeeping).
func TestListenerKeepAlive(t *testing.T) {
	const sndbuf = 64 << 10
	ln, err := TCP(t.Context(), "127.0.0.1:0", sndbuf)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write([]byte("G")); err != nil { // accepted once bytes come (deferAccept)
		t.Fatal(err)
	}
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
		{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(KeepAliveIdle.Seconds())},
		{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(KeepAliveInterval.Seconds())},
		{"TCP_KEEPCNT", syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, KeepAliveCount},
		{"TCP_NODELAY", syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1},
		{"SO_SNDBUF", syscall.SOL_SOCKET, syscall.SO_SNDBUF, 2 * sndbuf},
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

// TestListenerDeferAccept checks when TCP hands over connections:
// one that has sent bytes with them ready to read, and one that stays
// silent too, after the kernel's SYN-ACK resend, so that the header
// timeout still ends it.
func TestListenerDeferAccept(t *testing.T) {
	tests := []struct {
		name string
		send string
	}{
		{"sends a request", "GET / HTTP/1.1\r\n\r\n"},
		{"silent", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := TCP(t.Context(), "127.0.0.1:0", 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			if _, err := client.Write([]byte(tt.send)); err != nil {
				t.Fatal(err)
			}
			// A silent connection is handed over after one SYN-ACK resend
			// (about 1 s, later on a loaded machine).
			ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
			conn, err := ln.Accept()
			if err != nil {
				t.Fatalf("Accept: %v, want the connection", err)
			}
			t.Cleanup(func() { conn.Close() })
			if tt.send == "" {
				return
			}
			conn.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			buf := make([]byte, len(tt.send))
			n, err := conn.Read(buf)
			if err != nil || string(buf[:n]) != tt.send {
				t.Errorf("first read = %q, %v; want %q ready at accept", buf[:n], err, tt.send)
			}
		})
	}
}
