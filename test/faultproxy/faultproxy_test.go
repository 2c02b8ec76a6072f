package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// slack is the tolerance above an expected delay. The tests run with -race
// on a loaded 2-core machine, so it is generous; the lower bounds are exact,
// since a delay line can never deliver early.
const slack = 250 * time.Millisecond

// silence is how long a test waits to conclude that nothing will arrive.
const silence = 300 * time.Millisecond

// startTCPEcho starts a TCP echo server and returns its address. Cleanup
// closes it and waits for its goroutines.
func startTCPEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen() = %v", err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // guards conns
		conns = map[net.Conn]struct{}{}
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// startUDPEcho starts a UDP echo server, which replies to each sender, and
// returns its address.
func startUDPEcho(t *testing.T) string {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("ListenUDP() = %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, maxDatagram)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = conn.WriteToUDPAddrPort(buf[:n], from)
		}
	})
	t.Cleanup(func() {
		_ = conn.Close()
		wg.Wait()
	})
	return conn.LocalAddr().String()
}

func startTCP(t *testing.T, target string) *TCP {
	t.Helper()
	p := NewTCP(target)
	if err := p.Start(); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func startUDP(t *testing.T, target string) *UDP {
	t.Helper()
	r := NewUDP(target)
	if err := r.Start(); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("Dial(%q) = %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg on c, reads the echo and returns how long it took.
func roundTrip(t *testing.T, c net.Conn, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("Write(%q) = %v", msg, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("ReadFull after Write(%q) = %v", msg, err)
	}
	if string(got) != msg {
		t.Fatalf("echo of %q = %q, want %q", msg, got, msg)
	}
	return time.Since(start)
}

// expectSilence writes msg on c and checks that nothing comes back.
func expectSilence(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("Write(%q) = %v", msg, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(silence))
	n, err := c.Read(make([]byte, 64))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read after Write(%q) = %d, %v; want timeout", msg, n, err)
	}
}

// isReset reports whether err is what a client sees after an RST.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF)
}

// expectReset checks that c fails promptly with a reset or EOF.
func expectReset(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	start := time.Now()
	n, err := c.Read(make([]byte, 64))
	if !isReset(err) {
		t.Fatalf("Read() = %d, %v; want ECONNRESET or EOF", n, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Read() failed after %v, want promptly", d)
	}
}

// dialExpectReset dials addr and checks that the connection is reset: the
// RST can arrive before the dial returns, or on the first read.
func dialExpectReset(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		if !isReset(err) {
			t.Fatalf("Dial(%q) = %v, want success or reset", addr, err)
		}
		return
	}
	t.Cleanup(func() { _ = c.Close() })
	expectReset(t, c)
}

// eventually polls cond until it holds or 5s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still false after 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func checkDelay(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	if got < want || got > want+slack {
		t.Errorf("%s = %v, want in [%v, %v]", what, got, want, want+slack)
	}
}

func TestTCPRelay(t *testing.T) {
	p := startTCP(t, startTCPEcho(t))
	tests := []struct {
		name string
		size int
	}{
		{"one byte", 1},
		{"memcached line", len("get foo\r\n")},
		{"4 MiB", 4 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, p.Addr())
			want := bytes.Repeat([]byte("0123456789abcdef"), tt.size/16+1)[:tt.size]
			errc := make(chan error, 1)
			go func() { _, err := c.Write(want); errc <- err }()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, tt.size)
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatalf("ReadFull(%d bytes) = %v", tt.size, err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("Write(%d bytes) = %v", tt.size, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("echo of %d bytes differs", tt.size)
			}
		})
	}
	if got := p.Stats(); got.Accepted != int64(len(tests)) {
		t.Errorf("Stats().Accepted = %d, want %d", got.Accepted, len(tests))
	}
	total := int64(0)
	for _, tt := range tests {
		total += int64(tt.size)
	}
	eventually(t, "bytes counted", func() bool {
		s := p.Stats()
		return s.BytesFromClient == total && s.BytesToTarget == total && s.BytesToClient == total
	})
}

// TestTCPBytesFromClient: a chunk is counted in BytesFromClient once it is
// read, while it still waits in the delay line, so that a test knows its
// delay is fixed and may change the latency for the bytes after it.
func TestTCPBytesFromClient(t *testing.T) {
	p := startTCP(t, startTCPEcho(t))
	p.SetLatency(time.Hour)
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("get foo\r\n")); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	eventually(t, "the line read", func() bool { return p.Stats().BytesFromClient == int64(len("get foo\r\n")) })
	if s := p.Stats(); s.BytesToTarget != 0 {
		t.Errorf("Stats().BytesToTarget = %d, want 0: the line is held for an hour", s.BytesToTarget)
	}
}

func TestTCPHalfClose(t *testing.T) {
	p := startTCP(t, startTCPEcho(t))
	c := dial(t, p.Addr()).(*net.TCPConn)
	if _, err := c.Write([]byte("bye")); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite() = %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "bye" {
		t.Fatalf("ReadAll() = %q, %v; want %q, nil", got, err, "bye")
	}
	eventually(t, "Stats().Open == 0", func() bool { return p.Stats().Open == 0 })
}

// startStampServer starts a server that, per connection, reads one byte,
// reports when it arrived, writes one byte and reports when it was sent.
func startStampServer(t *testing.T) (addr string, arrived, sent <-chan time.Time) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen() = %v", err)
	}
	arr, snt := make(chan time.Time, 16), make(chan time.Time, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				b := make([]byte, 1)
				if _, err := c.Read(b); err != nil {
					return
				}
				arr <- time.Now()
				snt <- time.Now()
				if _, err := c.Write(b); err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, c)
			})
		}
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String(), arr, snt
}

func TestTCPLatencyPerDirection(t *testing.T) {
	tests := []struct {
		name         string
		d            time.Duration
		setAfterDial bool // SetLatency on an existing connection
	}{
		{"no latency", 0, false},
		{"100ms set before dial", 100 * time.Millisecond, false},
		{"100ms set on existing connection", 100 * time.Millisecond, true},
		{"250ms", 250 * time.Millisecond, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, arrived, sent := startStampServer(t)
			p := startTCP(t, addr)
			if !tt.setAfterDial {
				p.SetLatency(tt.d)
			}
			c := dial(t, p.Addr())
			if tt.setAfterDial {
				p.SetLatency(tt.d)
			}
			start := time.Now()
			if _, err := c.Write([]byte{'x'}); err != nil {
				t.Fatalf("Write() = %v", err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				t.Fatalf("ReadFull() = %v", err)
			}
			end := time.Now()
			arr, snt := <-arrived, <-sent
			checkDelay(t, "client to target", arr.Sub(start), tt.d)
			checkDelay(t, "target to client", end.Sub(snt), tt.d)
			checkDelay(t, "round trip", end.Sub(start), 2*tt.d)
		})
	}
}

func TestTCPLatencyPipelined(t *testing.T) {
	const msgLen = 8 // "%07d\n"
	tests := []struct {
		name string
		n    int
		d    time.Duration
		pace time.Duration // gap between writes, so they are separate chunks
	}{
		{"50 back to back", 50, 100 * time.Millisecond, 0},
		{"50 paced 2ms", 50, 100 * time.Millisecond, 2 * time.Millisecond},
		{"101 paced 1ms", 101, 100 * time.Millisecond, time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startTCP(t, startTCPEcho(t))
			p.SetLatency(tt.d)
			c := dial(t, p.Addr())
			// Send times travel on a channel, not through the socket, so
			// the race detector sees them ordered.
			sentAt := make(chan time.Time, tt.n)
			errc := make(chan error, 1)
			start := time.Now()
			go func() {
				for i := range tt.n {
					sentAt <- time.Now()
					if _, err := fmt.Fprintf(c, "%07d\n", i); err != nil {
						errc <- err
						return
					}
					if tt.pace > 0 {
						time.Sleep(tt.pace) // pacing, not synchronisation
					}
				}
				errc <- nil
			}()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, msgLen)
			var worst time.Duration
			for i := range tt.n {
				if _, err := io.ReadFull(c, buf); err != nil {
					t.Fatalf("ReadFull(message %d) = %v", i, err)
				}
				lat := time.Since(<-sentAt)
				if want := fmt.Sprintf("%07d\n", i); string(buf) != want {
					t.Fatalf("message %d = %q, want %q", i, buf, want)
				}
				if lat < 2*tt.d {
					t.Errorf("message %d round trip = %v, want >= %v", i, lat, 2*tt.d)
				}
				worst = max(worst, lat)
			}
			if err := <-errc; err != nil {
				t.Fatalf("Write() = %v", err)
			}
			total := time.Since(start)
			// Serialised sleeps would make message i wait (i+1)*d per way.
			if worst > 2*tt.d+slack {
				t.Errorf("worst round trip = %v, want <= %v (total %v for %d messages)", worst, 2*tt.d+slack, total, tt.n)
			}
		})
	}
}

func TestTCPBlackhole(t *testing.T) {
	p := startTCP(t, startTCPEcho(t))
	idle := dial(t, p.Addr())
	roundTrip(t, idle, "idle-before")
	busy := dial(t, p.Addr())
	roundTrip(t, busy, "busy-before")

	p.Blackhole(true)
	expectSilence(t, busy, "lost-1")
	fresh := dial(t, p.Addr()) // accepted, but nothing flows
	expectSilence(t, fresh, "lost-2")
	if got, want := p.Stats().BytesDropped, int64(len("lost-1")+len("lost-2")); got != want {
		t.Errorf("Stats().BytesDropped = %d, want %d", got, want)
	}

	p.Blackhole(false)
	tests := []struct {
		name  string
		c     net.Conn
		alive bool
	}{
		{"new connection relays", dial(t, p.Addr()), true},
		{"idle connection resumes", idle, true},
		{"connection that dropped bytes stays dead", busy, false},
		{"connection accepted in blackhole stays dead", fresh, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.alive {
				roundTrip(t, tt.c, "after")
			} else {
				expectSilence(t, tt.c, "after")
			}
		})
	}
	if got := p.Stats().Open; got != 4 {
		t.Errorf("Stats().Open = %d, want 4", got)
	}
}

// TestStartHanging: each proxy accepts and counts a connection and
// answers nothing on it.
func TestStartHanging(t *testing.T) {
	pxs, err := StartHanging(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pxs {
		t.Cleanup(func() { p.Close() })
		expectSilence(t, dial(t, p.Addr()), "version")
		if got := p.Stats().Accepted; got != 1 {
			t.Errorf("Stats().Accepted = %d, want 1", got)
		}
	}
}

func TestTCPReset(t *testing.T) {
	tests := []struct {
		name      string
		conns     int
		latency   time.Duration
		inFlight  bool // write before Reset, so data sits in the delay line
		blackhole bool // connections accepted into the blackhole
	}{
		{"one idle", 1, 0, false, false},
		{"five idle", 5, 0, false, false},
		{"five with data in flight", 5, 500 * time.Millisecond, true, false},
		{"blackholed", 3, 0, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startTCP(t, startTCPEcho(t))
			conns := make([]net.Conn, tt.conns)
			for i := range conns {
				conns[i] = dial(t, p.Addr())
				roundTrip(t, conns[i], "hello")
			}
			p.SetLatency(tt.latency)
			p.Blackhole(tt.blackhole)
			for _, c := range conns {
				if tt.inFlight {
					if _, err := c.Write([]byte("pending")); err != nil {
						t.Fatalf("Write() = %v", err)
					}
				}
			}
			eventually(t, "all connections open", func() bool { return p.Stats().Open == int64(tt.conns) })
			p.Reset()
			for _, c := range conns {
				expectReset(t, c)
			}
			eventually(t, "Stats().Open == 0", func() bool { return p.Stats().Open == 0 })

			p.SetLatency(0)
			p.Blackhole(false)
			roundTrip(t, dial(t, p.Addr()), "after reset")
		})
	}
}

func TestTCPRefuse(t *testing.T) {
	p := startTCP(t, startTCPEcho(t))
	addr := p.Addr()
	existing := dial(t, addr)
	roundTrip(t, existing, "before")

	p.SetRefuse(true)
	for range 3 {
		dialExpectReset(t, addr)
	}
	roundTrip(t, existing, "existing unaffected")
	if got := p.Stats().Refused; got != 3 {
		t.Errorf("Stats().Refused = %d, want 3", got)
	}

	p.SetRefuse(false)
	if got := p.Addr(); got != addr {
		t.Errorf("Addr() after SetRefuse(false) = %q, want %q", got, addr)
	}
	roundTrip(t, dial(t, addr), "after")
}

func TestTCPDialFailureResetsClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen() = %v", err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	p := startTCP(t, dead)
	dialExpectReset(t, p.Addr())
}

func TestTCPLifecycle(t *testing.T) {
	p := NewTCP("127.0.0.1:1")
	if got := p.Addr(); got != "" {
		t.Errorf("Addr() before Start = %q, want \"\"", got)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	if err := p.Start(); err == nil {
		t.Errorf("second Start() = nil, want error")
	}
	addr := p.Addr()
	if err := p.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
	if err := p.Start(); err == nil {
		t.Errorf("Start() after Close = nil, want error")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Errorf("Dial(%q) after Close succeeded, want error", addr)
	}
	if err := NewTCP("x").Close(); err != nil {
		t.Errorf("Close() without Start = %v, want nil", err)
	}
}

// settled waits for the goroutine count to fall back to base.
func settled(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("NumGoroutine() = %d after Close, want <= %d\n%s",
				runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTCPCloseLeaksNoGoroutines(t *testing.T) {
	echo := startTCPEcho(t)
	base := runtime.NumGoroutine()

	p := NewTCP(echo)
	if err := p.Start(); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	p.Blackhole(true)
	dial(t, p.Addr()) // accepted into the blackhole
	eventually(t, "blackholed connection open", func() bool { return p.Stats().Open == 1 })
	p.Blackhole(false)

	conns := make([]net.Conn, 4)
	for i := range conns {
		conns[i] = dial(t, p.Addr())
		roundTrip(t, conns[i], "established")
	}
	p.SetLatency(time.Second)
	for _, c := range conns[:3] { // data stuck in the delay line
		if _, err := c.Write([]byte("in flight")); err != nil {
			t.Fatalf("Write() = %v", err)
		}
	}
	_ = conns[3].(*net.TCPConn).CloseWrite() // FIN stuck in the delay line
	if got := p.Stats().Open; got != 5 {
		t.Errorf("Stats().Open = %d, want 5", got)
	}

	if err := p.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if got := p.Stats().Open; got != 0 {
		t.Errorf("Stats().Open after Close = %d, want 0", got)
	}
	settled(t, base)
}

func TestUDPRelay(t *testing.T) {
	tests := []struct {
		name    string
		clients int
		msgs    int
	}{
		{"one client", 1, 5},
		{"three clients get their own replies", 3, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := startUDP(t, startUDPEcho(t))
			conns := make([]*net.UDPConn, tt.clients)
			for i := range conns {
				c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(mustAddrPort(t, r.Addr())))
				if err != nil {
					t.Fatalf("DialUDP() = %v", err)
				}
				t.Cleanup(func() { _ = c.Close() })
				conns[i] = c
			}
			for j := range tt.msgs {
				for i, c := range conns {
					if _, err := fmt.Fprintf(c, "client %d msg %d", i, j); err != nil {
						t.Fatalf("Write() = %v", err)
					}
				}
			}
			buf := make([]byte, 1500)
			for i, c := range conns {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				for j := range tt.msgs {
					n, err := c.Read(buf)
					if err != nil {
						t.Fatalf("client %d Read() = %v", i, err)
					}
					if got, want := string(buf[:n]), fmt.Sprintf("client %d msg %d", i, j); got != want {
						t.Errorf("client %d reply %d = %q, want %q", i, j, got, want)
					}
				}
			}
			want := UDPStats{
				ToTarget: int64(tt.clients * tt.msgs),
				ToClient: int64(tt.clients * tt.msgs),
				Clients:  int64(tt.clients),
			}
			// Counters move just after each send, so poll.
			eventually(t, fmt.Sprintf("Datagrams() == %+v", want), func() bool { return r.Datagrams() == want })
		})
	}
}

func TestUDPLatency(t *testing.T) {
	tests := []struct {
		name string
		n    int
		d    time.Duration
		pace time.Duration
	}{
		{"single exchange no latency", 1, 0, 0},
		{"single exchange 100ms", 1, 100 * time.Millisecond, 0},
		{"50 pipelined 100ms", 50, 100 * time.Millisecond, 0},
		{"50 paced 2ms 100ms", 50, 100 * time.Millisecond, 2 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := startUDP(t, startUDPEcho(t))
			r.SetLatency(tt.d)
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(mustAddrPort(t, r.Addr())))
			if err != nil {
				t.Fatalf("DialUDP() = %v", err)
			}
			t.Cleanup(func() { _ = c.Close() })
			sentAt := make(chan time.Time, tt.n)
			errc := make(chan error, 1)
			go func() {
				for i := range tt.n {
					sentAt <- time.Now()
					if _, err := fmt.Fprintf(c, "%d", i); err != nil {
						errc <- err
						return
					}
					if tt.pace > 0 {
						time.Sleep(tt.pace) // pacing, not synchronisation
					}
				}
				errc <- nil
			}()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 64)
			var worst time.Duration
			for i := range tt.n {
				n, err := c.Read(buf)
				if err != nil {
					t.Fatalf("Read(reply %d) = %v", i, err)
				}
				lat := time.Since(<-sentAt)
				if got, want := string(buf[:n]), fmt.Sprint(i); got != want {
					t.Fatalf("reply %d = %q, want %q", i, got, want)
				}
				if lat < 2*tt.d {
					t.Errorf("reply %d round trip = %v, want >= %v", i, lat, 2*tt.d)
				}
				worst = max(worst, lat)
			}
			if err := <-errc; err != nil {
				t.Fatalf("Write() = %v", err)
			}
			if worst > 2*tt.d+slack {
				t.Errorf("worst round trip = %v, want <= %v", worst, 2*tt.d+slack)
			}
		})
	}
}

func TestUDPCloseLeaksNoGoroutines(t *testing.T) {
	echo := startUDPEcho(t)
	base := runtime.NumGoroutine()

	r := NewUDP(echo)
	if err := r.Start(); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	r.SetLatency(time.Second)
	for i := range 3 {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(mustAddrPort(t, r.Addr())))
		if err != nil {
			t.Fatalf("DialUDP() = %v", err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := fmt.Fprintf(c, "in flight %d", i); err != nil {
			t.Fatalf("Write() = %v", err)
		}
	}
	eventually(t, "three clients", func() bool { return r.Datagrams().Clients == 3 })
	if err := r.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
	if err := r.Start(); err == nil {
		t.Errorf("Start() after Close = nil, want error")
	}
	settled(t, base)
}

func mustAddrPort(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatalf("ParseAddrPort(%q) = %v", addr, err)
	}
	return ap
}
