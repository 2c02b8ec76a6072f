package e2e

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// adminConnsCap is the cap on the admin listener's connections
// (cmd/memcgate, adminMaxConns).
const adminConnsCap = 64

// TestAdminConnCap: the admin listener, which answers /healthz and
// /readyz without a token (probes must reach them), caps its connections
// as the data listener does. A client that opens connection after
// connection, asking /healthz on each (the listener closes it after the
// answer: one request per connection) or sending part of a head (a
// connection that sends nothing waits in the kernel, unaccepted:
// TCP_DEFER_ACCEPT), holds at most the cap: the one quiet the longest is
// closed to make room, so the process's descriptors (whose reserve
// memcached's connections need) and memory stay bounded, and a probe on
// a new connection is still answered 200. The connections closed for
// room are counted.
func TestAdminConnCap(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
	before := openFiles(t, g.Pid())

	const n = 5 * adminConnsCap
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	// Half asking /healthz, half quiet after part of a head,
	// interleaved.
	for i := range n {
		c, err := net.DialTimeout("tcp", g.AdminAddr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		if i%2 == 1 {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\n"); err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			continue
		}
		if err := healthz(c); err != nil {
			t.Fatalf("connection %d: /healthz: %v", i, err)
		}
	}
	// A probe on a new connection is answered while the attacker's are
	// open.
	c, err := net.DialTimeout("tcp", g.AdminAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := healthz(c); err != nil {
		t.Errorf("a probe with %d connections open: %v", n, err)
	}
	c.Close()

	open := stillOpen(conns)
	if open > adminConnsCap {
		t.Errorf("%d of %d admin connections left open, want at most %d (the admin listener's cap)", open, n, adminConnsCap)
	}
	if after := openFiles(t, g.Pid()); after-before > adminConnsCap+8 {
		t.Errorf("the gateway holds %d descriptors more than before %d admin connections, want at most %d", after-before, n, adminConnsCap+8)
	}
	if got := metricValue(t, g, "memcgate_admin_connections_reclaimed_total"); got < n/2-adminConnsCap {
		t.Errorf("memcgate_admin_connections_reclaimed_total = %v, want at least %d (the quiet ones past the cap)", got, n/2-adminConnsCap)
	}
	t.Logf("%d of %d admin connections left open", open, n)
}

// healthz sends GET /healthz on c, kept alive, and reads its answer.
func healthz(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New("status " + strconv.Itoa(resp.StatusCode))
	}
	return nil
}

// stillOpen counts the connections the server has not closed: a read
// that waits until its deadline rather than ending.
func stillOpen(conns []net.Conn) int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	open := 0
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			var b [1]byte
			_, err := c.Read(b[:])
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				mu.Lock()
				open++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return open
}

// openFiles is how many descriptors process pid has open.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	return len(fds)
}

// TestAdminProbesPastHeldRequests: a client cannot keep the load
// balancer's probes out by holding every connection of the admin
// listener with a request being served, which no cap can close for
// room. Two ways were cheap: a small body sent a byte at a time
// (net/http reads the rest of a body its handler left unread, until the
// read timeout, 30 s), by length or in chunks; and probes pipelined with
// their answers left unread (a few hundred KB of them fill the sockets'
// buffers, and each answer then waits for the write timeout, 60 s). The
// admin listener reads no body and serves one request per connection:
// with adminConnsCap connections at either, a probe on a new connection
// is answered 200 at once, and theirs are closed.
func TestAdminProbesPastHeldRequests(t *testing.T) {
	probe := "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
	tests := []struct {
		name string
		held func(i int) string // what connection i sends
		wait time.Duration      // for the server to read and answer what it reads
	}{
		{"bodies sent a byte at a time", func(i int) string {
			if i%2 == 0 {
				return "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx"
			}
			return "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\nx"
		}, 200 * time.Millisecond},
		{"answers left unread", func(int) string { return strings.Repeat(probe, 20000) }, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 1)
			g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
			var conns []net.Conn
			t.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
			})
			for i := range adminConnsCap {
				c, err := net.DialTimeout("tcp", g.AdminAddr, 5*time.Second)
				if err != nil {
					t.Fatalf("connection %d: %v", i, err)
				}
				conns = append(conns, c)
				go func() { _, _ = io.WriteString(c, tt.held(i)) }() // blocks once the server stops reading
			}
			time.Sleep(tt.wait)
			c, err := net.DialTimeout("tcp", g.AdminAddr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := healthz(c); err != nil {
				t.Errorf("a probe with %d admin connections holding requests: %v", adminConnsCap, err)
			}
		})
	}
}
