package upstream

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// pausedConn is a probe's connection whose first write, or first read,
// starts lag after the deadline it was given, as when the gateway stops
// (SIGSTOP, a throttled container, a host freeze) between the probe's
// start and its write or its read. woke, if not nil, runs as the late
// read starts.
type pausedConn struct {
	net.Conn
	lag     time.Duration
	onWrite bool // the write is late; else the read
	woke    func()

	mu       sync.Mutex
	deadline time.Time
	paused   bool // the pause happened
}

func (c *pausedConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

// pause waits until lag after the deadline, once.
func (c *pausedConn) pause() {
	c.mu.Lock()
	done, d := c.paused, c.deadline
	c.paused = true
	c.mu.Unlock()
	if done {
		return
	}
	time.Sleep(time.Until(d.Add(c.lag)))
	if c.woke != nil {
		c.woke()
	}
}

func (c *pausedConn) Write(p []byte) (int, error) {
	if c.onWrite {
		c.pause()
	}
	return c.Conn.Write(p)
}

func (c *pausedConn) Read(p []byte) (int, error) {
	if !c.onWrite {
		c.pause()
	}
	return c.Conn.Read(p)
}

// TestProbeLateIsSentAgain: a probe whose deadline the gateway came to a
// quarter of HEALTH_TIMEOUT or more late (it was not running: its dial,
// its write or its read started past the deadline) is sent once more,
// counted in memcgate_upstream_probes_late_total, and the node it
// probes, answering all along, is not ejected (Fall 1). A memcached
// stopped while the gateway runs still fails its probe at the timeout,
// sent once, and is ejected; so is one whose second try is late too.
func TestProbeLateIsSentAgain(t *testing.T) {
	const timeout = 200 * time.Millisecond
	const lag = timeout // well past timeout/4
	tests := []struct {
		name string
		// dial is the probe's n-th dial (from 1); wrap, if not nil, wraps
		// the connection it made.
		lateDial  func(n int64) bool
		wrap      func(mc *memcachedtest.Server, nc net.Conn, n int64) net.Conn
		stopped   bool // memcached stopped before the probe
		wantUp    bool
		wantLate  float64
		wantDials int64
	}{
		{
			name:     "dial started past the deadline",
			lateDial: func(n int64) bool { return n == 1 },
			wantUp:   true, wantLate: 1, wantDials: 2,
		},
		{
			name: "write started past the deadline",
			wrap: func(_ *memcachedtest.Server, nc net.Conn, n int64) net.Conn {
				if n > 1 {
					return nc
				}
				return &pausedConn{Conn: nc, lag: lag, onWrite: true}
			},
			wantUp: true, wantLate: 1, wantDials: 2,
		},
		{
			// Gateway and memcached stopped together (a host frozen), the
			// gateway let go first: no answer waits in the socket.
			name:    "read started past the deadline, memcached stopped with the gateway",
			stopped: true,
			wrap: func(mc *memcachedtest.Server, nc net.Conn, n int64) net.Conn {
				if n > 1 {
					return nc
				}
				return &pausedConn{Conn: nc, lag: lag, woke: func() {
					time.AfterFunc(20*time.Millisecond, mc.Resume)
				}}
			},
			// The second try writes its version on the first's
			// connection, kept for its late answer, and reads both
			// (decision 0095).
			wantUp: true, wantLate: 1, wantDials: 1,
		},
		{
			name:    "memcached stopped, the gateway on time",
			stopped: true,
			wantUp:  false, wantLate: 0, wantDials: 1,
		},
		{
			name:     "late twice",
			lateDial: func(int64) bool { return true },
			wantUp:   false, wantLate: 1, wantDials: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			var dials atomic.Int64
			c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, func(o *Options) {
				o.Health.Timeout, o.Health.Fall = timeout, 1
				o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
					n := dials.Add(1)
					if tt.lateDial != nil && tt.lateDial(n) {
						// Not running until lag past the deadline.
						if d, ok := ctx.Deadline(); ok {
							time.Sleep(time.Until(d.Add(lag)))
						}
					}
					var d net.Dialer
					nc, err := d.DialContext(ctx, network, address)
					if err != nil || tt.wrap == nil {
						return nc, err
					}
					return tt.wrap(mc, nc, n), nil
				}
			})
			n := c.topo.Load().nodes[0]
			if tt.stopped {
				mc.Pause()
				t.Cleanup(mc.Resume)
			}
			start := time.Now()
			c.checkAll(t.Context())
			took := time.Since(start)
			if up := n.available(); up != tt.wantUp {
				t.Errorf("node up = %v after the probe round (%v), want %v; reason %q%s", up, took, tt.wantUp, n.reason, mc.ResumedNote())
			}
			if got := testutil.ToFloat64(n.m.probeLate); got != tt.wantLate {
				t.Errorf("probes_late_total = %v, want %v", got, tt.wantLate)
			}
			if got := dials.Load(); got != tt.wantDials {
				t.Errorf("%d dials, want %d", got, tt.wantDials)
			}
			if tt.name == "memcached stopped, the gateway on time" && took > timeout+timeout/2 {
				t.Errorf("a stopped memcached's probe failed after %v, want about the timeout (%v): sent once", took, timeout)
			}
		})
	}
}
