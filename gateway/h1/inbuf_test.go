package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingPool is a pool that counts the buffers it hands out and gets
// back.
type countingPool struct {
	mu         sync.Mutex
	gets, puts int
	free       []any
}

func (p *countingPool) Get() any {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gets++
	if n := len(p.free); n > 0 {
		v := p.free[n-1]
		p.free = p.free[:n-1]
		return v
	}
	return nil
}

func (p *countingPool) Put(v any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.puts++
	p.free = append(p.free, v)
}

func (p *countingPool) counts() (gets, puts int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gets, p.puts
}

// plainConn hides a connection's syscall.Conn, so that h1 reads it with
// Read as it reads any net.Conn; it keeps CloseWrite.
type plainConn struct{ net.Conn }

func (c plainConn) CloseWrite() error { return c.Conn.(interface{ CloseWrite() error }).CloseWrite() }

// plainListener accepts plainConns.
type plainListener struct{ net.Listener }

func (l plainListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return plainConn{c}, nil
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln := listen(t, "tcp")
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// readPaths are the two ways an inbuf reads: raw reads on a socket, and
// Read on a connection without a RawConn.
var readPaths = []struct {
	name string
	wrap func(net.Conn) net.Conn
}{
	{"raw", func(c net.Conn) net.Conn { return c }},
	{"Read", func(c net.Conn) net.Conn { return plainConn{c} }},
}

func TestInbufWaitsWithoutBuffer(t *testing.T) {
	for _, path := range readPaths {
		t.Run(path.name, func(t *testing.T) {
			server, client := tcpPair(t)
			p := &countingPool{}
			var b inbuf
			b.init(path.wrap(server), p)
			got := make(chan string, 1)
			go func() {
				head, err := b.Peek(4)
				got <- string(head) + " " + errString(err)
			}()
			if path.name == "raw" {
				// The read found nothing and gave the buffer back before it waited.
				waitFor(t, "the buffer back in the pool", func() bool {
					gets, puts := p.counts()
					return gets == 1 && puts == 1
				})
			}
			if _, err := client.Write([]byte("GET / HTTP/1.1\r\n")); err != nil {
				t.Fatal(err)
			}
			if g := <-got; g != "GET  <nil>" {
				t.Errorf("Peek(4) = %q, want %q", g, "GET  <nil>")
			}
			if n := b.Buffered(); n != 16 {
				t.Errorf("Buffered() = %d, want 16", n)
			}
			if d, err := b.Discard(16); d != 16 || err != nil {
				t.Errorf("Discard(16) = %d, %v, want 16, nil", d, err)
			}
			b.release()
			if gets, puts := p.counts(); gets != puts {
				t.Errorf("after release: %d buffers taken, %d given back", gets, puts)
			}
		})
	}
}

// TestInbufLikeBufio runs the same calls on an inbuf and a bufio.Reader
// of the same size over the same bytes, written in small pieces.
func TestInbufLikeBufio(t *testing.T) {
	data := strings.Repeat("0123456789abcdef", 700) // 11200 bytes, more than the buffer
	type op struct {
		name string
		n    int
	}
	tests := []struct {
		name string
		ops  []op
	}{
		{"peeks", []op{{"peek", 1}, {"peek", 100}, {"peek", readBufSize}, {"discard", 10}, {"peek", readBufSize}}},
		{"peek past the buffer", []op{{"peek", readBufSize + 1}}},
		{"peek past the end", []op{{"discard", len(data) - 5}, {"peek", 10}, {"peek", 1}}},
		{"discard through the buffer", []op{{"peek", 3}, {"discard", 9000}, {"read", 100}, {"readall", 0}}},
		{"discard past the end", []op{{"discard", len(data) + 10}, {"peek", 1}}},
		{"large reads", []op{{"peek", 1}, {"read", 2 * readBufSize}, {"read", 2 * readBufSize}, {"readall", 0}}},
		{"empty read", []op{{"read", 0}, {"peek", 2}, {"read", 0}, {"readall", 0}, {"read", 0}}},
	}
	for _, path := range readPaths {
		for _, tt := range tests {
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				server, client := tcpPair(t)
				go func() {
					for s := data; len(s) > 0; {
						n := min(len(s), 999)
						client.Write([]byte(s[:n]))
						s = s[n:]
						time.Sleep(time.Millisecond)
					}
					client.(*net.TCPConn).CloseWrite()
				}()
				server.SetReadDeadline(time.Now().Add(5 * time.Second))
				var b inbuf
				b.init(path.wrap(server), &countingPool{})
				br := bufio.NewReaderSize(strings.NewReader(data), readBufSize)
				for i, o := range tt.ops {
					var got, want string
					switch o.name {
					case "peek":
						p, err := b.Peek(o.n)
						got = string(p) + " " + errString(err)
						p, err = br.Peek(o.n)
						want = string(p) + " " + errString(err)
					case "discard":
						n, err := b.Discard(o.n)
						got = fmtResult(n, err)
						n, err = br.Discard(o.n)
						want = fmtResult(n, err)
					case "read": // read until o.n bytes or an error: pieces differ
						got, want = readN(&b, o.n), readN(br, o.n)
					case "readall":
						p, err := io.ReadAll(&b)
						got = string(p) + " " + errString(err)
						p, err = io.ReadAll(br)
						want = string(p) + " " + errString(err)
					}
					if got != want {
						t.Fatalf("op %d %s(%d) = %.60q…, want %.60q…", i, o.name, o.n, got, want)
					}
					if b.Buffered() > b.Size() {
						t.Fatalf("op %d: Buffered() = %d, more than Size() %d", i, b.Buffered(), b.Size())
					}
				}
			})
		}
	}
}

func TestInbufErrors(t *testing.T) {
	for _, path := range readPaths {
		t.Run(path.name+"/deadline", func(t *testing.T) {
			server, _ := tcpPair(t)
			var b inbuf
			b.init(path.wrap(server), &countingPool{})
			server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err := b.Peek(1)
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "read" || !oe.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("Peek(1) past the deadline = %v, want a read *net.OpError that is a timeout", err)
			}
			if _, err := b.Peek(1); err == nil {
				t.Errorf("second Peek(1) = nil error, want the deadline again")
			}
		})
		t.Run(path.name+"/EOF", func(t *testing.T) {
			server, client := tcpPair(t)
			var b inbuf
			b.init(path.wrap(server), &countingPool{})
			client.Write([]byte("ab"))
			client.Close()
			if p, err := b.Peek(4); string(p) != "ab" || err != io.EOF {
				t.Errorf("Peek(4) = %q, %v, want %q, EOF", p, err, "ab")
			}
			if n, err := b.Read(make([]byte, 4)); n != 2 || err != nil {
				t.Errorf("Read = %d, %v, want 2, nil", n, err)
			}
			if n, err := b.Read(make([]byte, 4)); n != 0 || err != io.EOF {
				t.Errorf("Read at the end = %d, %v, want 0, EOF", n, err)
			}
		})
		t.Run(path.name+"/reset", func(t *testing.T) {
			server, client := tcpPair(t)
			var b inbuf
			b.init(path.wrap(server), &countingPool{})
			client.(*net.TCPConn).SetLinger(0)
			client.Close()
			server.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := b.Peek(1)
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "read" || oe.Timeout() {
				t.Errorf("Peek(1) after a reset = %v, want a read *net.OpError", err)
			}
		})
	}
}

func errString(err error) string {
	switch {
	case err == nil:
		return "<nil>"
	case errors.Is(err, errBufferFull), errors.Is(err, bufio.ErrBufferFull):
		return "buffer full"
	}
	return err.Error()
}

func fmtResult(n int, err error) string { return strconv.Itoa(n) + " " + errString(err) }

// readN reads until it has n bytes or an error.
func readN(r io.Reader, n int) string {
	var out bytes.Buffer
	buf := make([]byte, n)
	for out.Len() < n {
		k, err := r.Read(buf[:n-out.Len()])
		out.Write(buf[:k])
		if err != nil {
			return out.String() + " " + errString(err)
		}
	}
	return out.String()
}

// waitFor polls cond until it holds, or fails the test after 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestInbufGrow: a buffer grown for a long head keeps what was buffered,
// reads on into its new room, is kept as it is while parked (stash), and
// is never put in the pool: a release, a free or takeBytes drops it, and
// the pooled array it replaced goes back to the pool at once.
func TestInbufGrow(t *testing.T) {
	tests := []struct {
		name string
		end  func(b *inbuf) []byte // ends the grown buffer; returns bytes the caller keeps
		want string                // what end returns
	}{
		{"takeBytes", func(b *inbuf) []byte { return b.takeBytes() }, "abcdefgh"},
		{"free", func(b *inbuf) []byte { b.free(); return nil }, ""},
		{"release once read", func(b *inbuf) []byte { b.Discard(b.Buffered()); b.release(); return nil }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server, client := tcpPair(t)
			p := &countingPool{}
			var b inbuf
			b.init(server, p)
			io.WriteString(client, "abcd")
			if got, err := b.Peek(4); string(got) != "abcd" || err != nil {
				t.Fatalf("Peek(4) = %q, %v", got, err)
			}
			b.grow(2*readBufSize, 2*readBufSize)
			if gets, puts := p.counts(); gets != 1 || puts != 1 {
				t.Errorf("after grow: %d buffers taken, %d given back; want 1, 1", gets, puts)
			}
			if b.Size() != 2*readBufSize || string(b.bytes()) != "abcd" {
				t.Errorf("after grow: Size() = %d, bytes %q; want %d, %q", b.Size(), b.bytes(), 2*readBufSize, "abcd")
			}
			b.stash()
			if b.saved != nil || string(b.bytes()) != "abcd" {
				t.Errorf("stash moved a grown buffer's bytes: saved %q, buffered %q", b.saved, b.bytes())
			}
			b.unstash()
			io.WriteString(client, "efgh")
			if got, err := b.Peek(8); string(got) != "abcdefgh" || err != nil {
				t.Fatalf("Peek(8) after grow = %q, %v", got, err)
			}
			if got := tt.end(&b); string(got) != tt.want {
				t.Errorf("%s returned %q, want %q", tt.name, got, tt.want)
			}
			if b.buf != nil || b.Size() != readBufSize {
				t.Errorf("after %s: buffer of %d bytes kept, Size() = %d", tt.name, len(b.buf), b.Size())
			}
			if gets, puts := p.counts(); gets != 1 || puts != 1 {
				t.Errorf("after %s: %d buffers taken, %d given back; want 1, 1", tt.name, gets, puts)
			}
		})
	}
}

// TestReplayConnLetsGo: a handed-over connection returns the bytes it
// was given, then reads the connection, and keeps nothing of them once
// returned (net/http keeps the connection while it is open).
func TestReplayConnLetsGo(t *testing.T) {
	tests := []struct {
		name  string
		reads []int // sizes of the reads
	}{
		{"in one read", []int{16}},
		{"in two reads", []int{3, 16}},
		{"exactly", []int{6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server, client := tcpPair(t)
			var open, handed atomic.Int64
			open.Add(1)
			handed.Add(1)
			r := &replayConn{Conn: server, buf: []byte("replay"), open: &open, handed: &handed}
			var got []byte
			for _, n := range tt.reads {
				p := make([]byte, n)
				k, err := r.Read(p)
				if err != nil {
					t.Fatalf("Read = %d, %v", k, err)
				}
				got = append(got, p[:k]...)
			}
			if string(got) != "replay" || r.buf != nil {
				t.Errorf("read %q, kept %q; want %q, nothing", got, r.buf, "replay")
			}
			io.WriteString(client, "next")
			p := make([]byte, 8)
			if k, err := r.Read(p); string(p[:k]) != "next" || err != nil {
				t.Errorf("Read after the replay = %q, %v; want %q", p[:k], err, "next")
			}
			r.Close()
			r.Close()
			if n := open.Load(); n != 0 {
				t.Errorf("open = %d after two Closes, want 0", n)
			}
		})
	}
}
