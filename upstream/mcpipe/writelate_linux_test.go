package mcpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestWriteDeadlineWhileDraining: a value larger than the kernel's send
// buffer waits for room in it, and the kernel wakes the writer only once
// a third of the buffer (SO_SNDBUF 4 MiB here) is free, so a memcached
// reading less than that per timeout moves bytes the writer never sees. A write
// deadline that passes after bytes left the send queue since the write
// last looked moves on (writeOverdue), and so does the deadline of the
// reply owed meanwhile (drained, which the waiting writer's looks feed):
// the set succeeds once memcached has read it all. A memcached that stops
// reading still fails the set at a deadline that passes afterwards. As
// in TestAbsorbedValue, the test passes the deadlines itself, each time
// after it has seen bytes leave the buffer, and the timeout is long:
// no deadline passes but those the test passes.
func TestWriteDeadlineWhileDraining(t *testing.T) {
	for _, tt := range []struct {
		name  string
		stops bool // memcached stops reading after the first 128 KiB
	}{{"slow", false}, {"stopped", true}} {
		t.Run(tt.name, func(t *testing.T) {
			const size = 16 << 20 // more than the send buffer takes
			addr, read := absorbingMC(t, size)
			c := New(Options{Conns: 1, Timeout: 10 * time.Second, Dial: largeSendBuffer(t, addr)})
			defer c.Close()
			setErr := make(chan error, 1)
			go func() {
				_, _, err := c.Do(context.Background(), op.Op{Verb: op.Set, Item: op.Item{Value: make([]byte, size)}}, "k")
				setErr <- err
			}()
			cn := waitingWrite(t, c, setErr, 1)

			// The write's deadline passes after memcached read 64 KiB.
			readSome(t, cn, read)
			if !passWriteDeadline(t, cn) {
				t.Fatalf("the write deadline passed after memcached read 64 KiB of a value waiting for room: the set failed (%v), want the deadline moved", <-setErr)
			}
			// The reply's deadline passes after memcached read 64 KiB more.
			readSome(t, cn, read)
			if !passDeadline(t, cn) {
				t.Fatalf("the read deadline passed after memcached read 64 KiB more of a value being written: the set failed (%v), want the deadline moved", <-setErr)
			}
			if !tt.stops {
				read(-1)
				if err := <-setErr; err != nil {
					t.Fatalf("set of 16 MiB read by memcached 64 KiB at a time past its deadlines: %v", err)
				}
				return
			}
			// memcached reads no more. What its receive window still took
			// moves once more at most; then a deadline finds nothing moved.
			for i := 0; passWriteDeadline(t, cn); i++ {
				if i == 3 {
					t.Fatalf("%d write deadlines passed after memcached stopped reading, each moved on", i+1)
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

// waitingWrite waits until the one connection of c has calls calls
// queued and its writer waits for room in the socket (writeWaits), and
// returns it. It fails t
// if the set ends first (setErr): the test would prove nothing.
func waitingWrite(t *testing.T, c *Client, setErr <-chan error, calls int) *conn {
	t.Helper()
	var cn *conn
	for ; cn == nil; cn = c.small.slots[0].c.Load() {
		time.Sleep(time.Millisecond)
	}
	for {
		cn.mu.Lock()
		waits := cn.writing && cn.waits > 0 && len(cn.queue) == calls
		cn.mu.Unlock()
		if waits {
			return cn
		}
		select {
		case err := <-setErr:
			t.Fatalf("the set ended (%v) before its write was seen to wait for room: the test proves nothing", err)
		case <-time.After(time.Millisecond):
		}
	}
}

// readSome makes memcached read 64 KiB and waits until the client's
// kernel holds fewer bytes than before. cn's writer waits for room: the
// kernel's count only falls from its last look (and the reader's) then.
func readSome(t *testing.T, cn *conn, read func(int)) {
	t.Helper()
	cn.mu.Lock()
	held := cn.sio.unsent()
	cn.mu.Unlock()
	read(64 << 10)
	waitState(t, "what memcached read to leave the client's send buffer", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return cn.sio.unsent() < held
	})
}

func lateWrites(cn *conn) int {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.lateWrites
}

// passWriteDeadline makes the write deadline of cn's writer, which waits
// for room, pass now, as its timeout would, and waits for the writer's
// decision: true if it moved the deadline on (writeOverdue) and waits for
// room again, its look at the kernel's count published, false if it
// failed the connection.
func passWriteDeadline(t *testing.T, cn *conn) bool {
	t.Helper()
	cn.mu.Lock()
	late, waits := cn.lateWrites, cn.waits
	cn.mu.Unlock()
	_ = cn.nc.SetWriteDeadline(time.Now())
	var moved bool
	waitState(t, "the writer to act on a passed deadline", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		moved = cn.lateWrites > late && cn.waits > waits
		return moved || cn.err != nil
	})
	return moved
}

// TestStoppedMemcachedFailsAWaitingWrite: a real memcached stopped
// (SIGSTOP) while a value larger than the kernel's buffers waits for
// room fails the set with a stall's timeout, within a few timeouts of
// the last bytes that moved: the write's deadline moves only on bytes
// moved, and for a late writer once. The caller allows far longer
// (ErrBehind there), which only deadlines moved with nothing moving
// would reach.
func TestStoppedMemcachedFailsAWaitingWrite(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "32m")
	const timeout = 300 * time.Millisecond
	c := New(Options{Conns: 1, Timeout: timeout, Dial: func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", srv.Addr)
	}})
	defer c.Close()
	if _, err := c.conn(&c.small); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	setErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _, err := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Value: make([]byte, 24<<20)}}, "k")
		setErr <- err
	}()
	cn := waitingWrite(t, c, setErr, 1)
	start := time.Now()
	err := <-setErr
	took := time.Since(start)
	t.Logf("set of 24 MiB to a stopped memcached: %v, %v after its write was seen waiting, %d write deadlines moved on", err, took, lateWrites(cn))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || errors.Is(err, ErrBehind) {
		t.Errorf("set to a stopped memcached: %v, want a stall's timeout", err)
	}
	if took > 10*timeout {
		t.Errorf("the set failed %v after its write waited, want within a few timeouts of %v", took, timeout)
	}
}

// pausedWriterEnv names, in the environment of the test binary run
// again as a gateway (TestPausedWriterChild), the memcached it writes to.
const pausedWriterEnv = "MCPIPE_TEST_PAUSED_WRITER"

// TestWriterPausedPastItsDeadline stops the gateway itself (SIGSTOP) for
// twice the timeout while a value larger than the kernel's buffers
// waits for room on its way to a real memcached, as a host freeze, a
// throttled container or a process starved of CPU would: the gateway is
// this test's binary run again (TestPausedWriterChild). memcached, stopped
// before the set so that its write waits, is let go only once the
// gateway, running again, has acted on the deadline it came to late:
// the socket has no room then, so nothing but the deadline decides. It
// was not memcached's stall (the gateway was not running): the set and a
// get queued behind it on the connection succeed. Without the write's
// grace the write failed on waking with an i/o timeout, and both calls
// with it. (Let go while the gateway is stopped, memcached reads what
// the kernel held, and whether the writer wakes to its deadline or to
// the room first is the Go scheduler's choice; TestWriteDeadlineWhileDraining
// shows that case with the deadline passed on purpose.)
func TestWriterPausedPastItsDeadline(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "32m")
	srv.Pause()
	defer srv.Resume()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPausedWriterChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), pausedWriterEnv+"="+srv.Addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	var report []string
	until := func(want string) {
		t.Helper()
		for lines.Scan() && lines.Text() != want {
			report = append(report, lines.Text())
		}
		if lines.Err() != nil || lines.Text() != want {
			t.Fatalf("the gateway ended before it said %q: %v\n%s", want, lines.Err(), strings.Join(report, "\n"))
		}
	}
	until("waiting")
	// The write waits, its deadline a timeout from its last progress:
	// the gateway stops for twice that.
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	memcachedtest.WaitStopped(t, "the gateway", cmd.Process.Pid)
	time.Sleep(2 * pausedWriterTimeout)
	_ = cmd.Process.Signal(syscall.SIGCONT)
	until("decided")
	srv.Resume()
	for lines.Scan() {
		report = append(report, lines.Text())
	}
	err = cmd.Wait()
	t.Logf("the gateway's report:\n%s", strings.Join(report, "\n"))
	if err != nil {
		t.Errorf("a set and a get on one connection, the gateway paused for twice the timeout while the set's value waited for room: %v", err)
	}
}

// pausedWriterTimeout is the timeout of TestPausedWriterChild's client:
// what it takes from the write's wait to the gateway's stop must stay
// well within it, on a loaded machine too.
const pausedWriterTimeout = time.Second

// TestPausedWriterChild is the gateway of TestWriterPausedPastItsDeadline,
// run only as its child: it sets a value of 24 MiB, says "waiting" on
// its standard output once the write waits for room and a get of the
// key is queued behind it on the connection, "decided" once the writer
// has moved its deadline on or failed the connection, and fails if
// either call fails (or the get does not read the value).
func TestPausedWriterChild(t *testing.T) {
	addr := os.Getenv(pausedWriterEnv)
	if addr == "" {
		t.Skip("run by TestWriterPausedPastItsDeadline")
	}
	c := New(Options{Conns: 1, Timeout: pausedWriterTimeout, Dial: func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}})
	defer c.Close()
	value := bytes.Repeat([]byte("v"), 24<<20)
	setErr := make(chan error, 1)
	go func() {
		_, _, err := c.Do(context.Background(), op.Op{Verb: op.Set, Item: op.Item{Value: value}}, "k")
		setErr <- err
	}()
	cn := waitingWrite(t, c, setErr, 1)
	type got struct {
		n   int
		err error
	}
	getGot := make(chan got, 1)
	go func() {
		it, _, err := c.Do(context.Background(), op.Op{Verb: op.Get}, "k")
		var n int
		if it != nil {
			n = len(it.Value)
		}
		getGot <- got{n, err}
	}()
	waitState(t, "the get to be queued behind the set", func() bool { return cn.queued() == 2 })
	fmt.Println("waiting")
	// Stopped, then running again: the writer's deadline has passed.
	waitState(t, "the writer to act on its deadline", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return cn.lateWrites > 0 || cn.err != nil
	})
	fmt.Println("decided")
	start := time.Now()
	serr := <-setErr
	g := <-getGot
	fmt.Printf("set: %v; get: %d bytes, %v; %v after the wait; %d write deadlines moved on\n", serr, g.n, g.err, time.Since(start), lateWrites(cn))
	if serr != nil || g.err != nil || g.n != len(value) {
		t.Fatalf("set: %v; get: %d bytes, %v; want the set stored and the get to read it", serr, g.n, g.err)
	}
}
