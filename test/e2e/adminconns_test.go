package e2e

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
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
// connection, keeping each alive after a /healthz or sending part of a
// head (a connection that sends nothing waits in the kernel, unaccepted:
// TCP_DEFER_ACCEPT), holds at most the cap: the one idle the longest, or
// quiet the longest, is closed to make room, so the process's descriptors (whose
// reserve memcached's connections need) and memory stay bounded, and a
// probe on a new connection is still answered 200. The connections
// closed for room are counted.
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
	// Half kept alive after a /healthz, half quiet after part of a head,
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
	if got := metricValue(t, g, "memcgate_admin_connections_reclaimed_total"); got < n-adminConnsCap {
		t.Errorf("memcgate_admin_connections_reclaimed_total = %v, want at least %d", got, n-adminConnsCap)
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
