package mcpipe

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestSockIO: a socket's reads and writes through sockIO move the same
// bytes as net.Conn's, wait for a slow peer with the connection's
// deadlines, and end with io.EOF; a connection that is not a socket gets
// none.
func TestSockIO(t *testing.T) {
	if newSockIO(tls.Client(nil, &tls.Config{})) != nil {
		t.Fatal("a TLS connection got a sockIO")
	}
	a, b := tcpPair(t)
	s := newSockIO(a)
	if s == nil {
		t.Fatal("no sockIO for a *net.TCPConn")
	}

	// Far more than the socket buffers hold, in many pieces (more than
	// one writev takes), so that the write waits for the reader.
	var want []byte
	var pieces net.Buffers
	for i := range 200 {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, 40<<10+i)
		pieces = append(pieces, p, nil)
		want = append(want, p...)
	}
	done := make(chan error, 1)
	go func() {
		n, err := s.writev(&pieces)
		if err == nil && (n != int64(len(want)) || len(pieces) != 0) {
			err = io.ErrShortWrite
		}
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("writev: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read differ from those written")
	}

	b.Write([]byte("reply"))
	buf := make([]byte, 64)
	if n, err := s.read(buf); err != nil || string(buf[:n]) != "reply" {
		t.Fatalf("read = %q, %v", buf[:n], err)
	}
	a.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if _, err := s.read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline = %v, want os.ErrDeadlineExceeded", err)
	}
	a.SetReadDeadline(time.Time{})
	b.Close()
	if n, err := s.read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed = %d, %v; want io.EOF", n, err)
	}
	var out net.Buffers
	for range 100 { // until the reset shows
		out = net.Buffers{[]byte("x")}
		if _, err := s.writev(&out); err != nil {
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "write" {
				t.Fatalf("writev to a closed peer = %#v, want a *net.OpError", err)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("writev to a closed peer never failed")
}

// TestWriteAllNoAlloc: writing a buffer of requests through sockIO
// allocates nothing, as the net.Conn.Write it replaces did not.
func TestWriteAllNoAlloc(t *testing.T) {
	a, b := tcpPair(t)
	go io.Copy(io.Discard, b)
	c := newConn(a, time.Second)
	if c.sio == nil {
		t.Fatal("no sockIO for a *net.TCPConn")
	}
	buf := []byte("set k 0 0 1\r\nv\r\n")
	allocs := testing.AllocsPerRun(100, func() {
		if err := c.writeAll(buf, nil); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("writeAll allocates %v times per write, want 0", allocs)
	}
}

// embeddingConn is a wrapper around a socket whose Read and Write do
// something of their own; it offers SyscallConn through the embedded
// *net.TCPConn.
type embeddingConn struct {
	*net.TCPConn
	reads, writes int
}

func (c *embeddingConn) Read(p []byte) (int, error)  { c.reads++; return c.TCPConn.Read(p) }
func (c *embeddingConn) Write(p []byte) (int, error) { c.writes++; return c.TCPConn.Write(p) }

// TestSockIOOnlySockets: sockIO takes the sockets themselves, not a
// wrapper that merely embeds one (and with it SyscallConn): reading and
// writing the descriptor under it would skip the wrapper's own methods.
func TestSockIOOnlySockets(t *testing.T) {
	a, _ := tcpPair(t)
	if newSockIO(&embeddingConn{TCPConn: a.(*net.TCPConn)}) != nil {
		t.Error("a wrapper embedding a *net.TCPConn got a sockIO")
	}
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	u, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if newSockIO(u) == nil {
		t.Error("no sockIO for a *net.UnixConn")
	}
}

// TestSockIOErrors: the errors of a wait that fails (a deadline, a
// connection closed) read as net.Conn's: a *net.OpError for "read" or
// "write" around the cause, not RawConn's "raw-read" and "raw-write".
func TestSockIOErrors(t *testing.T) {
	a, b := tcpPair(t)
	s := newSockIO(a)
	var oe *net.OpError
	a.SetReadDeadline(time.Now().Add(-time.Second))
	_, err := s.read(make([]byte, 8))
	if !errors.As(err, &oe) || oe.Op != "read" || !oe.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read past the deadline = %v, want a *net.OpError for read that times out", err)
	} else if oe.Addr.String() != b.LocalAddr().String() {
		t.Errorf("read error names %v, want the peer %v", oe.Addr, b.LocalAddr())
	}
	a.SetWriteDeadline(time.Now().Add(-time.Second))
	_, err = s.writev(&net.Buffers{[]byte("x")})
	if !errors.As(err, &oe) || oe.Op != "write" || !oe.Timeout() {
		t.Errorf("write past the deadline = %v, want a *net.OpError for write that times out", err)
	}
	a.Close()
	_, err = s.read(make([]byte, 8))
	if !errors.As(err, &oe) || oe.Op != "read" || !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close = %v, want a *net.OpError for read around net.ErrClosed", err)
	}
}
