package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeProber answers probes from a switch the test flips; it stands in for
// the probe connection where time, not sockets, is under test.
type fakeProber struct {
	ok      atomic.Bool
	flushes atomic.Int32
	failIn  time.Duration // how long a failing Ping takes, as one that times out does
}

func (f *fakeProber) Ping(context.Context) error {
	if f.ok.Load() {
		return nil
	}
	time.Sleep(f.failIn)
	return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
}
func (f *fakeProber) FlushAll(context.Context) error { f.flushes.Add(1); return nil }
func (f *fakeProber) Close() error                   { return nil }

// fakeCluster builds a cluster of n nodes at unused addresses whose probes
// are fakes, all answering ok.
func fakeCluster(t *testing.T, n int, mod func(*Options)) (*Cluster, []*fakeProber) {
	t.Helper()
	o := Options{Health: HealthOptions{Interval: time.Second, Fall: 2, Rise: 2, PassiveFails: 3,
		FlapWindow: time.Minute, FlapBackoff: 10 * time.Second, FlapBackoffMax: 40 * time.Second}}
	for i := range n {
		o.Servers = append(o.Servers, Server{Host: fmt.Sprintf("node%d.invalid", i), Port: 11211})
	}
	if mod != nil {
		mod(&o)
	}
	c, err := New(o, testLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	probes := make([]*fakeProber, n)
	for i, nd := range c.topo.Load().nodes {
		probes[i] = &fakeProber{}
		probes[i].ok.Store(true)
		nd.probe = probes[i]
	}
	return c, probes
}

// waitUntil advances the bubble's clock second by second until cond holds
// and returns how long that took.
func waitUntil(t *testing.T, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("condition not met within %v", limit)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
	}
	return time.Since(start)
}

func TestFallRiseAndFlapBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, probes := fakeCluster(t, 3, nil)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.Run(ctx)
		synctest.Wait()
		if !c.Ready() {
			t.Fatal("Ready() = false after the first round with all probes passing")
		}
		n := c.topo.Load().nodes[1]

		probes[1].ok.Store(false)
		down := waitUntil(t, time.Minute, func() bool { return !n.available() })
		if down < time.Second || down > 2*time.Second {
			t.Errorf("node down after %v of failed probes, want Fall=2 rounds (1s..2s)", down)
		}
		probes[1].ok.Store(true)
		up := waitUntil(t, time.Minute, func() bool { return n.available() })
		if up < time.Second || up > 2*time.Second {
			t.Errorf("first re-admission after %v, want Rise=2 rounds (1s..2s)", up)
		}

		// It fails again within the flap window: the next re-admission waits
		// the back-off (10s plus up to 50% jitter) before passes count.
		for flap, base := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second} {
			probes[1].ok.Store(false)
			waitUntil(t, time.Minute, func() bool { return !n.available() })
			probes[1].ok.Store(true)
			up := waitUntil(t, 5*time.Minute, func() bool { return n.available() })
			if up < base || up > base+base/2+3*time.Second {
				t.Errorf("re-admission after flap %d took %v, want %v..%v", flap+1, up, base, base+base/2+3*time.Second)
			}
		}
		if got := n.status().Flaps; got != 4 {
			t.Errorf("flaps = %d, want 4", got)
		}

		// A stable minute forgets the flaps: the next ejection is a first one.
		time.Sleep(2 * time.Minute)
		probes[1].ok.Store(false)
		waitUntil(t, time.Minute, func() bool { return !n.available() })
		probes[1].ok.Store(true)
		if up := waitUntil(t, time.Minute, func() bool { return n.available() }); up > 2*time.Second {
			t.Errorf("re-admission after a stable period took %v, want Rise rounds only", up)
		}
	})
}

func TestPassiveEjectionCap(t *testing.T) {
	c, _ := fakeCluster(t, 4, func(o *Options) { o.Health.MaxEjectedPercent = 50 })
	refused := &NodeError{Node: "x", Op: "get", Err: fmt.Errorf("read: %w", syscall.ECONNRESET)}
	for i := range 4 {
		c.topo.Load().nodes[i].observe(refused)
	}
	if got, want := c.up(c.topo.Load()), 2; got != want {
		t.Errorf("after passive failures on all 4 nodes, %d are up, want %d (cap 50%%)", got, want)
	}
	refusedMetric := testutil.ToFloat64(c.m.ejectsRefused.WithLabelValues(c.topo.Load().nodes[3].name))
	if refusedMetric != 1 {
		t.Errorf("ejections_refused_total{%s} = %v, want 1", c.topo.Load().nodes[3].name, refusedMetric)
	}
	// Probes are not capped: they confirm the node is gone. Nor is a
	// connection refused at dial, which is what a probe would see.
	c.topo.Load().nodes[3].eject("probe", errors.New("probe failed"), false)
	if got, want := c.up(c.topo.Load()), 1; got != want {
		t.Errorf("after a probe ejection beyond the cap, %d are up, want %d", got, want)
	}
	c.topo.Load().nodes[2].observe(&NodeError{Node: "x", Op: "get", Err: fmt.Errorf("dial: %w", syscall.ECONNREFUSED), dial: true})
	if got, want := c.up(c.topo.Load()), 0; got != want {
		t.Errorf("after a connection refused at dial beyond the cap, %d are up, want %d", got, want)
	}
	c.topo.Load().nodes[2].mu.Lock()
	c.topo.Load().nodes[2].passes = 2
	c.topo.Load().nodes[2].mu.Unlock()
	c.topo.Load().nodes[2].admit()
	// Re-admission frees a passive slot again.
	c.topo.Load().nodes[0].mu.Lock()
	c.topo.Load().nodes[0].passes = 2
	c.topo.Load().nodes[0].mu.Unlock()
	c.topo.Load().nodes[0].admit()
	if got, want := c.up(c.topo.Load()), 2; got != want {
		t.Errorf("after re-admitting one node, %d are up, want %d", got, want)
	}
}

func TestPanicMode(t *testing.T) {
	c, _ := fakeCluster(t, 4, func(o *Options) { o.Health.PanicPercent = 50 })
	key := "k"
	owner := c.Placement(key).Chain[0].Node
	var ownerNode *node
	for _, n := range c.topo.Load().nodes {
		if n.name == owner {
			ownerNode = n
		}
	}
	ownerNode.eject("probe", errors.New("down"), false)
	if got := c.Placement(key).Serving; got == owner || got == "" {
		t.Errorf("with 3 of 4 up, key served by %q, want the next live node", got)
	}
	// Take two more down: 1 of 4 up (25% < 50%): panic, route as if all up.
	downed := 1
	for _, n := range c.topo.Load().nodes {
		if n != ownerNode && downed < 3 {
			n.eject("probe", errors.New("down"), false)
			downed++
		}
	}
	if !c.panicking(c.topo.Load()) {
		t.Fatal("panicking() = false with 1 of 4 nodes up and PanicPercent 50")
	}
	if got := c.Placement(key).Serving; got != owner {
		t.Errorf("in panic mode key served by %q, want its owner %q", got, owner)
	}
	// All down: no panic, fail fast.
	for _, n := range c.topo.Load().nodes {
		n.eject("probe", errors.New("down"), false)
	}
	if c.panicking(c.topo.Load()) {
		t.Error("panicking() = true with no node up")
	}
	// ErrNoNodes comes from picking the node, before any is contacted: a
	// Get that tried one would fail with that node's error instead.
	if _, err := c.Get(t.Context(), key); !errors.Is(err, ErrNoNodes) {
		t.Errorf("Get with all nodes down = %v, want ErrNoNodes", err)
	}
}

func TestFailFastPolicy(t *testing.T) {
	c, _ := fakeCluster(t, 3, func(o *Options) { o.Failover = FailFast })
	key := "k"
	p := c.Placement(key)
	for _, n := range c.topo.Load().nodes {
		if n.name == p.Chain[0].Node {
			n.eject("probe", errors.New("down"), false)
		}
	}
	if _, err := c.Get(t.Context(), key); !errors.Is(err, ErrNoNodes) {
		t.Errorf("Get with the owner down under %q = %v, want ErrNoNodes", FailFast, err)
	}
	if got := c.Placement(key).Serving; got != "" {
		t.Errorf("Placement().Serving with the owner down under %q = %q, want none", FailFast, got)
	}
}

func TestReadmitFlush(t *testing.T) {
	c, probes := fakeCluster(t, 2, func(o *Options) { o.Health.ReadmitFlush = true })
	ctx := t.Context()
	c.topo.Load().nodes[0].eject("probe", errors.New("down"), false)
	c.checkAll(ctx)
	c.checkAll(ctx)
	if !c.topo.Load().nodes[0].available() {
		t.Fatal("node not re-admitted after Rise passes")
	}
	if got := probes[0].flushes.Load(); got != 1 {
		t.Errorf("flush_all sent %d times before re-admission, want 1", got)
	}
	if got := probes[1].flushes.Load(); got != 0 {
		t.Errorf("flush_all sent to a node that never went down")
	}
}

func TestCapTTL(t *testing.T) {
	c := &Cluster{opts: Options{FailoverTTL: 60 * time.Second}}
	now := int32(time.Now().Unix())
	tests := []struct {
		in, want int32
	}{
		{0, 60},
		{10, 10},
		{60, 60},
		{3600, 60},
		{-1, -1},
		{relativeExpiryMax, 60},
		{now + 30, now + 30},
		{now + 3600, 60},
	}
	for _, tt := range tests {
		if got := c.capTTL(tt.in); got != tt.want {
			t.Errorf("capTTL(%d) = %d, want %d", tt.in, got, tt.want)
		}
	}
	c.opts.FailoverTTL = 0
	if got := c.capTTL(3600); got != 3600 {
		t.Errorf("capTTL(3600) without a cap = %d, want 3600", got)
	}
}

func TestReadyMinUpPercent(t *testing.T) {
	c, _ := fakeCluster(t, 4, func(o *Options) { o.Health.ReadyMinUpPercent = 75 })
	c.probedOnce.Do(func() { close(c.probed) })
	if !c.Ready() {
		t.Fatal("Ready() = false with 4 of 4 up")
	}
	c.topo.Load().nodes[0].eject("probe", errors.New("down"), false)
	if !c.Ready() {
		t.Error("Ready() = false with 3 of 4 up and 75% needed")
	}
	c.topo.Load().nodes[1].eject("probe", errors.New("down"), false)
	if c.Ready() {
		t.Error("Ready() = true with 2 of 4 up and 75% needed")
	}
	if got, want := c.Unready(), "2 of 4 memcached nodes up, 3 needed (75%)"; got != want {
		t.Errorf("Unready() = %q, want %q", got, want)
	}
}

// TestUnready: what /readyz says when the cluster cannot serve.
func TestUnready(t *testing.T) {
	c, _ := fakeCluster(t, 2, nil)
	if got, want := c.Unready(), "the first round of health checks has not finished"; got != want {
		t.Errorf("Unready() before the first round = %q, want %q", got, want)
	}
	c.probedOnce.Do(func() { close(c.probed) })
	if got := c.Unready(); got != "" {
		t.Errorf("Unready() with 2 of 2 up = %q, want \"\"", got)
	}
	for _, n := range c.topo.Load().nodes {
		n.eject("probe", errors.New("down"), false)
	}
	if got, want := c.Unready(), "no memcached node is up (0 of 2)"; got != want {
		t.Errorf("Unready() with every node down = %q, want %q", got, want)
	}
}

// TestUnreadyUntilANodeAnswers: a node stays up until Health.Fall probes
// fail in a row, but a gateway whose nodes have not answered one probe
// since its start is not ready; otherwise /readyz would answer 200 from
// the first round to the Fall-th with every node unreachable.
func TestUnreadyUntilANodeAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, probes := fakeCluster(t, 2, nil)
		for _, p := range probes {
			p.ok.Store(false)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.Run(ctx)
		synctest.Wait()
		if !c.Probed() {
			t.Fatal("Probed() = false after the first round")
		}
		if n := c.topo.Load().nodes[0]; !n.available() {
			t.Fatal("a node is down after one failed probe; want Fall=2 (the case under test)")
		}
		if got, want := c.Unready(), "no memcached node is up (0 of 2)"; got != want {
			t.Errorf("Unready() after a first round no node answered = %q, want %q", got, want)
		}

		probes[1].ok.Store(true)
		waitUntil(t, 3*time.Second, c.Ready)
		if got := c.Unready(); got != "" {
			t.Errorf("Unready() with one node answering = %q, want \"\"", got)
		}

		// A node seen in service keeps counting until it is down: one
		// failed probe does not take readiness away.
		probes[1].ok.Store(false)
		time.Sleep(time.Second)
		synctest.Wait()
		if n := c.topo.Load().nodes[1]; n.status().ProbeFails != 1 {
			t.Fatalf("probe fails = %d, want 1", n.status().ProbeFails)
		}
		if got := c.Unready(); got != "" {
			t.Errorf("Unready() after one failed probe of a node seen in service = %q, want \"\"", got)
		}
	})
}

// TestGatewaysReadmitTogether: two gateways (clusters) started 370 ms
// apart, probing the same node, re-admit it at the same moment after a
// first outage and after flaps, one of them ejected by one gateway's
// traffic before the probes failed: their rounds fall on the clock's
// multiples of the interval, the hold-down's jitter is the node's own,
// and it counts from the last failed probe's round. With rounds counted
// from each start they re-admitted 370 or 630 ms apart, after a flap up
// to half a hold-down (5 s here) apart, and by ejections a second apart
// a second apart: reads through the first that found the node's older
// values of keys the other still wrote elsewhere.
func TestGatewaysReadmitTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var nodes [2]*node
		var probes [2]*fakeProber
		for i := range nodes {
			if i > 0 {
				time.Sleep(370 * time.Millisecond)
			}
			c, p := fakeCluster(t, 1, nil)
			nodes[i], probes[i] = c.topo.Load().nodes[0], p[0]
			go c.Run(ctx)
		}
		synctest.Wait()
		set := func(ok bool) {
			for _, p := range probes {
				p.ok.Store(ok)
			}
		}
		// when returns the moments each node's availability becomes up,
		// polled every 10 ms of the bubble's clock.
		when := func(up bool) [2]time.Time {
			t.Helper()
			var at [2]time.Time
			for deadline := time.Now().Add(5 * time.Minute); at[0].IsZero() || at[1].IsZero(); {
				if time.Now().After(deadline) {
					t.Fatalf("nodes not %v within 5 minutes: %v", up, at)
				}
				for i, n := range nodes {
					if at[i].IsZero() && n.available() == up {
						at[i] = time.Now()
					}
				}
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
			}
			return at
		}
		for _, phase := range []string{"an outage", "a flap", "a flap one gateway's traffic saw first"} {
			time.Sleep(500 * time.Millisecond)
			if phase == "a flap one gateway's traffic saw first" {
				// Ejected by its own requests' timeouts, 700 ms before
				// the probes fail: the hold-down counts from the last
				// failed probe in both, not from each ejection.
				nodes[0].eject("timeouts", errors.New("i/o timeout"), false)
				time.Sleep(700 * time.Millisecond)
			}
			set(false)
			down := when(false)
			time.Sleep(2 * time.Second)
			time.Sleep(500 * time.Millisecond)
			set(true)
			up := when(true)
			if d := up[1].Sub(up[0]).Abs(); d > 10*time.Millisecond {
				t.Errorf("after %s the gateways re-admitted the node %v apart (down at %v and %v, up at %v and %v), want together",
					phase, d, down[0].Format("15:04:05.000"), down[1].Format("15:04:05.000"), up[0].Format("15:04:05.000"), up[1].Format("15:04:05.000"))
			}
		}
		if f := nodes[1].status().Flaps; f != 2 {
			t.Errorf("flaps = %d, want 2: the second and third outages are to be flaps", f)
		}
	})
}

// TestBackoffIsTheNodes: a flap's hold-down is the same for a node in
// every gateway, within FlapBackoff·2^(k-1) plus half of it, and spread
// over the nodes.
func TestBackoffIsTheNodes(t *testing.T) {
	newPolicy := func() *healthPolicy {
		return &healthPolicy{HealthOptions: HealthOptions{FlapBackoff: 5 * time.Second, FlapBackoffMax: 2 * time.Minute}}
	}
	a, b := newPolicy(), newPolicy()
	seen := map[time.Duration]bool{}
	for i := range 32 {
		name := fmt.Sprintf("10.0.0.%d:11211", i)
		for flaps, base := range []time.Duration{0, 5 * time.Second, 10 * time.Second, 20 * time.Second} {
			got := a.backoff(name, flaps)
			if other := b.backoff(name, flaps); other != got {
				t.Errorf("backoff(%s, %d) = %v in one gateway, %v in another", name, flaps, got, other)
			}
			if got < base || got > base+base/2 {
				t.Errorf("backoff(%s, %d) = %v, want %v..%v", name, flaps, got, base, base+base/2)
			}
			if flaps == 1 {
				seen[got] = true
			}
		}
	}
	if len(seen) < 24 {
		t.Errorf("32 nodes' first hold-downs take %d values, want them spread", len(seen))
	}
}

// TestNextRound: the round after now is the clock's next multiple of
// the interval, never the round just run again (a timer that fired as
// the wall clock stepped back a little leaves now just before it), and
// after a step back by hours not hours away.
func TestNextRound(t *testing.T) {
	day := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		now      time.Time
		last     time.Time
		interval time.Duration
		want     time.Time
	}{
		{"at a multiple", day, time.Time{}, time.Second, day.Add(time.Second)},
		{"within an interval", day.Add(370 * time.Millisecond), time.Time{}, time.Second, day.Add(time.Second)},
		{"just before a multiple", day.Add(999 * time.Millisecond), time.Time{}, time.Second, day.Add(time.Second)},
		{"2s", day.Add(1500 * time.Millisecond), time.Time{}, 2 * time.Second, day.Add(2 * time.Second)},
		{"300ms", day.Add(10 * time.Millisecond), time.Time{}, 300 * time.Millisecond, day.Add(300 * time.Millisecond)},
		{"another zone", day.In(time.FixedZone("UTC+5:30", 5*3600+1800)).Add(time.Second / 2), time.Time{}, time.Second, day.Add(time.Second)},
		{"after the round at a multiple", day.Add(20 * time.Millisecond), day, time.Second, day.Add(time.Second)},
		{"a round that ran past two multiples", day.Add(2300 * time.Millisecond), day, time.Second, day.Add(3 * time.Second)},
		{"wall clock a little behind the round just run", day.Add(-time.Millisecond), day, time.Second, day.Add(time.Second)},
		{"wall clock stepped back hours", day.Add(-3*time.Hour + 200*time.Millisecond), day, time.Second, day.Add(-3*time.Hour + time.Second)},
		{"wall clock stepped forward hours", day.Add(3*time.Hour + 200*time.Millisecond), day, time.Second, day.Add(3*time.Hour + time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextRound(tt.now, tt.last, tt.interval); !got.Equal(tt.want) {
				t.Errorf("nextRound(%v, %v, %v) = %v, want %v", tt.now, tt.last, tt.interval, got, tt.want)
			}
		})
	}
}

// TestEjectingProbeHoldsFromItsRound: a flap's hold-down counts from the
// start of the round whose probe ejected the node, as from any failed
// probe's, not from the moment its answer came: a probe that times out
// answers a timeout after the round began, and a gateway that ejected by
// that probe would otherwise re-admit a round after one that ejected by
// its traffic and saw the same probe fail.
func TestEjectingProbeHoldsFromItsRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, probes := fakeCluster(t, 1, func(o *Options) { o.Health.Fall = 1 })
		n, p := c.topo.Load().nodes[0], probes[0]
		p.failIn = 400 * time.Millisecond
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.Run(ctx)
		synctest.Wait()
		p.ok.Store(false) // an outage: ejected, no hold
		waitUntil(t, time.Minute, func() bool { return !n.available() })
		p.ok.Store(true)
		waitUntil(t, time.Minute, n.available)
		p.ok.Store(false) // a flap: ejected, held
		waitUntil(t, time.Minute, func() bool { return !n.available() })

		n.mu.Lock()
		hold, from := n.hold, n.holdUntil.Add(-n.hold)
		n.mu.Unlock()
		if hold == 0 {
			t.Fatal("no hold-down after a flap")
		}
		if !from.Equal(from.Truncate(c.opts.Health.Interval)) {
			t.Errorf("hold-down after the ejecting probe counts from %v, want its round's start %v",
				from.Format("15:04:05.000"), from.Truncate(c.opts.Health.Interval).Format("15:04:05.000"))
		}
	})
}

// TestHoldAcrossAWallClockStep: a flap's hold-down counts on the wall
// clock, as the rounds do (decision 0070), so a step of the wall clock
// moves it: a step back by hours, after the hold was set, holds the node
// out of service no longer than a hold from the round that sees the
// step, not for the hours stepped. A step forward ends it at once;
// HEALTH_RISE passes still count.
func TestHoldAcrossAWallClockStep(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		step time.Duration // of the wall clock after the failed probe at t0
		want int           // the round, counted in seconds after the step, that re-admits
	}{
		{"no step", 0, 11},                      // passes count from t0+10s: rounds 10 and 11
		{"stepped back 3h", -3 * time.Hour, 12}, // held from round 1: passes at 11 and 12
		{"stepped forward 3h", 3 * time.Hour, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := fakeCluster(t, 1, nil)
			n := c.topo.Load().nodes[0]
			n.up.Store(false) // down, a flap's hold-down of 10s
			n.mu.Lock()
			n.hold = 10 * time.Second
			n.mu.Unlock()
			n.probeResult(errors.New("refused"), t0)
			got := 0
			for k := 1; k <= 120 && got == 0; k++ {
				if n.probeResult(nil, t0.Add(tt.step+time.Duration(k)*time.Second)) == probeReadmit {
					got = k
				}
			}
			if got != tt.want {
				t.Errorf("re-admitted at round %d after the step (0: not within 120), want %d", got, tt.want)
			}
		})
	}
}
