//go:build linux

package abuse

import (
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/slowreader"
)

const (
	// dialers is how many connects a flood has in flight at once: enough
	// to open thousands of connections in a second or two, few enough
	// that the gateway's accept queue (somaxconn) is not simply
	// overrun, which makes the kernel drop SYNs and the client retry a
	// second later. It also keeps the test process far below the race
	// detector's limit of 8128 live goroutines.
	dialers     = 256
	dialTimeout = 30 * time.Second
)

// flood is many connections to one address, each having sent the same
// kind of bytes (or nothing), held open with no goroutine until close.
type flood struct {
	conns  []net.Conn    // nil where the connect or the write failed
	failed tally         // connect and write errors, by kind
	took   time.Duration // to open them all and write every head

	closeOnce sync.Once
}

// openFlood opens n connections to addr, with at most dialers connects
// in flight, each with a receive buffer of rcvbuf bytes (0: the
// kernel's), and calls send on the i-th if send is not nil (within
// 30 s: its writes have a deadline). The connections are closed when the
// test ends if close was not called before.
func openFlood(t *testing.T, addr string, n, rcvbuf int, send func(c net.Conn, i int) error) *flood {
	t.Helper()
	f := &flood{conns: make([]net.Conn, n)}
	t.Cleanup(f.close)
	start := time.Now()
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(dialers, n) {
		wg.Go(func() {
			d := &net.Dialer{}
			if rcvbuf > 0 {
				d = slowreader.Dialer(rcvbuf)
			}
			d.Timeout = dialTimeout
			for i := range next {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					f.failed.add("connect "+errKind(err), 1)
					continue
				}
				if send != nil {
					_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
					if err := send(c, i); err != nil {
						f.failed.add("write "+errKind(err), 1)
						c.Close()
						continue
					}
					_ = c.SetWriteDeadline(time.Time{})
				}
				f.conns[i] = c // each i is written by one goroutine, read after Wait
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	f.took = time.Since(start)
	return f
}

// open returns how many connections were opened.
func (f *flood) open() int {
	n := 0
	for _, c := range f.conns {
		if c != nil {
			n++
		}
	}
	return n
}

// states tallies what each connection holds now, without waiting: "no
// answer" (open, nothing came back), "closed" (the gateway closed it),
// "reset", or the status code of an answer waiting to be read; connect
// and write failures are added.
func (f *flood) states() *tally {
	var out tally
	for _, c := range f.conns {
		if c != nil {
			out.add(connState(c), 1)
		}
	}
	f.failed.mu.Lock()
	for k, v := range f.failed.n {
		out.add(k, v)
	}
	f.failed.mu.Unlock()
	return &out
}

// close closes every connection; it may be called more than once.
func (f *flood) close() {
	f.closeOnce.Do(func() {
		for _, c := range f.conns {
			if c != nil {
				c.Close()
			}
		}
	})
}

// connState peeks at c's receive queue with a non-blocking recv: a
// deadline in the past would not do, as Go reports it before reading.
func connState(c net.Conn) string {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return "unknown"
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return errKind(err)
	}
	var buf [32]byte
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}); err != nil {
		return errKind(err)
	}
	switch {
	case rerr == syscall.EAGAIN:
		return "no answer"
	case rerr != nil:
		return errKind(rerr)
	case n == 0:
		return "closed"
	}
	if f := strings.Fields(string(buf[:n])); len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") {
		return f[1]
	}
	return "data"
}
