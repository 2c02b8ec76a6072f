package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// These tests put real memcached processes (and our fault proxy) under a
// running cluster and log the figures docs/operations.md quotes: detection and
// re-admission times, errors during a kill, latency with every node down.

// faultOptions are the production defaults with a faster probe interval so
// the tests finish quickly; data timeouts are as shipped.
func faultOptions(o *Options) {
	o.Timeout = 500 * time.Millisecond
	o.MaxConns, o.MaxIdleConns, o.MaxInFlight = 16, 16, 16
	o.Health = HealthOptions{Interval: 200 * time.Millisecond, Timeout: 300 * time.Millisecond,
		Fall: 2, Rise: 2, PassiveFails: 3, MaxEjectedPercent: 100,
		// Faults follow each other within seconds here; flap back-off has its
		// own test (TestFallRiseAndFlapBackoff).
		FlapBackoff: 100 * time.Millisecond, FlapBackoffMax: 200 * time.Millisecond}
	o.FailoverTTL = 60 * time.Second
}

func runCluster(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(5 * time.Second)
	for !c.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("cluster not ready within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loader sends a steady, bounded stream of reads and writes (one every
// period, from a few workers) and records every error with its time.
type loader struct {
	mu     sync.Mutex
	errs   []time.Time
	ok     atomic.Int64
	stop   chan struct{}
	done   sync.WaitGroup
	detail []string
}

func startLoad(c *Cluster, workers int, period time.Duration, keys []string) *loader {
	l := &loader{stop: make(chan struct{})}
	for w := range workers {
		l.done.Go(func() {
			t := time.NewTicker(period)
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				case <-t.C:
				}
				key := keys[(i*workers+w)%len(keys)]
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				var err error
				if i%4 == 0 {
					err = c.Set(ctx, Item{Key: key, Value: []byte("v")})
				} else if _, err = c.Get(ctx, key); errors.Is(err, ErrNotFound) {
					err = nil
				}
				cancel()
				if err != nil {
					l.mu.Lock()
					l.errs = append(l.errs, time.Now())
					if len(l.detail) < 5 {
						l.detail = append(l.detail, err.Error())
					}
					l.mu.Unlock()
				} else {
					l.ok.Add(1)
				}
			}
		})
	}
	return l
}

// ops is how many operations the load has finished, failed or not.
func (l *loader) ops() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok.Load() + int64(len(l.errs))
}

// waitOps waits until the load has finished n more operations, so that
// what follows is measured over load that ran, however slow the machine.
func (l *loader) waitOps(t *testing.T, n int64) {
	t.Helper()
	want := l.ops() + n
	waitFor(t, 30*time.Second, fmt.Sprintf("%d more operations of the load", n), func() bool { return l.ops() >= want })
}

func (l *loader) Stop() {
	close(l.stop)
	l.done.Wait()
}

// errorsSince counts errors at or after t.
func (l *loader) errorsSince(t time.Time) (n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errs {
		if !e.Before(t) {
			n++
		}
	}
	return n
}

func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key:%d", i)
	}
	return keys
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

func TestKillOneOfThreeUnderLoad(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, _ := newTestCluster(t, mcs, faultOptions)
	runCluster(t, c)
	keys := testKeys(300)
	before := map[string]string{}
	for _, k := range keys {
		before[k] = c.Placement(k).Serving
	}
	l := startLoad(c, 4, 4*time.Millisecond, keys) // ~1000 ops/s
	l.waitOps(t, 300)
	victim := c.topo.Load().nodes[1]
	killed := time.Now()
	mcs[1].Kill()
	waitFor(t, 5*time.Second, "ejection after SIGKILL", func() bool { return !victim.available() })
	ejected := victim.status().Since
	detect := ejected.Sub(killed)
	l.waitOps(t, 1000) // after the ejection, every one must succeed
	l.Stop()
	during := l.errorsSince(killed) - l.errorsSince(ejected)
	after := l.errorsSince(ejected.Add(50 * time.Millisecond))
	t.Logf("SIGKILL → ejected in %v; errors during detection %d, after ejection %d, successful ops %d; first errors: %q",
		detect, during, after, l.ok.Load(), l.detail)
	if after != 0 {
		t.Errorf("%d errors after the dead node was ejected, want 0", after)
	}
	moved := 0
	for _, k := range keys {
		now := c.Placement(k).Serving
		if before[k] != victim.name && now != before[k] {
			moved++
		}
		if before[k] == victim.name && now == victim.name {
			t.Errorf("key %s still served by the dead node", k)
		}
	}
	if moved != 0 {
		t.Errorf("%d keys of live nodes moved, want 0", moved)
	}

	mcs[1].Restart()
	restarted := time.Now()
	readmit := waitFor(t, 5*time.Second, "re-admission after restart", victim.available)
	t.Logf("restart → re-admitted in %v (Rise=2, interval 200ms)", readmit)
	_ = restarted
	for _, k := range keys {
		if got := c.Placement(k).Serving; got != before[k] {
			t.Errorf("after re-admission key %s served by %s, want %s again", k, got, before[k])
		}
	}
}

func TestPausedNodeTimesOutThenRejoins(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, _ := newTestCluster(t, mcs, faultOptions)
	runCluster(t, c)
	keys := testKeys(300)
	l := startLoad(c, 4, 4*time.Millisecond, keys)
	defer l.Stop()
	l.waitOps(t, 200)
	victim := c.topo.Load().nodes[2]
	paused := time.Now()
	mcs[2].Pause()
	waitFor(t, 5*time.Second, "ejection after SIGSTOP", func() bool { return !victim.available() })
	st := victim.status()
	t.Logf("SIGSTOP → ejected in %v (%s); errors meanwhile %d (writes that timed out; reads retried elsewhere)",
		st.Since.Sub(paused), st.Reason, l.errorsSince(paused))
	mcs[2].Resume()
	readmit := waitFor(t, 5*time.Second, "re-admission after SIGCONT", victim.available)
	st = victim.status()
	t.Logf("SIGCONT → re-admitted in %v (%s)", readmit, st.Reason)
	// Rise=2 promises two passed probes, not a time: the probe sent while
	// the node was stopped passes as it resumes, and the next round may
	// come any time within an interval of it.
	var passes int
	if _, err := fmt.Sscanf(st.Reason, "%d probes passed", &passes); err != nil || passes < 2 {
		t.Errorf("re-admitted as %q, want at least 2 probes passed (Rise=2)", st.Reason)
	}
}

func TestAllDownThenUp(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, faultOptions)
	runCluster(t, c)
	for _, m := range mcs {
		m.Kill()
	}
	waitFor(t, 5*time.Second, "all nodes down", func() bool { return c.up(c.topo.Load()) == 0 })
	if c.Ready() {
		t.Error("Ready() with every node down")
	}
	// Immediate: a Get that tried a node's socket after all would fail
	// with that node's error (the dial refused), not ErrNoNodes, and one
	// waiting for a slot (no deadline) would never return.
	var worst time.Duration
	for range 100 {
		start := time.Now()
		if _, err := c.Get(t.Context(), "k"); !errors.Is(err, ErrNoNodes) {
			t.Fatalf("Get with all nodes down = %v, want ErrNoNodes", err)
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("all nodes down: Get answers ErrNoNodes in at most %v (100 calls)", worst)
	for _, m := range mcs {
		m.Restart()
	}
	waitFor(t, 5*time.Second, "recovery", c.Ready)
	if err := c.Set(t.Context(), Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Errorf("Set after recovery = %v", err)
	}
}

// relayTo starts a fault-injecting relay to addr, closed when the test
// ends, and returns it with its port, for a node's Server.Port.
func relayTo(t *testing.T, addr string) (*faultproxy.TCP, int) {
	t.Helper()
	px := faultproxy.NewTCP(addr)
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	_, portStr, _ := net.SplitHostPort(px.Addr())
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatal(err)
	}
	return px, port
}

// TestFaultProxy drives failures signals cannot: a blackhole (packets
// vanish, connections stay open), a reset, and latency below the timeout,
// which must not eject anything.
func TestFaultProxy(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	px, port := relayTo(t, mcs[0].Addr)
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		faultOptions(o)
		o.Servers[0].Port = port
	})
	runCluster(t, c)
	proxied := c.topo.Load().nodes[0]
	keys := testKeys(200)
	l := startLoad(c, 4, 4*time.Millisecond, keys)
	defer l.Stop()

	px.SetLatency(50 * time.Millisecond) // slow, not dead
	time.Sleep(time.Second)
	if !proxied.available() {
		t.Fatalf("50ms of latency (timeout 500ms) ejected the node: %s", proxied.status().Reason)
	}
	px.SetLatency(0)

	px.Blackhole(true)
	d := waitFor(t, 5*time.Second, "ejection on blackhole", func() bool { return !proxied.available() })
	t.Logf("blackhole → ejected in %v (%s)", d, proxied.status().Reason)
	px.Blackhole(false)
	px.Reset() // the swallowed connections stay dead; drop them
	d = waitFor(t, 5*time.Second, "re-admission after blackhole", proxied.available)
	t.Logf("blackhole lifted → re-admitted in %v", d)

	px.SetRefuse(true)
	px.Reset()
	d = waitFor(t, 5*time.Second, "ejection on reset", func() bool { return !proxied.available() })
	t.Logf("connection reset → ejected in %v (%s)", d, proxied.status().Reason)
	px.SetRefuse(false)
	waitFor(t, 5*time.Second, "re-admission after reset", proxied.available)
}

func TestFailoverWritesGetCappedTTL(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, faultOptions)
	runCluster(t, c)
	key := keyOwnedBy(t, c, 0)
	mcs[0].Kill()
	waitFor(t, 5*time.Second, "ejection", func() bool { return !c.topo.Load().nodes[0].available() })
	if err := c.Set(t.Context(), Item{Key: key, Value: []byte("v"), Expiration: 3600}); err != nil {
		t.Fatal(err)
	}
	ttl := metaTTL(t, mcs[1].Addr, key)
	if ttl <= 0 || ttl > 60 {
		t.Errorf("TTL of a failed-over write = %d, want capped to at most 60 (FailoverTTL)", ttl)
	}
	other := keyOwnedBy(t, c, 1)
	if err := c.Set(t.Context(), Item{Key: other, Value: []byte("v"), Expiration: 3600}); err != nil {
		t.Fatal(err)
	}
	if ttl := metaTTL(t, mcs[1].Addr, other); ttl < 3000 {
		t.Errorf("TTL of a write on its owner = %d, want about 3600 (uncapped)", ttl)
	}
}

// metaTTL reads an item's remaining TTL with memcached's meta get.
func metaTTL(t *testing.T, addr, key string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "mg %s t\r\n", key)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, "t") {
			v, _ := strconv.Atoi(f[1:])
			return v
		}
	}
	t.Fatalf("mg %s t = %q, want a t flag", key, line)
	return 0
}
