package upstream

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// The probes of these tests: a timeout of 300 ms, and a relay adding
// 250 ms each way, so that every version is answered 200 ms after its
// probe's deadline and 200 ms before the next round's (slowRound apart)
// starts.
const (
	slowTimeout = 300 * time.Millisecond
	slowRelay   = 250 * time.Millisecond
	slowRound   = 700 * time.Millisecond
)

// slowCluster is a cluster of one memcached behind a relay of its own,
// probed with slowTimeout, Fall and Rise 2, no flap hold.
func slowCluster(t *testing.T) (*Cluster, *node, *faultproxy.TCP) {
	t.Helper()
	mcs := memcachedtest.StartN(t, 1)
	px, port := relayTo(t, mcs[0].Addr)
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Servers[0].Port = port
		o.Health.Timeout = slowTimeout
		o.Health.Interval = slowRound
		o.Health.FlapBackoff = 0
	})
	return c, c.topo.Load().nodes[0], px
}

// slowRounds runs k probe rounds slowRound apart, calling after each
// with its number (from 1).
func slowRounds(t *testing.T, c *Cluster, k int, after func(i int)) {
	t.Helper()
	start := time.Now()
	for i := 1; i <= k; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i-1) * slowRound)))
		c.checkRound(t.Context(), time.Now())
		after(i)
	}
}

// TestSlowNodeStaysInService: a memcached that answers every version
// later than the probe timeout (here 500 ms to 300 ms, as a one-thread
// memcached busy with large sets did, docs/benchmarks.md), but before
// the next probe's deadline, is slow, not gone: it stays in service
// round after round, and the probes are counted slow. Without the
// change each probe that timed out closed its connection and failed, and
// two in a row took the node down.
func TestSlowNodeStaysInService(t *testing.T) {
	c, n, px := slowCluster(t)
	px.SetLatency(slowRelay)
	slowRounds(t, c, 6, func(i int) {
		if !n.available() {
			t.Fatalf("after round %d, a node that answers each probe %v late is down: %s", i, 2*slowRelay-slowTimeout, n.status().Reason)
		}
	})
	if got := testutil.ToFloat64(n.m.probeSlow); got < 4 {
		t.Errorf("probes_slow_total = %v after 6 rounds of late answers, want at least 4", got)
	}
}

// TestHungNodeFallsAsFast: a memcached that stops answering (SIGSTOP, or
// a relay that drops its bytes) is taken down after Fall rounds, as
// before: the connection whose probe timed out, kept for its late
// answer, is closed when the next probe gets neither answer.
func TestHungNodeFallsAsFast(t *testing.T) {
	for _, tc := range []struct {
		name string
		hang func(mc *memcachedtest.Server, px *faultproxy.TCP)
	}{
		{"sigstop", func(mc *memcachedtest.Server, _ *faultproxy.TCP) { mc.Pause() }},
		{"blackhole", func(_ *memcachedtest.Server, px *faultproxy.TCP) { px.Blackhole(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 1)
			px, port := relayTo(t, mcs[0].Addr)
			c, _ := newTestCluster(t, mcs, func(o *Options) {
				o.Servers[0].Port = port
				o.Health.Timeout = slowTimeout
				o.Health.Interval = slowRound
			})
			n := c.topo.Load().nodes[0]
			c.checkAll(t.Context()) // answered: a kept connection
			if !n.available() {
				t.Fatalf("node down before it hangs: %s", n.status().Reason)
			}
			tc.hang(mcs[0], px)
			slowRounds(t, c, 2, func(i int) {
				if up := n.available(); up != (i < 2) {
					t.Fatalf("after round %d of a hung memcached, available = %v, want %v%s", i, up, i < 2, mcs[0].ResumedNote())
				}
			})
			if got := testutil.ToFloat64(n.m.probeSlow); got != 0 {
				t.Errorf("probes_slow_total = %v for a hung memcached, want 0", got)
			}
		})
	}
}

// TestSlowNodeNotReadmitted: a node out of service whose memcached
// answers each probe only after its deadline (the one before's answer
// in time) is not re-admitted: too slow to answer its own probe is no
// pass. Once it answers in time it is, after Rise rounds.
func TestSlowNodeNotReadmitted(t *testing.T) {
	c, n, px := slowCluster(t)
	n.eject("probe", errors.New("test"), false)
	px.SetLatency(slowRelay)
	slowRounds(t, c, 5, func(i int) {
		if n.available() {
			t.Fatalf("after round %d, a node out of service that answers only late was re-admitted", i)
		}
	})
	if got := testutil.ToFloat64(n.m.probeSlow); got < 3 {
		t.Errorf("probes_slow_total = %v after 5 rounds of late answers, want at least 3", got)
	}
	time.Sleep(slowRound) // the last late answer comes
	px.SetLatency(0)
	slowRounds(t, c, 3, func(int) {})
	if !n.available() {
		t.Fatalf("a node that answers in time again was not re-admitted after 3 rounds: %s", n.status().Reason)
	}
}

// TestSlowThenHungNodeFalls: a node whose probes were slow and whose
// memcached then stops answering is down within Fall rounds of the first
// that got no answer at all: the round after it hangs may still read the
// answer owed from before (slow), the next gets neither and closes the
// connection, and the one after fails on a new connection.
func TestSlowThenHungNodeFalls(t *testing.T) {
	c, n, px := slowCluster(t)
	px.SetLatency(slowRelay)
	slowRounds(t, c, 3, func(i int) {
		if !n.available() {
			t.Fatalf("after round %d of late answers, the node is down: %s", i, n.status().Reason)
		}
	})
	px.Blackhole(true)
	down := 0
	slowRounds(t, c, 4, func(i int) {
		if down == 0 && !n.available() {
			down = i
		}
	})
	t.Logf("down after round %d of the hang", down)
	if down == 0 || down > 3 {
		t.Fatalf("a node slow and then hung was down after round %d of the hang (0: not within 4), want within 3 (Fall 2, and one round that may read the answer owed)", down)
	}
}
