package h1

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// acceptSock accepts one connection from ln with the Server's raw
// accepter, with client, the other end, dialled to it.
func acceptSock(t *testing.T, network, addr string) (s *sock, client net.Conn, acc accepter) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	acc = newAccepter(ln)
	if _, ok := acc.(*rawAccepter); !ok {
		t.Fatalf("newAccepter(%T) = %T, want *rawAccepter", ln, acc)
	}
	t.Cleanup(func() { acc.Close() })
	dialTo := ln.Addr().String()
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		dialTo = net.JoinHostPort("127.0.0.1", strconv.Itoa(ta.Port))
	}
	client, err = net.Dial(network, dialTo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, sk, err := acc.accept()
	if err != nil {
		t.Fatal(err)
	}
	if c != net.Conn(sk) {
		t.Fatalf("accept returned %v and sock %v", c, sk)
	}
	t.Cleanup(func() { sk.Close() })
	return sk, client, acc
}

// TestSockAddrs: the addresses a sock reports are those Go's own
// accepted connection would, on a named, a wildcard and a Unix address.
func TestSockAddrs(t *testing.T) {
	tests := []struct{ network, addr string }{
		{"tcp", "127.0.0.1:0"},
		{"tcp", ":0"}, // the local address comes from getsockname
		{"tcp", "[::1]:0"},
		{"unix", ""},
	}
	for _, tt := range tests {
		t.Run(tt.network+" "+tt.addr, func(t *testing.T) {
			addr := tt.addr
			if tt.network == "unix" {
				addr = t.TempDir() + "/s"
			}
			if strings.HasPrefix(addr, "[::1]") {
				if ln, err := net.Listen("tcp", addr); err != nil {
					t.Skipf("no IPv6 loopback: %v", err)
				} else {
					ln.Close()
				}
			}
			s, client, _ := acceptSock(t, tt.network, addr)
			if got, want := s.RemoteAddr().String(), client.LocalAddr().String(); tt.network == "tcp" && got != want {
				t.Errorf("RemoteAddr = %s, want %s", got, want)
			}
			if got, want := s.LocalAddr().String(), client.RemoteAddr().String(); got != want {
				t.Errorf("LocalAddr = %s, want %s", got, want)
			}
			if got := s.LocalAddr().Network(); got != tt.network {
				t.Errorf("LocalAddr().Network() = %s, want %s", got, tt.network)
			}
		})
	}
}

// TestSockUnixRemote: an unnamed Unix client's address reads as Go's
// own accept reports it.
func TestSockUnixRemote(t *testing.T) {
	ln, err := net.Listen("unix", t.TempDir()+"/go")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	s, _, _ := acceptSock(t, "unix", t.TempDir()+"/s")
	if got, want := s.RemoteAddr().String(), gc.RemoteAddr().String(); got != want {
		t.Errorf("RemoteAddr = %q, Go's accept says %q", got, want)
	}
}

// TestSockNoDelay: accepted TCP sockets have TCP_NODELAY, which the
// accepter sets on the listening socket only.
func TestSockNoDelay(t *testing.T) {
	s, _, _ := acceptSock(t, "tcp", "127.0.0.1:0")
	var v int
	var err error
	s.raw.Control(func(fd uintptr) { v, err = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY) })
	if err != nil || v == 0 {
		t.Fatalf("TCP_NODELAY = %d, %v; want on", v, err)
	}
}

// TestSockWaits: a read or write that must wait goes through Go's poller
// with the deadlines set before, and one that need not wait never
// registers the socket there.
func TestSockWaits(t *testing.T) {
	t.Run("read deadline set before", func(t *testing.T) {
		s, _, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if s.file != nil {
			t.Fatal("a deadline alone handed the socket to Go's poller")
		}
		start := time.Now()
		_, err := s.Read(make([]byte, 10))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read = %v, want a timeout", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Errorf("Read error %#v is not a *net.OpError for read", err)
		}
		if d := time.Since(start); d < 40*time.Millisecond || d > 2*time.Second {
			t.Errorf("Read waited %v, want about 50ms", d)
		}
	})
	t.Run("read that need not wait", func(t *testing.T) {
		s, client, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		client.Write([]byte("hello"))
		buf := make([]byte, 5)
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "hello" {
			t.Fatalf("Read = %q, %v", buf, err)
		}
	})
	t.Run("write to a slow reader", func(t *testing.T) {
		s, client, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		big := bytes.Repeat([]byte("x"), 8<<20) // far more than the socket buffers hold
		done := make(chan error, 1)
		go func() {
			bufs := net.Buffers{big[:100], big[100:]}
			n, err := s.writeBuffers(&bufs)
			if err == nil && n != int64(len(big)) {
				err = io.ErrShortWrite
			}
			done <- err
		}()
		time.Sleep(50 * time.Millisecond) // the write now waits
		n, err := io.Copy(io.Discard, io.LimitReader(client, int64(len(big))))
		if err != nil || n != int64(len(big)) {
			t.Fatalf("client read %d, %v", n, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("writeBuffers: %v", err)
		}
		if s.file == nil {
			t.Error("the write waited outside Go's poller")
		}
	})
	t.Run("write deadline", func(t *testing.T) {
		s, _, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		s.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := s.Write(bytes.Repeat([]byte("x"), 8<<20)) // nobody reads
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write = %v, want a timeout", err)
		}
	})
	t.Run("EOF", func(t *testing.T) {
		s, client, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		client.Close()
		if n, err := s.Read(make([]byte, 10)); n != 0 || err != io.EOF {
			t.Fatalf("Read = %d, %v; want io.EOF", n, err)
		}
	})
	t.Run("CloseWrite", func(t *testing.T) {
		s, client, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		if err := s.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := client.Read(make([]byte, 10)); n != 0 || err != io.EOF {
			t.Fatalf("client Read = %d, %v; want io.EOF", n, err)
		}
	})
}

// TestSockClose: a Close from another goroutine ends an operation
// waiting on the socket, and the descriptor stays open, shut down, until
// the operation using it ends, so that its number cannot go to another
// connection meanwhile.
func TestSockClose(t *testing.T) {
	t.Run("ends a waiting read", func(t *testing.T) {
		s, _, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		done := make(chan error, 1)
		go func() {
			_, err := s.Read(make([]byte, 10))
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("Read after Close succeeded")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not end a waiting Read")
		}
		if !s.gone {
			t.Error("the descriptor is still open after the last operation ended")
		}
		if _, err := s.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read after Close = %v, want net.ErrClosed", err)
		}
		if err := s.Close(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("second Close = %v, want net.ErrClosed", err)
		}
	})
	t.Run("while an operation holds the descriptor", func(t *testing.T) {
		s, client, _ := acceptSock(t, "tcp", "127.0.0.1:0")
		inside, resume := make(chan int), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- s.raw.Control(func(fd uintptr) {
				inside <- int(fd)
				<-resume
			})
		}()
		fd := <-inside
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// Still the same socket, shut down: its peer sees the end.
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			t.Fatalf("descriptor closed under an operation: %v", err)
		}
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := client.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("peer read = %v, want io.EOF after the shutdown", err)
		}
		close(resume)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !s.gone {
			t.Fatal("the last operation did not close the descriptor")
		}
	})
}

// serveOK serves "ok" on ln until the test ends; Serve's result comes
// on errc.
func serveOK(t *testing.T, ln net.Listener) (errc chan error) {
	s := &Server{
		Handler:  http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		Fallback: &http.Server{ErrorLog: quietLog()},
		ErrorLog: quietLog(),
	}
	errc = make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	t.Cleanup(func() { s.Close() })
	return errc
}

// TestServeAcceptsItself: the Server accepts TCP and Unix connections
// itself, and Serve ends when its listener is closed behind its back,
// as it does with net.Listener.Accept.
func TestServeAcceptsItself(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			ln := listen(t, network)
			errc := serveOK(t, ln)
			c, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := io.ReadAll(c)
			c.Close()
			if err != nil || !bytes.HasSuffix(resp, []byte("\r\n\r\nok")) {
				t.Fatalf("response %q, %v", resp, err)
			}
			ln.Close() // not through the Server
			select {
			case err := <-errc:
				if err == nil {
					t.Fatal("Serve returned nil")
				}
			case <-time.After(5 * lnCheck):
				t.Fatal("Serve goes on after its listener was closed")
			}
		})
	}
}

// rawConn is a connection with a RawConn: a *net.TCPConn or a sock.
type rawConn interface {
	net.Conn
	syscall.Conn
}

// TestSockExpiredDeadline: an operation whose deadline has passed fails
// with os.ErrDeadlineExceeded even when it would not wait (data to read,
// room to write), before and after the socket went to Go's poller, as on
// a *net.TCPConn, the reference. h1's WriteTimeout (conn.setWriteTimeout)
// and net/http's ReadTimeout and WriteTimeout, after a handover, count on
// it: a response whose handler took longer than WriteTimeout is not sent,
// and a body arriving faster than it is read is still cut by ReadTimeout.
func TestSockExpiredDeadline(t *testing.T) {
	conns := []struct {
		name string
		open func(t *testing.T) (server rawConn, client net.Conn)
	}{
		{"net.TCPConn", func(t *testing.T) (rawConn, net.Conn) {
			ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			server, err := ln.AcceptTCP()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { server.Close() })
			return server, client
		}},
		{"sock", func(t *testing.T) (rawConn, net.Conn) {
			s, client, _ := acceptSock(t, "tcp", "127.0.0.1:0")
			return s, client
		}},
		{"sock in Go's poller", func(t *testing.T) (rawConn, net.Conn) {
			s, client, _ := acceptSock(t, "tcp", "127.0.0.1:0")
			s.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := s.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Read = %v, want a timeout", err)
			}
			if s.file == nil {
				t.Fatal("a read that waited left the socket out of Go's poller")
			}
			s.SetReadDeadline(time.Time{})
			return s, client
		}},
	}
	past := time.Now().Add(-time.Second)
	ops := []struct {
		name       string
		do         func(server rawConn, client net.Conn) error
		noDeadline bool // succeeds whatever the deadline, as on a *net.TCPConn
	}{
		{"empty Read", func(server rawConn, client net.Conn) error {
			server.SetReadDeadline(past)
			_, err := server.Read(nil)
			return err
		}, true},
		{"Read", func(server rawConn, client net.Conn) error {
			client.Write([]byte("x"))
			time.Sleep(10 * time.Millisecond) // there to read
			server.SetReadDeadline(past)
			_, err := server.Read(make([]byte, 1))
			return err
		}, false},
		{"Write", func(server rawConn, client net.Conn) error {
			server.SetWriteDeadline(past)
			_, err := server.Write([]byte("x"))
			return err
		}, false},
		{"RawConn.Read", func(server rawConn, client net.Conn) error {
			client.Write([]byte("x"))
			time.Sleep(10 * time.Millisecond)
			server.SetReadDeadline(past)
			rc, err := server.SyscallConn()
			if err != nil {
				return err
			}
			return rc.Read(func(uintptr) bool { return true })
		}, false},
		{"RawConn.Write", func(server rawConn, client net.Conn) error {
			server.SetWriteDeadline(past)
			rc, err := server.SyscallConn()
			if err != nil {
				return err
			}
			return rc.Write(func(uintptr) bool { return true })
		}, false},
	}
	for _, c := range conns {
		for _, op := range ops {
			t.Run(c.name+"/"+op.name, func(t *testing.T) {
				server, client := c.open(t)
				err := op.do(server, client)
				if op.noDeadline {
					if err != nil {
						t.Fatalf("%s past its deadline = %v, want no error", op.name, err)
					}
					return
				}
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("%s past its deadline = %v, want os.ErrDeadlineExceeded", op.name, err)
				}
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("%s error %v is not a net.Error timeout", op.name, err)
				}
			})
		}
	}
}

// TestWriteTimeoutSlowHandler: a handler that takes longer than
// WriteTimeout gets no response out, as with net/http, even though the
// socket would take it at once.
func TestWriteTimeoutSlowHandler(t *testing.T) {
	const timeout = 50 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * timeout)
		io.WriteString(w, "late")
	})
	_, addr := startH1(t, h, func(s *Server) { s.WriteTimeout = timeout })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := io.ReadAll(c)
	if len(resp) > 0 {
		t.Errorf("got %q (%v), want the connection closed with no response", resp, err)
	}
}

// TestServeNoAcceptAfterListenerClose: once its listener is closed
// behind its back, Serve takes no more connections from it. The
// duplicate the accepts wait on keeps the socket listening until Serve
// notices, so the kernel still completes a client's handshake; that
// connection must end unserved, and Serve at once, as with
// net.Listener.Accept, rather than be served for up to lnCheck.
func TestServeNoAcceptAfterListenerClose(t *testing.T) {
	ln := listen(t, "tcp")
	errc := serveOK(t, ln)
	// One connection served first: Serve is waiting in its accept.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, err := io.ReadAll(c); err != nil || !bytes.HasSuffix(resp, []byte("ok")) {
		t.Fatalf("response %q, %v", resp, err)
	}
	c.Close()

	ln.Close() // not through the Server
	start := time.Now()
	c, err = net.Dial("tcp", ln.Addr().String())
	if err == nil { // the duplicate still listens
		defer c.Close()
		io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if resp, _ := io.ReadAll(c); len(resp) > 0 {
			t.Errorf("a connection made after the listener was closed was served: %q", resp)
		}
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve = %v, want net.ErrClosed", err)
		}
		if d := time.Since(start); d >= lnCheck {
			t.Errorf("Serve ended %v after the listener was closed, with a connection waiting; want at once", d)
		}
	case <-time.After(5 * lnCheck):
		t.Fatal("Serve goes on after its listener was closed")
	}
}

// TestAcceptLingerListener: the sockets of a TCP listener with SO_LINGER
// inherit it, and their close(2) then waits, up to the linger time, for
// what they have not sent yet. h1 closes its own sockets with a call the
// scheduler does not see (closeFD), which would hold a processor (and a
// stop-the-world) for that long, or have the wait cut short by the
// runtime's preemption signal: such a listener is accepted from by Go's
// Accept, and a Close of its connection waits as the option asks.
func TestAcceptLingerListener(t *testing.T) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptLinger(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 5})
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	acc := newAccepter(ln)
	defer acc.Close()
	if _, ok := acc.(*rawAccepter); ok {
		t.Error("a listener with SO_LINGER is accepted from with accept4")
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	client, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, _, err := acc.accept()
	if err != nil {
		t.Fatal(err)
	}
	// Fill both socket buffers: the client reads nothing yet.
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		b := make([]byte, 4096)
		for {
			if _, err := syscall.Write(int(fd), b); err != nil {
				return
			}
		}
	})
	const drainAfter = 200 * time.Millisecond
	go func() {
		time.Sleep(drainAfter)
		io.Copy(io.Discard, client)
	}()
	start := time.Now()
	c.Close()
	if took := time.Since(start); took < drainAfter/2 {
		t.Errorf("Close with unsent data under SO_LINGER returned after %v, before the client read it (%v)", took, drainAfter)
	}
}
