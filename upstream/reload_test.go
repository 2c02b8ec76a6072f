package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/hashring"
	"github.com/memcgate/memcgate/upstream/op"
)

// owners returns the node name that owns each key now.
func owners(c *Cluster, keys []string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		out[k] = c.Placement(k).Chain[0].Node
	}
	return out
}

// TestSetServers: nodes added and removed while operations run, with no
// failed operation; only the keys of the changed node move; a kept node
// keeps its connections and health; a removed node's connections close
// once it is idle.
func TestSetServers(t *testing.T) {
	mcs := memcachedtest.StartN(t, 4)
	servers := func(ms ...*memcachedtest.Server) []Server {
		var out []Server
		for _, m := range ms {
			out = append(out, Server{Host: "127.0.0.1", Port: m.Port, Weight: 1})
		}
		return out
	}
	c, _ := newTestCluster(t, mcs[:3], nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runDone := make(chan struct{})
	go func() { c.Run(ctx); close(runDone) }()
	defer func() { cancel(); <-runDone }()

	var keys []string
	for i := range 3000 {
		keys = append(keys, fmt.Sprint("key-", i))
	}
	// Load: reads and writes of the keys until stopped, counting failures.
	var failures atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; ; i += 4 {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[i%len(keys)]
				v := op.Verb(op.Set)
				if i%3 != 0 {
					v = op.Get
				}
				r := c.Do(ctx, op.Op{Verb: v, Item: op.Item{Key: k, Value: []byte("v")}})
				if r.Err != nil && !errors.Is(r.Err, ErrNotFound) {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, r.Err)
				}
			}
		})
	}

	tests := []struct {
		name    string
		servers []Server
		added   int
		removed int
	}{
		{"add a node", servers(mcs...), 1, 0},
		{"remove a node", servers(mcs[0], mcs[2], mcs[3]), 0, 1},
		{"back to three", servers(mcs[0], mcs[1], mcs[2]), 1, 1},
	}
	for _, tt := range tests {
		before := owners(c, keys)
		keptNode := c.topo.Load().nodes[0]
		time.Sleep(50 * time.Millisecond)
		ch, err := c.SetServers(t.Context(), tt.servers, hashring.Ketama)
		if err != nil {
			t.Fatalf("%s: SetServers: %v", tt.name, err)
		}
		if len(ch.Added) != tt.added || len(ch.Removed) != tt.removed || ch.Reweighted {
			t.Errorf("%s: change = %+v, want %d added, %d removed", tt.name, ch, tt.added, tt.removed)
		}
		if c.topo.Load().nodes[0] != keptNode {
			t.Errorf("%s: the first node was rebuilt, want it kept", tt.name)
		}
		after := owners(c, keys)
		moved := 0
		for _, k := range keys {
			if before[k] != after[k] {
				moved++
				changed := false
				for _, n := range append(ch.Added, ch.Removed...) {
					changed = changed || before[k] == n || after[k] == n
				}
				if !changed {
					t.Errorf("%s: %s moved from %s to %s, neither of which changed", tt.name, k, before[k], after[k])
				}
			}
		}
		t.Logf("%s: %d of %d keys moved (%.1f%%)", tt.name, moved, len(keys), 100*float64(moved)/float64(len(keys)))
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Errorf("%d operations failed during the changes; first: %v", n, firstErr.Load())
	}
	// The node removed last (mcs[3]) is closed once idle: its data
	// connections go.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := memcachedtest.CurrConnections(mcs[3].Addr)
		if err == nil && n <= 1 { // our stats connection
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removed node still has %d connections (%v)", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSetServersNewNodeDown: a node added while it does not answer takes
// no traffic until its probes pass.
func TestSetServersNewNodeDown(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs[:1], nil)
	mcs[1].Kill()
	if _, err := c.SetServers(t.Context(), []Server{{Host: "127.0.0.1", Port: mcs[0].Port}, {Host: "127.0.0.1", Port: mcs[1].Port}}, hashring.Ketama); err != nil {
		t.Fatal(err)
	}
	st := c.Nodes()
	if len(st) != 2 || !st[0].Up || st[1].Up {
		t.Fatalf("after adding a dead node: %+v, want it down", st)
	}
	for i := range 200 {
		if err := c.Set(t.Context(), Item{Key: fmt.Sprint("k", i), Value: []byte("v")}); err != nil {
			t.Fatalf("set with a dead node added: %v", err)
		}
	}
	if _, err := c.SetServers(t.Context(), nil, hashring.Ketama); err == nil {
		t.Error("SetServers(none) succeeded")
	}
}

// TestSetServersReaddedNodeNotStale: with ReadmitFlush, a node removed and
// then added again serves none of the values it held before its removal,
// since its keys were written on the other nodes meanwhile: reads never go
// back in time. Without, it keeps what it held (other clients of the same
// memcached may be writing it): a key no one wrote meanwhile is still
// there.
func TestSetServersReaddedNodeNotStale(t *testing.T) {
	for _, flush := range []bool{true, false} {
		t.Run(fmt.Sprintf("readmit-flush=%v", flush), func(t *testing.T) { testReaddedNode(t, flush) })
	}
}

func testReaddedNode(t *testing.T, flush bool) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Health.ReadmitFlush = flush
		// Nothing here stalls: timeouts that a loaded machine does not hit.
		o.Timeout, o.Health.Timeout = 5*time.Second, 5*time.Second
	})
	ctx := t.Context()
	both := []Server{{Host: "127.0.0.1", Port: mcs[0].Port, Weight: 1}, {Host: "127.0.0.1", Port: mcs[1].Port, Weight: 1}}
	set := func(v string) {
		t.Helper()
		for i := range 100 {
			if err := c.Set(ctx, Item{Key: fmt.Sprint("k", i), Value: []byte(v)}); err != nil {
				t.Fatalf("set %s: %v", v, err)
			}
		}
	}
	set("old")
	// A key only other clients of the node use, written on it directly.
	direct := memcache.New(mcs[1].Addr)
	if err := direct.Set(&memcache.Item{Key: "theirs", Value: []byte("kept")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetServers(t.Context(), both[:1], hashring.Ketama); err != nil {
		t.Fatal(err)
	}
	set("new")
	ch, err := c.SetServers(t.Context(), both, hashring.Ketama)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Added) != 1 {
		t.Fatalf("change = %+v, want one node added", ch)
	}
	stale := 0
	for i := range 100 {
		it, err := c.Get(ctx, fmt.Sprint("k", i))
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatalf("get: %v", err)
		}
		if err == nil && string(it.Value) != "new" {
			stale++
		}
	}
	theirs, err := direct.Get("theirs")
	kept := err == nil && string(theirs.Value) == "kept"
	switch {
	case flush && stale > 0:
		t.Errorf("%d of 100 keys read a value overwritten while their node was removed", stale)
	case flush && kept:
		t.Error("the node added again was not flushed")
	case !flush && !kept:
		t.Error("the node added again was flushed without MEMCGATE_READMIT_FLUSH")
	}
}

// TestSetServersKeysBack: a server list that gives nodes that stay keys
// they owned under an earlier one names them (Change.KeysBack, logged at
// warn): none of those keys' writes meanwhile reached them, so they serve
// what they held before (the keys of a node added and removed again read
// their values from before the node came, and did so unannounced). Every
// key that reads stale is on a node named (or on one added again, which
// is warned about apart); a change that gives no node keys it owned
// before names none.
func TestSetServersKeysBack(t *testing.T) {
	mcs := memcachedtest.StartN(t, 4)
	server := func(m *memcachedtest.Server, weight int) Server {
		return Server{Host: "127.0.0.1", Port: m.Port, Weight: weight}
	}
	three := []Server{server(mcs[0], 1), server(mcs[1], 1), server(mcs[2], 1)}
	four := append(slices.Clone(three), server(mcs[3], 1))
	heavy := []Server{server(mcs[0], 1), server(mcs[1], 1), server(mcs[2], 3)}
	c, _ := newTestCluster(t, mcs[:3], nil)
	ctx := t.Context()
	var keys []string
	for i := range 300 {
		keys = append(keys, fmt.Sprint("back-", i))
	}
	steps := []struct {
		name    string
		servers []Server
		back    bool // nodes are named
	}{
		{"a node added", four, false},
		{"the added node removed", three, true},
		{"a node from the start removed", three[:2], false},
		{"the removed node added again", three, false}, // stale on it, warned as a node added holding items
		{"a node weighted up", heavy, false},
		{"the weight change undone", three, true},
	}
	for i, st := range steps {
		// Every key written before the change, with the step's value.
		want := fmt.Sprint("v", i)
		for _, k := range keys {
			if err := c.Set(ctx, Item{Key: k, Value: []byte(want)}); err != nil {
				t.Fatalf("%s: set: %v", st.name, err)
			}
		}
		ch, err := c.SetServers(t.Context(), st.servers, hashring.Ketama)
		if err != nil {
			t.Fatalf("%s: SetServers: %v", st.name, err)
		}
		if (len(ch.KeysBack) > 0) != st.back {
			t.Errorf("%s: keys back on %v, want some: %v", st.name, ch.KeysBack, st.back)
		}
		stale := 0
		for _, k := range keys {
			it, err := c.Get(ctx, k)
			if err != nil || string(it.Value) == want {
				continue // a miss (a node new to the key) or the value written
			}
			stale++
			// A node added is not among them: it is flushed first
			// (Health.ReadmitFlush) or warned about on its own.
			if owner := c.Placement(k).Chain[0].Node; !slices.Contains(ch.KeysBack, owner) && !slices.Contains(ch.Added, owner) {
				t.Errorf("%s: %s reads %q, written %q, on %s, which the change does not name (%v)", st.name, k, it.Value, want, owner, ch.KeysBack)
			}
		}
		t.Logf("%s: %d of %d keys read stale, on %v", st.name, stale, len(keys), ch.KeysBack)
	}
}

// blackholes starts n fault proxies that hang (faultproxy.StartHanging),
// closed when the test ends, before the cleanups registered earlier run
// (a health checker waiting for their probes).
func blackholes(t *testing.T, n int) ([]Server, []*faultproxy.TCP) {
	t.Helper()
	pxs, err := faultproxy.StartHanging(n)
	if err != nil {
		t.Fatal(err)
	}
	var servers []Server
	for _, px := range pxs {
		t.Cleanup(func() { px.Close() })
		_, port, _ := net.SplitHostPort(px.Addr())
		p, _ := strconv.Atoi(port)
		servers = append(servers, Server{Host: "127.0.0.1", Port: p, Weight: 1})
	}
	return servers, pxs
}

// TestSetServersProbedNodeUpWhateverItsStats: a node added whose probe
// answers within the wait takes traffic, even if the stats of what it
// holds, asked after the probe, have not come when the wait ends: it
// answered. On a loaded machine the stats took the wait's rest (probe
// 238 ms, stats 114 ms more, wait 300 ms), and the node started down,
// "no answer within 300ms"; a list with no other node was refused.
// What it holds unknown, it is counted as holding items.
func TestSetServersProbedNodeUpWhateverItsStats(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	_, pxs := blackholes(t, 1)
	var dials atomic.Int32
	c, _ := newTestCluster(t, mcs[:1], func(o *Options) {
		o.Timeout, o.Health.Timeout = 5*time.Second, time.Second
		// The probe reaches mcs[1]; any later connection to it (the
		// stats of what it holds) hangs.
		o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
			if address == mcs[1].Addr && dials.Add(1) > 1 {
				address = pxs[0].Addr()
			}
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		}
	})
	if _, err := c.SetServers(t.Context(), serversOf(mcs[1]), hashring.Ketama); err != nil {
		t.Fatalf("a list whose node answers its probe: %v", err)
	}
	st := c.Nodes()[0]
	if !st.Up {
		t.Errorf("%s, whose probe answered: down (%s), want up", st.Node, st.Reason)
	}
	if got := testutil.ToFloat64(c.m.unknown.WithLabelValues(st.Node)); got != 1 {
		t.Errorf("readmit_unknown_history_total = %v, want 1 (what it holds is unknown)", got)
	}
}

// serversOf is mcs as a server list.
func serversOf(mcs ...*memcachedtest.Server) []Server {
	var out []Server
	for _, m := range mcs {
		out = append(out, Server{Host: "127.0.0.1", Port: m.Port, Weight: 1})
	}
	return out
}

// TestSetServersDeadNodesAtOnce: SetServers adding many nodes that hang
// returns within about one probe timeout (it took one per node, one after
// another), with those nodes down and a node added that answers up.
func TestSetServersDeadNodesAtOnce(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	const timeout = 300 * time.Millisecond
	c, _ := newTestCluster(t, mcs[:1], func(o *Options) { o.Health.Timeout = timeout })
	dead, _ := blackholes(t, 32)
	start := time.Now()
	ch, err := c.SetServers(t.Context(), append(serversOf(mcs...), dead...), hashring.Ketama)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("adding %d nodes that hang took %v (probe timeout %v)", len(dead), took, timeout)
	// Generous for a loaded machine; one after another it is 32 timeouts.
	if took > 10*timeout {
		t.Errorf("adding %d nodes that hang took %v, want about one probe timeout (%v)", len(dead), took, timeout)
	}
	if len(ch.Added) != len(dead)+1 {
		t.Errorf("%d nodes added, want %d", len(ch.Added), len(dead)+1)
	}
	for _, st := range c.Nodes() {
		if want := st.Node == mcs[0].Addr || st.Node == mcs[1].Addr; st.Up != want {
			t.Errorf("%s: up %v, want %v (%s)", st.Node, st.Up, want, st.Reason)
		}
	}
	if !c.Ready() && c.Probed() {
		t.Error("not ready with two nodes up")
	}
}

// TestSetServersWaitsWithoutLocks: while SetServers waits for the probes
// of nodes that hang, all in flight at once, operations, Ready, Nodes and
// the health checker's rounds go on (Ready went false as soon as one of
// them failed, the health checker waited for the whole reload); a
// SetServers whose context ends returns then, with those nodes down.
func TestSetServersWaitsWithoutLocks(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, reg := newTestCluster(t, mcs, func(o *Options) {
		o.Health.Timeout = time.Minute // nothing ends the wait but its context
		o.Health.ReadmitFlush = true
	})
	runCluster(t, c)
	dead, pxs := blackholes(t, 16)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		ch  Change
		err error
	}
	done := make(chan result, 1)
	go func() {
		ch, err := c.SetServers(ctx, append(serversOf(mcs...), dead...), hashring.Ketama)
		done <- result{ch, err}
	}()
	waitFor(t, 10*time.Second, "every node that hangs probed at once", func() bool {
		for _, px := range pxs {
			if px.Stats().Accepted == 0 {
				return false
			}
		}
		return true
	})
	probes := func() float64 {
		return testutil.ToFloat64(c.m.probes.WithLabelValues(mcs[0].Addr, "ok"))
	}
	before := probes()
	if !c.Ready() {
		t.Error("not ready while SetServers waits for nodes it adds")
	}
	if err := c.Set(t.Context(), Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Errorf("Set while SetServers waits: %v", err)
	}
	if it, err := c.Get(t.Context(), "k"); err != nil || string(it.Value) != "v" {
		t.Errorf("Get while SetServers waits = %q, %v", it.Value, err)
	}
	if n := len(c.Nodes()); n != 1 {
		t.Errorf("%d nodes while SetServers waits, want the old ring's 1", n)
	}
	waitFor(t, 10*time.Second, "a health-check round while SetServers waits", func() bool { return probes() > before })
	if n, err := testutil.GatherAndCount(reg); err != nil || n == 0 {
		t.Errorf("metrics while SetServers waits: %d series, %v", n, err)
	}
	select {
	case r := <-done:
		t.Fatalf("SetServers returned while its probes hang (%+v, %v)", r.ch, r.err)
	default:
	}
	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("SetServers did not return when its context ended")
	}
	if r.err != nil || len(r.ch.Added) != len(dead) {
		t.Fatalf("SetServers = %+v, %v; want %d nodes added", r.ch, r.err, len(dead))
	}
	for _, st := range c.Nodes() {
		if st.Node == mcs[0].Addr {
			if !st.Up {
				t.Errorf("%s, which answers, is down: %s", st.Node, st.Reason)
			}
			continue
		}
		if st.Up || !strings.Contains(st.Reason, "cut short") {
			t.Errorf("%s: up %v (%s), want down, the wait cut short", st.Node, st.Up, st.Reason)
		}
	}
	if !c.Ready() {
		t.Error("not ready after adding nodes that hang to one that answers")
	}
}

// TestSetServersReaddedHangingNodeOwesFlush: with ReadmitFlush, a node
// added again whose flush does not answer within the wait starts down
// and is still owed its flush before its re-admission.
func TestSetServersReaddedHangingNodeOwesFlush(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.Health.ReadmitFlush = true })
	dead, _ := blackholes(t, 1)
	both := append(serversOf(mcs...), dead...)
	for _, servers := range [][]Server{both, both[:1], both} {
		if _, err := c.SetServers(t.Context(), servers, hashring.Ketama); err != nil {
			t.Fatal(err)
		}
	}
	n := c.topo.Load().nodes[1]
	if n.available() || !n.flushOwed.Load() {
		t.Errorf("node added again that hangs: up %v, flush owed %v; want down, owed (%s)", n.available(), n.flushOwed.Load(), n.status().Reason)
	}
}

// TestSetServersRefusesNoNodeUp: a server list none of whose nodes
// answers, while a running node is up, is refused with ErrNoNodeUp and
// changes nothing: the running nodes stay, and the nodes it added leave
// no metric series. A list with one node up, or any list while no node
// is up, is applied.
func TestSetServersRefusesNoNodeUp(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	dead := []Server{{Host: "127.0.0.1", Port: memcachedtest.DeadPort(t), Weight: 1}, {Host: "127.0.0.1", Port: memcachedtest.DeadPort(t), Weight: 1}}
	c, reg := newTestCluster(t, mcs[:2], func(o *Options) {
		// The dead nodes refuse at once and the live ones answer, so
		// nothing here waits a probe out; a probe timeout short enough
		// for a loaded machine to reach (a late goroutine's dial and
		// stats on one CPU shared with busy loops) refused the list with
		// a node that answers.
		o.Timeout, o.Health.Timeout = 5*time.Second, 5*time.Second
	})
	names := func() []string { return nodeNames(c) }
	series := func(node string) int { return nodeSeries(t, reg, node) }
	// mcs[1] removed.
	if _, err := c.SetServers(t.Context(), serversOf(mcs[0]), hashring.Ketama); err != nil {
		t.Fatal(err)
	}
	mcs[1].Kill()
	before := names()
	for _, list := range [][]Server{dead, append(serversOf(mcs[1]), dead...)} {
		ch, err := c.SetServers(t.Context(), list, hashring.Ketama)
		if !errors.Is(err, ErrNoNodeUp) || !strings.Contains(err.Error(), "none of the") {
			t.Fatalf("SetServers(%v) = %+v, %v; want ErrNoNodeUp naming the probes", list, ch, err)
		}
		if got := names(); !slices.Equal(got, before) {
			t.Errorf("nodes after the refusal = %v, want %v", got, before)
		}
		for _, s := range list {
			if n := series(net.JoinHostPort(s.Host, strconv.Itoa(s.Port))); n != 0 {
				t.Errorf("%d metric series of %s, a node of the refused list", n, net.JoinHostPort(s.Host, strconv.Itoa(s.Port)))
			}
		}
		if err := c.Set(t.Context(), Item{Key: "k", Value: []byte("v")}); err != nil {
			t.Errorf("set after the refusal: %v", err)
		}
	}

	// One node that answers beside the dead ones: applied.
	if _, err := c.SetServers(t.Context(), append(serversOf(mcs[2]), dead...), hashring.Ketama); err != nil {
		t.Fatalf("a list with a node that answers: %v", err)
	}
	// No node up now: a list of dead nodes is nothing worse.
	mcs[2].Kill()
	ctx, cancel := context.WithCancel(t.Context())
	runDone := make(chan struct{})
	go func() { c.Run(ctx); close(runDone) }()
	defer func() { cancel(); <-runDone }()
	for !c.Probed() || c.Ready() {
		time.Sleep(10 * time.Millisecond) // the health checker's probes mark mcs[2] down
	}
	if _, err := c.SetServers(t.Context(), dead[:1], hashring.Ketama); err != nil {
		t.Errorf("a list of dead nodes while no node is up: %v", err)
	}
}

// TestPrepareChangesNothingUntilCommit: a prepared server list, its
// added nodes probed, changes nothing that requests, Nodes or the next
// reload see until Commit: discarded, the running list stays, the nodes
// it added leave no metric series, and its flush policy and copies are
// not taken. Committed, it runs with them.
func TestPrepareChangesNothingUntilCommit(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, reg := newTestCluster(t, mcs[:2], nil)
	names := func() []string { return nodeNames(c) }
	series := func(node string) int { return nodeSeries(t, reg, node) }
	if _, err := c.SetServers(t.Context(), serversOf(mcs[0]), hashring.Ketama); err != nil {
		t.Fatal(err)
	}
	running := names()
	next := NextServers{Servers: serversOf(mcs...), Distribution: hashring.Ketama, ReadmitFlush: true, Copies: 2}

	p, err := c.Prepare(t.Context(), next)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, running) {
		t.Errorf("nodes while prepared = %v, want %v", got, running)
	}
	p.Discard()
	if got := names(); !slices.Equal(got, running) {
		t.Errorf("nodes after Discard = %v, want %v", got, running)
	}
	for _, m := range mcs[1:] {
		if n := series(m.Addr); n != 0 {
			t.Errorf("%d metric series of %s, added by the discarded list", n, m.Addr)
		}
	}
	c.mu.Lock()
	copies := c.nextCopies
	c.mu.Unlock()
	if copies != 1 || c.health.readmitFlush.Load() {
		t.Errorf("after Discard: copies %d, readmit flush %v; want 1, false", copies, c.health.readmitFlush.Load())
	}

	p, err = c.Prepare(t.Context(), next)
	if err != nil {
		t.Fatal(err)
	}
	ch := p.Commit()
	p.Discard() // does nothing after Commit
	if got, want := names(), []string{mcs[0].Addr, mcs[1].Addr, mcs[2].Addr}; !slices.Equal(got, want) || len(ch.Added) != 2 {
		t.Errorf("after Commit: nodes %v, added %v; want %v, 2 added", got, ch.Added, want)
	}
	c.mu.Lock()
	copies = c.copies
	c.mu.Unlock()
	if copies != 2 || !c.health.readmitFlush.Load() {
		t.Errorf("after Commit: copies %d, readmit flush %v; want 2, true", copies, c.health.readmitFlush.Load())
	}
	if err := c.Set(t.Context(), Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Errorf("set after Commit: %v", err)
	}
}

// nodeNames lists c's nodes in its order.
func nodeNames(c *Cluster) []string {
	var out []string
	for _, n := range c.Nodes() {
		out = append(out, n.Node)
	}
	return out
}

// nodeSeries counts the metric series of reg labelled with node.
func nodeSeries(t *testing.T, reg *prometheus.Registry, node string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" && l.GetValue() == node {
					n++
				}
			}
		}
	}
	return n
}

// TestSetServersAddedNodeHoldingItems: a node a server change adds may
// hold values its keys were given on other nodes before it joined (one
// removed and added back, while its keys were written on the others; a
// memcached new to the list that holds items). Without ReadmitFlush
// each that holds items is counted in
// memcgate_upstream_readmit_unknown_history_total and warned about with
// the remedy before it serves, whether its first probe passed or it
// started down and was re-admitted later; a node added empty is not.
// With ReadmitFlush every node added is flushed before it serves, and
// none is counted.
func TestSetServersAddedNodeHoldingItems(t *testing.T) {
	for _, flush := range []bool{false, true} {
		t.Run(fmt.Sprintf("readmit-flush=%v", flush), func(t *testing.T) { testAddedNodeHoldingItems(t, flush) })
	}
}

func testAddedNodeHoldingItems(t *testing.T, flush bool) {
	// 0 stays; 1 is removed and added back; 2 is new and holds an item;
	// 3 is new and empty; 4 is new, holds an item, and is paused while
	// it is added, so that it starts down.
	mcs := memcachedtest.StartN(t, 5)
	const stays, back, holding, empty, paused = 0, 1, 2, 3, 4
	c, _ := newTestCluster(t, mcs[:2], func(o *Options) {
		o.Health.ReadmitFlush = flush
		// Nothing here stalls but the paused node, whose probe the
		// reload waits out once: timeouts a loaded machine does not hit.
		o.Timeout, o.Health.Timeout = 5*time.Second, 2*time.Second
	})
	var logs bytes.Buffer
	c.log = slog.New(slog.NewTextHandler(&logs, nil)) // the nodes added log through it
	ctx := t.Context()
	var keys []string
	for i := range 100 {
		keys = append(keys, fmt.Sprint("k", i))
	}
	set := func(v string) {
		t.Helper()
		for _, k := range keys {
			if err := c.Set(ctx, Item{Key: k, Value: []byte(v)}); err != nil {
				t.Fatalf("set %s: %v", v, err)
			}
		}
	}
	set("old")
	if _, err := c.SetServers(ctx, serversOf(mcs[stays]), hashring.Ketama); err != nil {
		t.Fatal(err)
	}
	set("new")
	// Items of other clients, or of an earlier server list.
	for _, i := range []int{holding, paused} {
		if err := memcache.New(mcs[i].Addr).Set(&memcache.Item{Key: "theirs", Value: []byte("kept")}); err != nil {
			t.Fatal(err)
		}
	}
	mcs[paused].Pause()
	ch, err := c.SetServers(ctx, serversOf(mcs...), hashring.Ketama)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Added) != 4 {
		t.Fatalf("change = %+v, want 4 nodes added", ch)
	}
	nodes := c.topo.Load().nodes
	counted := func(i int) float64 { return testutil.ToFloat64(c.m.unknown.WithLabelValues(nodes[i].name)) }
	want := map[int]float64{stays: 0, back: 1, holding: 1, empty: 0, paused: 0}
	if flush {
		want = map[int]float64{}
	}
	for i := range nodes[:paused] {
		if got := counted(i); got != want[i] {
			t.Errorf("node %d (%s): readmit_unknown_history_total %v, want %v", i, nodes[i].name, got, want[i])
		}
		if i != stays && nodes[i].status().HistoryUnknown { // stays: in the list at the start, and no probe round ran
			t.Errorf("node %d (%s) shows history_unknown in service", i, nodes[i].name)
		}
	}
	if st := nodes[paused].status(); st.Up || !st.HistoryUnknown {
		t.Fatalf("the node added paused: up %v, history_unknown %v; want down, unknown (%s)", st.Up, st.HistoryUnknown, st.Reason)
	}
	stale := 0
	for _, k := range keys {
		if read(t, c, k) == "old" {
			stale++
		}
	}
	if flush && stale > 0 {
		t.Errorf("%d of %d keys read a value from before the node's removal", stale, len(keys))
	}
	t.Logf("%d of %d keys read stale", stale, len(keys))

	mcs[paused].Resume()
	readmitNow(t, c, paused)
	if flush {
		want[paused] = 0
	} else {
		want[paused] = 1
	}
	if got := counted(paused); got != want[paused] {
		t.Errorf("the node added paused, re-admitted: readmit_unknown_history_total %v, want %v", got, want[paused])
	}
	if nodes[paused].status().HistoryUnknown {
		t.Error("the node added paused shows history_unknown after its re-admission")
	}
	for _, i := range []int{holding, paused} {
		_, err := memcache.New(mcs[i].Addr).Get("theirs")
		if kept := err == nil; kept == flush {
			t.Errorf("node %d's item kept %v (%v) with readmit flush %v", i, kept, err, flush)
		}
	}
	out := logs.String()
	warned := strings.Contains(out, "2 of 4 nodes added hold items") && strings.Contains(out, "MEMCGATE_READMIT_FLUSH=true flushes a node added") &&
		strings.Contains(out, "re-admitted a node away since before this process started or since a server change added it")
	if warned == flush {
		t.Errorf("warned %v with readmit flush %v; log:\n%s", warned, flush, out)
	}
}
