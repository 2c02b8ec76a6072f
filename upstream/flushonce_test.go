package upstream

import (
	"bufio"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// heldConn is a probe's connection whose writes reach memcached only
// when the test releases them, as bytes left unread in memcached's
// socket do (memcached stopped, or starved, with the gateway), and
// whose first read starts lag after its deadline (the gateway late to
// it). Closed by the gateway before the release, what it held still
// reaches memcached at the release, as what sits in memcached's socket
// is read there after the client has gone.
type heldConn struct {
	net.Conn
	lag time.Duration

	mu       sync.Mutex
	deadline time.Time
	paused   bool   // the late read happened
	held     []byte // written, not yet passed on
	released bool
	closed   bool // by the gateway
}

func (c *heldConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *heldConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.released {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *heldConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	first, d := !c.paused, c.deadline
	c.paused = true
	c.mu.Unlock()
	if first {
		time.Sleep(time.Until(d.Add(c.lag)))
	}
	return c.Conn.Read(p)
}

func (c *heldConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.released {
		return c.Conn.Close()
	}
	return nil // what it holds reaches memcached at the release
}

// release passes what was held on to memcached. If the gateway closed
// the connection meanwhile, it waits for memcached's first line, so
// that memcached ran what it held, and closes it.
func (c *heldConn) release(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	if len(c.held) == 0 {
		return
	}
	c.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second)) // the gateway's has passed
	if _, err := c.Conn.Write(c.held); err != nil {
		t.Fatalf("releasing %q: %v", c.held, err)
	}
	if !c.closed {
		return
	}
	c.Conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c.Conn).ReadString('\n'); err != nil {
		t.Fatalf("memcached's answer to the released %q: %v", c.held, err)
	}
	c.Conn.Close()
}

// TestFlushAllNeverRunsAfterTheNodeServes: the flush before a node's
// re-admission whose first try the gateway came to late, its flush_all
// still unread in memcached's socket, is not sent again on another
// connection while that one may still run: memcached could answer the
// second, the node serve again, and the first then empty what was
// written since. The flush fails (the node stays down) until the
// first's answer comes; the next flush reads it and then sends its own.
// A key written once a flush passed is never emptied by a flush_all
// that comes after. Without the change the second try passed at once,
// and the first flush_all, let through after, emptied the key.
func TestFlushAllNeverRunsAfterTheNodeServes(t *testing.T) {
	const timeout = 200 * time.Millisecond
	mc := memcachedtest.Start(t)
	var (
		mu    sync.Mutex
		first *heldConn
	)
	c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, func(o *Options) {
		o.Health.Timeout = timeout
		o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, network, address)
			if err != nil {
				return nc, err
			}
			mu.Lock()
			defer mu.Unlock()
			if first != nil {
				return nc, nil
			}
			t.Cleanup(func() { nc.Close() })
			first = &heldConn{Conn: nc, lag: timeout}
			return first, nil
		}
	})
	n := c.topo.Load().nodes[0]
	ctx := t.Context()
	direct := memcache.New(mc.Addr)
	flushes := func() string {
		t.Helper()
		reply, err := n.command(ctx, "stats\r\n", true, true)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := statValue(reply, "cmd_flush")
		return v
	}

	err := c.probeOnce(ctx, n, true)
	if got := testutil.ToFloat64(n.m.probeLate); got != 1 {
		t.Errorf("probes_late_total = %v after a flush read late, want 1", got)
	}
	if err != nil {
		t.Logf("flush with its first flush_all held unread: %v", err)
		first.release(t) // memcached runs it and answers
		if err := c.probeOnce(ctx, n, true); err != nil {
			t.Fatalf("flush once the first flush_all ran: %v", err)
		}
	}
	// The flush passed: the node serves, and is written.
	if err := direct.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	ran := flushes()
	first.release(t) // whatever was held reaches memcached
	if _, err := direct.Get("k"); err != nil {
		t.Errorf("get of a key written after the flush passed: %v, want it kept (flush_all runs: %s before the release, %s after)", err, ran, flushes())
	}
}

// TestFlushAllUnansweredHoldsTheNodeDown: a flush_all to a memcached
// stopped while the gateway runs times out, on time, and is not sent
// again: the next flush fails while memcached is still stopped, and
// passes once memcached ran the first (its answer read, then a
// flush_all of its own sent and answered), or once memcached was
// restarted (the first's connection closed: it never runs).
func TestFlushAllUnansweredHoldsTheNodeDown(t *testing.T) {
	const timeout = 150 * time.Millisecond
	for _, restart := range []bool{false, true} {
		name := "memcached resumed"
		if restart {
			name = "memcached restarted"
		}
		t.Run(name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, func(o *Options) { o.Health.Timeout = timeout })
			n := c.topo.Load().nodes[0]
			ctx := t.Context()
			mc.Pause()
			for i := range 2 {
				if err := c.probeOnce(ctx, n, true); err == nil {
					t.Fatalf("flush %d to a stopped memcached passed%s", i+1, mc.ResumedNote())
				}
			}
			if restart {
				mc.Kill()
				mc.Restart()
			} else {
				mc.Resume()
			}
			if err := c.probeOnce(ctx, n, true); err != nil {
				t.Errorf("flush once memcached runs: %v", err)
			}
			if got := testutil.ToFloat64(n.m.probeLate); got != 0 {
				t.Errorf("probes_late_total = %v, want 0: the gateway was on time", got)
			}
		})
	}
}
