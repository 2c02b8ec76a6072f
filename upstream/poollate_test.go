package upstream

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestPooledLateIsNoStall: with gomemcache's pool (PIPELINE_CONNS=0), a
// get whose dial, write or read the gateway came to a quarter of the
// timeout or more after its deadline (it was not running) gets one more
// timeout, as the pipelined connections' do (0069, 0085), and answers;
// the node stays up though one timeout would eject it (PASSIVE_FAILS 1).
// A memcached stopped while the gateway runs still times out, once, and
// is ejected.
func TestPooledLateIsNoStall(t *testing.T) {
	const timeout = 200 * time.Millisecond
	const lag = timeout
	tests := []struct {
		name      string
		lateDial  bool // the first dial starts lag past its deadline
		wrap      func(mc *memcachedtest.Server, nc net.Conn) net.Conn
		stopped   bool // memcached stopped before the get
		wantUp    bool
		wantDials int64
	}{
		{name: "dial started past the deadline", lateDial: true, wantUp: true, wantDials: 2},
		{
			name: "write started past the deadline",
			wrap: func(_ *memcachedtest.Server, nc net.Conn) net.Conn {
				return &pausedConn{Conn: nc, lag: lag, onWrite: true}
			},
			wantUp: true, wantDials: 1,
		},
		{
			name:    "read started past the deadline, memcached stopped with the gateway",
			stopped: true,
			wrap: func(mc *memcachedtest.Server, nc net.Conn) net.Conn {
				return &pausedConn{Conn: nc, lag: lag, woke: func() {
					time.AfterFunc(20*time.Millisecond, mc.Resume)
				}}
			},
			wantUp: true, wantDials: 1,
		},
		{name: "memcached stopped, the gateway on time", stopped: true, wantUp: false, wantDials: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			if err := memcache.New(mc.Addr).Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			var dials atomic.Int64
			c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, func(o *Options) {
				o.PipelineConns, o.Timeout = 0, timeout
				o.Health.PassiveFails, o.Health.MaxEjectedPercent = 1, 100
				o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
					n := dials.Add(1)
					if tt.lateDial && n == 1 {
						if d, ok := ctx.Deadline(); ok {
							time.Sleep(time.Until(d.Add(lag))) // not running until lag past the deadline
						}
					}
					var d net.Dialer
					nc, err := d.DialContext(ctx, network, address)
					if err != nil || tt.wrap == nil || n > 1 {
						return nc, err
					}
					return tt.wrap(mc, nc), nil
				}
			})
			n := c.topo.Load().nodes[0]
			if tt.stopped {
				mc.Pause()
				t.Cleanup(mc.Resume)
			}
			start := time.Now()
			res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
			took := time.Since(start)
			if tt.wantUp && (res.Err != nil || string(res.Item.Value) != "v") {
				t.Errorf("get = %v after %v, want the value%s", res.Err, took, mc.ResumedNote())
			}
			if up := n.available(); up != tt.wantUp {
				t.Errorf("node up = %v after the get (%v, %v), want %v%s", up, res.Err, took, tt.wantUp, mc.ResumedNote())
			}
			if got := dials.Load(); got != tt.wantDials {
				t.Errorf("%d dials, want %d", got, tt.wantDials)
			}
			if !tt.wantUp && took > timeout+timeout/2 {
				t.Errorf("a stopped memcached's get failed after %v, want about the timeout (%v)", took, timeout)
			}
		})
	}
}
