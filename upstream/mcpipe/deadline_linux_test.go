package mcpipe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestAbsorbedValue: a value the kernel's send buffer takes whole ends
// its write at once; memcached then reads it at its own pace, and its
// reply is owed from the last bytes that left the buffer, not from the
// write's end (drained): a deadline that passes after memcached read
// some of it moves on, and the set succeeds once memcached has read it
// all. A memcached that stops reading still fails the set at a deadline
// that passes afterwards. The test passes the read deadline itself
// (passDeadline), each time after it has seen what memcached read leave
// the buffer, rather than racing a short timeout against a relay's
// pace: on a loaded machine the relay's goroutine slept 90 ms for 8
// (a stall of its own making), and the reader woke late enough for a
// second wait (overdue), which a clock cannot tell apart.
func TestAbsorbedValue(t *testing.T) {
	for _, tt := range []struct {
		name  string
		stops bool // memcached stops reading after the first 64 KiB
	}{{"slow", false}, {"stopped", true}} {
		t.Run(tt.name, func(t *testing.T) {
			const size = 1 << 20
			addr, read := absorbingMC(t, size)
			// Long: no deadline passes but those the test passes.
			c := New(Options{Conns: 1, Timeout: 10 * time.Second, Dial: largeSendBuffer(t, addr)})
			defer c.Close()
			setErr := make(chan error, 1)
			go func() {
				_, _, err := c.Do(context.Background(), op.Op{Verb: op.Set, Item: op.Item{Value: make([]byte, size)}}, "k")
				setErr <- err
			}()
			cn := heldAfterWrite(t, c, setErr)
			read(64 << 10)
			cn.mu.Lock()
			held := cn.outq
			cn.mu.Unlock()
			waitState(t, "what memcached read to leave the client's send buffer", func() bool {
				cn.mu.Lock()
				defer cn.mu.Unlock()
				return cn.sio.unsent() < held
			})
			if !passDeadline(t, cn) {
				t.Fatalf("a deadline passed after memcached read 64 KiB of the value absorbed: the set failed (%v), want the deadline moved", <-setErr)
			}
			if !tt.stops {
				read(-1)
				if err := <-setErr; err != nil {
					t.Fatalf("set of 1 MiB absorbed by the send buffer, read by memcached past a deadline: %v", err)
				}
				return
			}
			// memcached reads no more. What its receive window still took
			// moves once more at most; then a deadline finds nothing moved.
			for i := 0; passDeadline(t, cn); i++ {
				if i == 3 {
					t.Fatalf("%d deadlines passed after memcached stopped reading, each moved on", i+1)
				}
			}
			err := <-setErr
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || errors.Is(err, ErrBehind) {
				t.Errorf("set to a memcached that stopped reading mid-value: %v, want a stall's timeout", err)
			}
		})
	}
}

// heldAfterWrite waits until the one connection of c has written a set
// whose value the kernel still holds in part (outq), and returns it. It
// fails t if the set ends first (setErr): the test would prove nothing.
func heldAfterWrite(t *testing.T, c *Client, setErr <-chan error) *conn {
	t.Helper()
	var cn *conn
	for ; cn == nil; cn = c.small.slots[0].c.Load() {
		time.Sleep(time.Millisecond)
	}
	for {
		cn.mu.Lock()
		outq, replies := cn.outq, cn.outqReplies
		cn.mu.Unlock()
		if outq > 0 {
			if replies != 1 {
				t.Fatalf("the set's write sampled with %d replies to come, want 1", replies)
			}
			t.Logf("after the set's write, the kernel holds %d bytes", outq)
			return cn
		}
		select {
		case err := <-setErr:
			t.Fatalf("the set ended (%v) before its write was seen to leave bytes in the kernel: the test proves nothing", err)
		case <-time.After(time.Millisecond):
		}
	}
}

// passDeadline makes the read deadline of cn's unanswered reply pass
// now, as its timeout would, and waits for the reader's decision: true
// if it moved the deadline on (memcached was seen reading: drained), false
// if it failed the connection.
func passDeadline(t *testing.T, cn *conn) bool {
	t.Helper()
	cn.mu.Lock()
	at := time.Now()
	cn.readBy = at
	_ = cn.nc.SetReadDeadline(at)
	cn.mu.Unlock()
	var moved bool
	waitState(t, "the reader to act on a passed deadline", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		moved = cn.readBy.After(at)
		return moved || cn.err != nil
	})
	return moved
}

// waitState waits for cond, polling; it fails t after 10 s, which only
// a wait that never ends reaches.
func waitState(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// largeSendBuffer dials addr with a send buffer of 4 MiB, which takes a
// 1 MiB value whole. It sets it with SO_SNDBUFFORCE where it may (as
// root), as net.core.wmem_max may be lower, and fails the test if the
// kernel gave less than 2 MiB.
func largeSendBuffer(t *testing.T, addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		rc, err := nc.(*net.TCPConn).SyscallConn()
		if err != nil {
			nc.Close()
			return nil, err
		}
		var got int
		var gerr error
		rc.Control(func(fd uintptr) {
			if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, 4<<20) != nil {
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4<<20)
			}
			got, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
		})
		if gerr != nil || got < 2<<20 {
			nc.Close()
			t.Errorf("a send buffer of 4 MiB: the kernel gave %d bytes (%v); run as root or raise net.core.wmem_max", got, gerr)
			return nil, fmt.Errorf("send buffer of %d bytes", got)
		}
		return nc, nil
	}
}

// TestStaleOutq: once the reply to a write of a large value has come,
// memcached has read all of it, so what the kernel held after that write
// no longer counts as progress (drained) for a later request that
// memcached does not answer: its deadline passes once, not twice. The
// test looks at the state that decides it rather than timing the later
// request's failure, since a reader woken late by a loaded machine gets
// a second wait of its own (overdue), which a clock cannot tell apart.
func TestStaleOutq(t *testing.T) {
	// Long: no deadline passes while the test looks, however slowly the
	// machine runs it.
	const timeout = 10 * time.Second
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) })
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 512 << 10
	// A memcached that reads the set when told (read closed), then hangs.
	read := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReaderSize(c, 1024)
		br.ReadString('\n') // the set's line
		select {
		case <-read:
		case <-t.Context().Done():
			return
		}
		io.CopyN(io.Discard, br, size+2)
		br.ReadString('\n') // the get's, written before the set is answered
		c.Write([]byte("STORED\r\n"))
		io.Copy(io.Discard, br) // the get is never answered
	}()
	c := New(Options{Conns: 1, Timeout: timeout, Dial: largeSendBuffer(t, ln.Addr().String())})
	defer c.Close()
	setErr := make(chan error, 1)
	go func() {
		_, _, err := c.Do(context.Background(), op.Op{Verb: op.Set, Item: op.Item{Value: make([]byte, size)}}, "k")
		setErr <- err
	}()
	// The set's write has ended with most of the value held by the
	// kernel, unread by memcached, whose receive buffer is small.
	cn := heldAfterWrite(t, c, setErr)
	getErr := make(chan error, 1)
	go func() {
		_, _, err := c.Do(context.Background(), op.Op{Verb: op.Get}, "x")
		getErr <- err
	}()
	for { // the get written, after the set's write
		cn.mu.Lock()
		written := len(cn.queue) == 2 && cn.unsent == 0
		cn.mu.Unlock()
		if written {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(read) // the kernel has been seen to hold the value
	if err := <-setErr; err != nil {
		t.Fatalf("the set: %v", err)
	}
	cn.mu.Lock()
	cerr, outq, replies, owed := cn.err, cn.outq, cn.outqReplies, len(cn.queue)-cn.unsent
	cn.mu.Unlock()
	if cerr != nil || owed != 1 {
		t.Fatalf("after the set's reply: connection error %v, %d replies owed; want none and the get's", cerr, owed)
	}
	if outq != 0 || replies != 0 {
		t.Errorf("after the set's reply: %d bytes held and %d replies to come from its write, want 0 and 0", outq, replies)
	}
	// When the get's deadline passes, nothing it was sent after counts
	// as memcached reading.
	if cn.drained(time.Now().Add(time.Hour)) {
		t.Errorf("the get's deadline passed: drained moved it, taking the set's bytes for the get's progress")
	}
	c.Close()
	if err := <-getErr; err == nil {
		t.Errorf("a get memcached does not answer succeeded")
	}
}

// fakeMC serves one connection with script(conn, lines), lines being the
// request lines as they arrive.
func fakeMC(t *testing.T, script func(c net.Conn, lines <-chan string)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		lines := make(chan string, 16)
		go func() {
			br := bufio.NewReader(c)
			for {
				l, err := br.ReadString('\n')
				if err != nil {
					close(lines)
					return
				}
				lines <- strings.TrimSpace(l)
			}
		}()
		script(c, lines)
		time.Sleep(2 * time.Second)
	}()
	return ln.Addr().String()
}

// TestCapEndsWithItsCall: progress stopped at the deadline of the call
// whose reply was read (extendLocked) does not carry over to the call
// after it, which is owed its reply within the timeout of the last one,
// like any other: a caller with little time left does not fail the
// connection under a caller with more.
func TestCapEndsWithItsCall(t *testing.T) {
	addr := fakeMC(t, func(c net.Conn, lines <-chan string) {
		<-lines // get a
		<-lines // get b
		t0 := time.Now().Add(-20 * time.Millisecond)
		val := strings.Repeat("v", 600000)
		c.Write([]byte("VALUE a 0 600000\r\n" + val[:300000])) // progress: the deadline moves to a's
		time.Sleep(time.Until(t0.Add(300 * time.Millisecond)))
		c.Write([]byte(val[300000:] + "\r\nEND\r\n"))
		time.Sleep(time.Until(t0.Add(550 * time.Millisecond))) // after a's deadline, within the timeout of a's reply
		c.Write([]byte("END\r\n"))
	})
	c := New(Options{Conns: 1, Timeout: 400 * time.Millisecond, Dial: func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}})
	defer c.Close()
	if _, err := c.conn(&c.small); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 450*time.Millisecond)
	defer cancel()
	errA := make(chan error, 1)
	go func() {
		_, _, err := c.Do(ctx, op.Op{Verb: op.Get}, "a")
		errA <- err
	}()
	time.Sleep(20 * time.Millisecond)
	_, _, errB := c.Do(context.Background(), op.Op{Verb: op.Get}, "b")
	if err := <-errA; err != nil {
		t.Errorf("a, answered before its deadline: %v", err)
	}
	if !errors.Is(errB, memcache.ErrCacheMiss) {
		t.Errorf("b, answered 250 ms after a with a timeout of 400 ms: %v, want a miss", errB)
	}
}

// TestMultiGetKeepsDeadlines: a multi-key get whose reply streams for
// longer than its deadline fails there, and so does a get behind it,
// rather than both waiting for the whole reply (about 4 s, so that a
// loaded machine's delays stay far from telling the two apart).
func TestMultiGetKeepsDeadlines(t *testing.T) {
	addr := fakeMC(t, func(c net.Conn, lines <-chan string) {
		<-lines // gets a b
		<-lines // get c
		const piece, pieces = 300000, 40
		c.Write([]byte("VALUE a 0 " + strconv.Itoa(pieces*piece) + "\r\n"))
		for range pieces {
			if _, err := c.Write(make([]byte, piece)); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Write([]byte("\r\nEND\r\nEND\r\n"))
	})
	c := New(Options{Conns: 1, Timeout: 200 * time.Millisecond, Dial: func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}})
	defer c.Close()
	if _, err := c.conn(&c.small); err != nil {
		t.Fatal(err)
	}
	const deadline = 300 * time.Millisecond
	start := time.Now()
	multi := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		_, _, _, err := c.GetMultiLimit(ctx, []string{"a", "b"}, 0, nil, false)
		multi <- err
	}()
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, _, err := c.Do(ctx, op.Op{Verb: op.Get}, "c")
	took := time.Since(start)
	merr := <-multi
	t.Logf("multi-get: %v; get behind it: %v after %v", merr, err, took)
	for what, err := range map[string]error{"the multi-get": merr, "the get behind it": err} {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("%s: %v, want a timeout", what, err)
		}
	}
	if took > deadline+2*time.Second {
		t.Errorf("the get behind the multi-get returned after %v, past its deadline of %v", took, deadline)
	}
}
