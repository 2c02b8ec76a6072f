package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/mcpipe"
	"github.com/memcgate/memcgate/upstream/op"
)

func TestClassify(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	tests := []struct {
		name        string
		op          string
		in          error
		want        error // errors.Is target, or nil for *NodeError checks
		wantNode    bool
		wantDial    bool
		wantTimeout bool
		wantHard    bool
	}{
		{name: "nil", op: "get", in: nil},
		{name: "miss", op: "get", in: memcache.ErrCacheMiss, want: ErrNotFound},
		{name: "add not stored", op: "add", in: memcache.ErrNotStored, want: ErrExists},
		{name: "replace not stored", op: "replace", in: memcache.ErrNotStored, want: ErrNotFound},
		{name: "append not stored", op: "append", in: memcache.ErrNotStored, want: ErrNotFound},
		{name: "cas conflict", op: "cas", in: memcache.ErrCASConflict, want: ErrCASConflict},
		{name: "bad key", op: "get", in: memcache.ErrMalformedKey, want: ErrBadKey},
		{name: "non-numeric", op: "incr", in: errors.New("memcache: client error: cannot increment or decrement non-numeric value"), want: ErrNotNumeric},
		{name: "too large", op: "set", in: errors.New(`memcache: unexpected response line from "set": "SERVER_ERROR object too large for cache\r\n"`), want: ErrTooLarge},
		{name: "out of memory", op: "set", in: errors.New(`memcache: unexpected response line from "set": "SERVER_ERROR out of memory storing object\r\n"`), want: ErrNoMemory},
		{name: "other server error", op: "set", in: errors.New(`memcache: unexpected response line from "set": "SERVER_ERROR out of memory\r\n"`), want: ErrServer},
		{name: "connect timeout", op: "get", in: &memcache.ConnectTimeoutError{Addr: addr("n:1")}, wantNode: true, wantDial: true, wantTimeout: true},
		{name: "refused", op: "set", in: refused, wantNode: true, wantDial: true, wantHard: true},
		{name: "reset", op: "set", in: reset, wantNode: true, wantHard: true},
		{name: "eof", op: "get", in: io.EOF, wantNode: true, wantHard: true},
		{name: "read timeout", op: "get", in: timeout, wantNode: true, wantTimeout: true},
		// A deadline the oldest caller's stopped progress at: a timeout
		// for the callers that health checks ignore (observe).
		{name: "behind a caller's deadline", op: "get", in: fmt.Errorf("%w (%w)", mcpipe.ErrBehind, timeout), want: context.DeadlineExceeded, wantNode: true, wantTimeout: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := classify("n:1", tt.op, tt.in)
			if tt.in == nil {
				if got != nil {
					t.Errorf("classify(nil) = %v, want nil", got)
				}
				return
			}
			if tt.want != nil && !errors.Is(got, tt.want) {
				t.Errorf("classify(%v) = %v, want %v", tt.in, got, tt.want)
			}
			var ne *NodeError
			if isNode := errors.As(got, &ne); isNode != tt.wantNode {
				t.Fatalf("classify(%v) = %T, NodeError=%v, want %v", tt.in, got, isNode, tt.wantNode)
			}
			if ne == nil {
				return
			}
			if ne.Dial() != tt.wantDial || ne.Timeout() != tt.wantTimeout {
				t.Errorf("classify(%v): Dial()=%v Timeout()=%v, want %v %v", tt.in, ne.Dial(), ne.Timeout(), tt.wantDial, tt.wantTimeout)
			}
			if h := hardFailure(got); h != tt.wantHard {
				t.Errorf("hardFailure(classify(%v)) = %v, want %v", tt.in, h, tt.wantHard)
			}
		})
	}
}

func testLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// pipelineConns is the data path the tests run on: the shipped default
// (mcpipe, 2 connections per node); make test also runs the package with
// -pipeline-conns=0 for gomemcache's pool.
var pipelineConns = flag.Int("pipeline-conns", 2, "Options.PipelineConns of the test clusters (0: gomemcache)")

func newBenchCluster(b *testing.B, mcs []*memcachedtest.Server) (*Cluster, *prometheus.Registry) {
	return newTestClusterTB(b, mcs, nil)
}

// testTimeout is newTestCluster's Timeout.
const testTimeout = time.Second

func newTestCluster(t *testing.T, mcs []*memcachedtest.Server, mod func(*Options)) (*Cluster, *prometheus.Registry) {
	return newTestClusterTB(t, mcs, mod)
}

func newTestClusterTB(t testing.TB, mcs []*memcachedtest.Server, mod func(*Options)) (*Cluster, *prometheus.Registry) {
	t.Helper()
	var servers []Server
	for _, m := range mcs {
		servers = append(servers, Server{Host: "127.0.0.1", Port: m.Port, Weight: 1})
	}
	// An operation timeout a loaded machine under -race does not reach by
	// accident; a test of a timeout sets its own. (A probe's stays short:
	// most tests wait one out, a second each at half of testTimeout.)
	o := Options{Servers: servers, Timeout: testTimeout, MaxConns: 8, MaxIdleConns: 8, MaxInFlight: 8, PipelineConns: *pipelineConns, BatchGets: true,
		Health: HealthOptions{Interval: 50 * time.Millisecond, Timeout: 100 * time.Millisecond, Fall: 2, Rise: 2, PassiveFails: 2}}
	if mod != nil {
		mod(&o)
	}
	reg := prometheus.NewRegistry()
	c, err := New(o, testLogger(), reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, reg
}

func TestOperations(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, reg := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix = "app:" })
	ctx := t.Context()
	mustNil := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s = %v, want nil", what, err)
		}
	}
	mustIs := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("%s = %v, want %v", what, err, want)
		}
	}
	mustNil("Set", c.Set(ctx, Item{Key: "k", Value: []byte("v"), Flags: 7}))
	it, err := c.Get(ctx, "k")
	mustNil("Get", err)
	if string(it.Value) != "v" || it.Flags != 7 || it.CAS == 0 || it.Key != "k" {
		t.Errorf("Get(k) = %+v, want value v, flags 7, a CAS, key k", it)
	}
	// The prefix is applied on the wire.
	raw := memcache.New(c.Placement("k").Chain[0].Node)
	if got, err := raw.Get("app:k"); err != nil || string(got.Value) != "v" {
		t.Errorf("raw get app:k on the owner = %v, %v, want v", got, err)
	}
	mustIs("Add existing", c.Add(ctx, Item{Key: "k", Value: []byte("x")}), ErrExists)
	mustNil("Add new", c.Add(ctx, Item{Key: "k2", Value: []byte("x")}))
	mustIs("Replace missing", c.Replace(ctx, Item{Key: "nope", Value: []byte("x")}), ErrNotFound)
	mustNil("Replace", c.Replace(ctx, Item{Key: "k2", Value: []byte("y")}))
	mustIs("CAS stale", c.CompareAndSwap(ctx, Item{Key: "k", Value: []byte("z"), CAS: it.CAS + 100}), ErrCASConflict)
	mustNil("CAS", c.CompareAndSwap(ctx, Item{Key: "k", Value: []byte("z"), CAS: it.CAS}))
	mustIs("CAS missing", c.CompareAndSwap(ctx, Item{Key: "nope", Value: []byte("z"), CAS: 1}), ErrNotFound)
	mustNil("Append", c.Append(ctx, Item{Key: "k", Value: []byte(">")}))
	mustNil("Prepend", c.Prepend(ctx, Item{Key: "k", Value: []byte("<")}))
	mustIs("Append missing", c.Append(ctx, Item{Key: "nope", Value: []byte(">")}), ErrNotFound)
	it, _ = c.Get(ctx, "k")
	if string(it.Value) != "<z>" {
		t.Errorf("after append/prepend Get(k) = %q, want %q", it.Value, "<z>")
	}
	mustNil("Set n", c.Set(ctx, Item{Key: "n", Value: []byte("5")}))
	if v, err := c.Incr(ctx, "n", 10); err != nil || v != 15 {
		t.Errorf("Incr(n, 10) = %d, %v, want 15", v, err)
	}
	if v, err := c.Decr(ctx, "n", 100); err != nil || v != 0 {
		t.Errorf("Decr(n, 100) = %d, %v, want 0", v, err)
	}
	_, err = c.Incr(ctx, "k", 1)
	mustIs("Incr non-numeric", err, ErrNotNumeric)
	_, err = c.Incr(ctx, "nope", 1)
	mustIs("Incr missing", err, ErrNotFound)
	mustNil("Touch", c.Touch(ctx, "k", 100))
	mustIs("Touch missing", c.Touch(ctx, "nope", 100), ErrNotFound)
	mustNil("Delete", c.Delete(ctx, "k"))
	mustIs("Delete again", c.Delete(ctx, "k"), ErrNotFound)
	_, err = c.Get(ctx, "k")
	mustIs("Get deleted", err, ErrNotFound)
	err = c.Set(ctx, Item{Key: "big", Value: make([]byte, 2<<20)})
	mustIs("Set 2 MiB", err, ErrTooLarge)

	node := c.topo.Load().nodes[0].name
	if got := testutil.ToFloat64(c.m.up.WithLabelValues(node)); got != 1 {
		t.Errorf("node_up{%s} = %v, want 1", node, got)
	}
	if n, err := testutil.GatherAndCount(reg, "memcgate_upstream_ops_total"); err != nil || n == 0 {
		t.Errorf("GatherAndCount(ops) = %d, %v, want > 0", n, err)
	}
}

func TestMaxConnsBoundsConnections(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	const limit = 3
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.MaxConns, o.MaxIdleConns, o.MaxInFlight = limit, limit, limit })
	ctx := t.Context()
	errs := make(chan error, 200)
	for i := range 200 {
		go func() {
			key := fmt.Sprint("k", i)
			err := c.Set(ctx, Item{Key: key, Value: []byte(strings.Repeat("v", 400))})
			if err == nil {
				_, err = c.Get(ctx, key)
			}
			errs <- err
		}()
	}
	for range 200 {
		if err := <-errs; err != nil {
			t.Errorf("op under load: %v", err)
		}
	}
	if got := c.topo.Load().nodes[0].conns.Load(); got > limit {
		t.Errorf("open connections after load = %d, want <= %d", got, limit)
	}
	n, err := memcachedtest.CurrConnections(mcs[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	if n > limit {
		t.Errorf("memcached curr_connections from the cluster = %d, want <= %d", n, limit)
	}
}

func TestWaitForSlotFollowsContext(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	// The operation timeout is far past the bound below, so that a wait
	// that ended at it rather than at the context's deadline fails it.
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.MaxConns, o.MaxInFlight, o.Timeout = 1, 1, 10*time.Second })
	n := c.topo.Load().nodes[0]
	n.sem <- struct{}{} // the only slot is taken
	defer func() { <-n.sem }()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, "k")
	var ne *NodeError
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Get with no free slot = %v, want a timeout NodeError", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Get with no free slot took %v, want about the 50ms deadline, not the 10 s timeout", d)
	}
	if !n.available() {
		t.Error("waiting for our own slot ejected the node")
	}
}

func TestPassiveEjectionAndProbeReadmission(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, nil)
	ctx := t.Context()
	c.checkAll(ctx)
	c.probedOnce.Do(func() { close(c.probed) })
	// A node no probe has found answering counts for readiness only
	// while its last probe passed (readyUp), and a probe's short timeout
	// can pass on a loaded machine: probe until both have answered one.
	for deadline := time.Now().Add(10 * time.Second); !c.topo.Load().nodes[0].readyUp() || !c.topo.Load().nodes[1].readyUp(); c.checkAll(ctx) {
		if time.Now().After(deadline) {
			t.Fatal("both memcached nodes running, and not both answered a probe within 10s")
		}
	}
	if !c.Ready() {
		t.Fatal("Ready() = false with both nodes up")
	}
	// Find a key owned by node 0, kill node 0: the first failed operation
	// ejects it (refused), the read retries on node 1.
	key := keyOwnedBy(t, c, 0)
	mcs[0].Kill()
	if _, err := c.Get(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(%s) after its owner died = %v, want a miss from the next node", key, err)
	}
	if c.topo.Load().nodes[0].available() {
		t.Error("node 0 still available after a refused connection")
	}
	// Writes now go to node 1 directly (the ring skips node 0).
	if err := c.Set(ctx, Item{Key: key, Value: []byte("v")}); err != nil {
		t.Errorf("Set(%s) with its owner down = %v, want nil (rehash)", key, err)
	}
	// Probes keep it down, and bring it back only after Rise passes.
	c.checkAll(ctx)
	if c.topo.Load().nodes[0].available() {
		t.Error("node 0 up after a failed probe")
	}
	mcs[0].Restart()
	c.checkAll(ctx)
	if c.topo.Load().nodes[0].available() {
		t.Error("node 0 up after one passed probe, want Rise=2")
	}
	c.checkAll(ctx)
	if !c.topo.Load().nodes[0].available() {
		t.Error("node 0 still down after two passed probes")
	}
	// All nodes down: ErrNoNodes at once. Both processes are stopped
	// too, so a Get that touched a socket after all would end in a
	// timeout, not ErrNoNodes, and one waiting for a slot (no deadline)
	// would never return.
	c.topo.Load().nodes[0].eject("test", errors.New("x"), false)
	c.topo.Load().nodes[1].eject("test", errors.New("x"), false)
	for _, m := range mcs {
		m.Pause()
		defer m.Resume()
	}
	if _, err := c.Get(ctx, key); !errors.Is(err, ErrNoNodes) {
		t.Errorf("Get with all nodes down = %v, want ErrNoNodes", err)
	}
	if c.Ready() {
		t.Error("Ready() = true with all nodes down")
	}
}

func TestTimeoutsEjectAfterPassiveFails(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.Timeout = 100 * time.Millisecond })
	ctx := t.Context()
	if err := c.Set(ctx, Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	mcs[0].Pause()
	defer mcs[0].Resume()
	_, err := c.Get(ctx, "k")
	var ne *NodeError
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Get from a paused node = %v, want a timeout", err)
	}
	if !c.topo.Load().nodes[0].available() {
		t.Error("one timeout ejected the node, want PassiveFails=2")
	}
	_, _ = c.Get(ctx, "k")
	if c.topo.Load().nodes[0].available() {
		t.Error("node still available after 2 timeouts")
	}
}

func keyOwnedBy(t *testing.T, c *Cluster, idx int) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprint("key-", i)
		if c.Placement(k).Chain[0].Node == c.topo.Load().nodes[idx].name {
			return k
		}
	}
	t.Fatalf("no key owned by node %d", idx)
	return ""
}

func TestClusterCommands(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, nil)
	ctx := t.Context()
	for _, r := range c.Version(ctx) {
		if r.Err != nil || !strings.HasPrefix(string(r.Reply), "VERSION ") {
			t.Errorf("Version on %s = %q, %v, want VERSION x.y.z", r.Node, r.Reply, r.Err)
		}
	}
	for _, r := range c.Stats(ctx) {
		if r.Err != nil || !strings.HasPrefix(string(r.Reply), "STAT pid ") || !strings.HasSuffix(string(r.Reply), "END\r\n") {
			t.Errorf("Stats on %s = %.40q…, %v, want STAT lines then END", r.Node, r.Reply, r.Err)
		}
	}
	if err := c.Set(ctx, Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	for _, r := range c.FlushAll(ctx, 0) {
		if r.Err != nil || string(r.Reply) != "OK\r\n" {
			t.Errorf("FlushAll on %s = %q, %v, want OK", r.Node, r.Reply, r.Err)
		}
	}
	if _, err := c.Get(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after FlushAll = %v, want ErrNotFound", err)
	}
	c.topo.Load().nodes[1].eject("test", errors.New("down"), false)
	if r := c.FlushAll(ctx, 5)[1]; !errors.Is(r.Err, ErrNoNodes) {
		t.Errorf("FlushAll on a down node = %v, want ErrNoNodes", r.Err)
	}
	// Commands keep at most nodeCommands idle connections of their own
	// beside the data connections (one pooled, or the pipelined ones),
	// and closing the node (as a retired one is) closes them.
	n0 := c.topo.Load().nodes[0]
	data := int64(max(1, c.opts.PipelineConns))
	kept := int64(len(n0.cmdIdle.idle))
	if n := n0.conns.Load(); n > data+kept || kept < 1 || kept > nodeCommands {
		t.Errorf("%d connections open after commands, %d of them kept for commands; want the data connections (%d) and 1 to %d kept", n, kept, data, nodeCommands)
	}
	n0.cmdIdle.close()
	if n := n0.conns.Load(); n > data {
		t.Errorf("%d connections open once the command connections are closed, want the data connections (%d) at most", n, data)
	}
}

// TestFlushAllReachesDownNodes: a flush_all that finds a node down says
// so, and the node is flushed before it is re-admitted, so that it does
// not come back with values the flush emptied everywhere else.
func TestFlushAllReachesDownNodes(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	// The flush before re-admission is a probe: a timeout no loaded
	// machine reaches, as it is the flush, not its speed, under test.
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.Health.Timeout = 5 * time.Second })
	ctx := t.Context()
	a := c.topo.Load().nodes[0]
	k := keyOwnedBy(t, c, 0)
	if err := c.Set(ctx, Item{Key: k, Value: []byte("before the flush")}); err != nil {
		t.Fatal(err)
	}
	a.eject("test", errors.New("down"), false)
	r := c.FlushAll(ctx, 0)[0]
	if !errors.Is(r.Err, ErrNoNodes) || !strings.Contains(r.Err.Error(), "flushed before it is re-admitted") {
		t.Errorf("FlushAll on a down node = %v, want ErrNoNodes saying it is flushed on its return", r.Err)
	}
	c.readmit(ctx, a)
	if !a.available() {
		t.Fatal("not re-admitted")
	}
	if it, err := c.Get(ctx, k); !errors.Is(err, ErrNotFound) {
		t.Errorf("after re-admission, Get of a key set before the flush = %q, %v; want a miss", it.Value, err)
	}
	// Owed once: the next return keeps what the node holds.
	if err := c.Set(ctx, Item{Key: k, Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	a.eject("test", errors.New("down"), false)
	c.readmit(ctx, a)
	if it, err := c.Get(ctx, k); err != nil || string(it.Value) != "after" {
		t.Errorf("after a second re-admission, Get = %q, %v; want the value set meanwhile", it.Value, err)
	}
}

// TestClusterCommandsTakeTurns: raw commands (stats, version, flush_all,
// which /memc serves to anyone when no tokens are set) open a connection
// each, so however many callers ask at once, at most nodeCommands of
// them are open to a node.
func TestClusterCommandsTakeTurns(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	var open, peak atomic.Int64
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.MaxInFlight, o.MaxConns = 256, 256
		// 256 stats in four lanes: on a loaded machine a reply may take
		// longer than newTestCluster's testTimeout, and what is counted
		// here is connections, not timeouts.
		o.Timeout = 10 * time.Second
		d := &net.Dialer{}
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			n := open.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			return &closeCounted{Conn: nc, open: &open}, nil
		}
	})
	ctx := t.Context()
	if err := c.Set(ctx, Item{Key: "k", Value: []byte("v")}); err != nil { // the data connections, opened
		t.Fatal(err)
	}
	base := open.Load()
	peak.Store(base)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 4 {
				for _, r := range c.Stats(ctx) {
					if r.Err != nil {
						t.Errorf("Stats: %v", r.Err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if got := peak.Load() - base; got > nodeCommands {
		t.Errorf("%d command connections open at once to one node, want at most %d", got, nodeCommands)
	}
}

// TestClusterCommandsKeepConnections: stats, version and flush_all reuse a
// node's idle command connections, at most nodeCommands of them, rather
// than each opening a connection of its own; the connections kept when
// memcached is killed and restarted are replaced, and the first command
// after the restart answers.
func TestClusterCommandsKeepConnections(t *testing.T) {
	mc := memcachedtest.Start(t)
	c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, nil)
	ctx := t.Context()
	// accepted is memcached's total_connections, which counts the
	// connection that asks.
	accepted := func() int {
		t.Helper()
		st, err := mc.Stats()
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(st["total_connections"])
		if err != nil {
			t.Fatalf("total_connections %q: %v", st["total_connections"], err)
		}
		return n
	}
	commands := []struct {
		name string
		run  func() []NodeReply
		want string // the reply's start
	}{
		{"version", func() []NodeReply { return c.Version(ctx) }, "VERSION "},
		{"stats", func() []NodeReply { return c.Stats(ctx) }, "STAT pid "},
		{"flush_all", func() []NodeReply { return c.FlushAll(ctx, 0) }, "OK\r\n"},
		{"flush_all with a delay", func() []NodeReply { return c.FlushAll(ctx, 600) }, "OK\r\n"},
	}
	check := func(t *testing.T, what string, replies []NodeReply, want string) {
		t.Helper()
		for _, r := range replies {
			if r.Err != nil || !strings.HasPrefix(string(r.Reply), want) {
				t.Errorf("%s = %.40q, %v; want %q…", what, r.Reply, r.Err, want)
			}
		}
	}
	for _, tt := range commands {
		t.Run(tt.name, func(t *testing.T) {
			before := accepted()
			var wg sync.WaitGroup
			for range 10 {
				wg.Go(func() {
					for range 10 {
						check(t, tt.name, tt.run(), tt.want)
					}
				})
			}
			wg.Wait()
			// One more is the stats request that counts them.
			if n := accepted() - before - 1; n > nodeCommands {
				t.Errorf("100 of %s opened %d connections, want at most %d", tt.name, n, nodeCommands)
			}
		})
	}

	mc.Kill()
	mc.Restart()
	for _, tt := range commands {
		check(t, tt.name+" after memcached restarted", tt.run(), tt.want)
	}
	before := accepted()
	for range 20 {
		check(t, "version", c.Version(ctx), "VERSION ")
	}
	if n := accepted() - before - 1; n > nodeCommands {
		t.Errorf("20 versions after the restart opened %d connections, want at most %d", n, nodeCommands)
	}
}

// closeCounted is a connection that counts itself out of open once closed.
type closeCounted struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *closeCounted) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

func TestGetMulti(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix = "p:" })
	ctx := t.Context()
	var keys []string
	for i := range 250 {
		k := fmt.Sprint("m", i)
		keys = append(keys, k)
		if i%5 != 0 {
			if err := c.Set(ctx, Item{Key: k, Value: []byte("v" + k), Flags: uint32(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// No limit, and a limit that all the values fit, which asks their
	// sizes first (more than probeKeys keys).
	limits := []int{0, 1 << 20}
	for _, limit := range limits {
		found, failed := c.GetMulti(ctx, keys, limit, nil)
		if len(failed) != 0 {
			t.Errorf("GetMulti(limit %d) failed keys: %v", limit, failed)
		}
		for i, k := range keys {
			it, ok := found[k]
			if i%5 == 0 {
				if ok {
					t.Errorf("GetMulti(limit %d) found %s, which was never set", limit, k)
				}
				continue
			}
			if !ok || string(it.Value) != "v"+k || it.Flags != uint32(i) || it.Key != k || it.CAS == 0 {
				t.Errorf("GetMulti(limit %d)[%s] = %+v, %v, want value v%s flags %d", limit, k, it, ok, k, i)
			}
		}
	}
	// A node that dies mid-way: its keys are read through failover (misses).
	mcs[0].Kill()
	for _, limit := range limits {
		found, failed := c.GetMulti(ctx, keys, limit, nil)
		if len(failed) != 0 {
			t.Errorf("GetMulti(limit %d) with a dead node: %d keys failed, want failover (first: %v)", limit, len(failed), failed)
		}
		if len(found) == 0 {
			t.Errorf("GetMulti(limit %d) with a dead node found nothing on the live ones", limit)
		}
	}
}

// TestGetMultiLimit: a key asked for many times is read once, and the
// values kept stay within the limit whatever the keys: the others fail
// with ErrOverLimit (issue #16: a 9 KB request of one 1 MB key repeated
// 1,000 times took 3.9 GB).
func TestGetMultiLimit(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, nil)
	ctx := t.Context()
	big := bytes.Repeat([]byte("b"), 100<<10)
	for i := range 10 {
		if err := c.Set(ctx, Item{Key: fmt.Sprint("big", i), Value: big}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name      string
		keys      []string
		limit     int
		wantFound int // at most
		wantOver  int // at least
	}{
		{"repeated key, no limit", slices.Repeat([]string{"big0"}, 500), 0, 1, 0},
		{"repeated key within the limit", slices.Repeat([]string{"big0"}, 500), 200 << 10, 1, 0},
		{"ten values, room for three", []string{"big0", "big1", "big2", "big3", "big4", "big5", "big6", "big7", "big8", "big9"}, 350 << 10, 3, 7},
		{"no room", []string{"big0", "big1"}, 1, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			found, failed := c.GetMulti(ctx, tt.keys, tt.limit, nil)
			kept, over := 0, 0
			for _, it := range found {
				kept += len(it.Value)
			}
			for k, err := range failed {
				if !errors.Is(err, ErrOverLimit) {
					t.Errorf("GetMulti: %s failed with %v", k, err)
				}
				over++
			}
			if len(found) > tt.wantFound || over < tt.wantOver || len(found)+over != len(slices.Compact(slices.Sorted(slices.Values(tt.keys)))) {
				t.Errorf("GetMulti(%d keys, %d) found %d, %d over the limit; want at most %d found, at least %d over", len(tt.keys), tt.limit, len(found), over, tt.wantFound, tt.wantOver)
			}
			if tt.limit > 0 && kept > tt.limit {
				t.Errorf("GetMulti kept %d bytes, over the limit %d", kept, tt.limit)
			}
		})
	}
}

// TestGAT: gat reads the item and sets its expiration in one operation,
// on pipelined connections and (emulated) on gomemcache's pool alike.
func TestGAT(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, nil)
	ctx := t.Context()
	gat := func(key string, exp int32) op.Result {
		return c.Do(ctx, op.Op{Verb: op.GAT, Item: op.Item{Key: key, Expiration: exp}})
	}
	if r := gat("nope", 60); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("gat of a missing key = %v, want ErrNotFound", r.Err)
	}
	if err := c.Set(ctx, Item{Key: "g", Value: []byte("v"), Flags: 9, Expiration: 1000}); err != nil {
		t.Fatal(err)
	}
	if r := gat("g", 1000); r.Err != nil || string(r.Item.Value) != "v" || r.Item.Flags != 9 || r.Item.CAS == 0 || r.Item.Key != "g" {
		t.Fatalf("gat = %+v, want the item", r)
	}
	// A negative expiration expires the item at once: the gat that set
	// it still returns it, the next read misses.
	if r := gat("g", -1); r.Err != nil || string(r.Item.Value) != "v" {
		t.Fatalf("gat -1 = %+v, want the item", r)
	}
	if _, err := c.Get(ctx, "g"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after gat -1 = %v, want ErrNotFound", err)
	}
}

// TestOwner: a key's owner is the first node of its failover chain, and
// stays so while that node is down (the asynchronous queue keeps a key's
// writes in one lane by it); a new server list changes the count.
func TestOwner(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.Health.MaxEjectedPercent = 100 })
	runCluster(t, c)
	nodes := c.Nodes()
	owners := map[string]int{}
	for k := range 100 {
		key := fmt.Sprint("owner", k)
		i, n := c.Owner(key)
		if n != 3 || i < 0 || i >= n {
			t.Fatalf("Owner(%q) = %d, %d; want 0 <= i < 3, 3", key, i, n)
		}
		if want := c.Placement(key).Chain[0].Node; nodes[i].Node != want {
			t.Errorf("Owner(%q) = node %d (%s), want the chain's first, %s", key, i, nodes[i].Node, want)
		}
		owners[key] = i
	}
	mcs[0].Kill()
	waitFor(t, 5*time.Second, "node 0 down", func() bool { return !c.Nodes()[0].Up })
	for key, want := range owners {
		if i, _ := c.Owner(key); i != want {
			t.Errorf("Owner(%q) with node 0 down = %d, want %d as when it was up", key, i, want)
		}
	}
	for _, withPrefix := range []bool{false, true} { // the ring hashes the prefix too, or not
		pc, _ := newTestCluster(t, mcs[1:], func(o *Options) { o.KeyPrefix, o.HashWithPrefix = "app:", withPrefix })
		pnodes := pc.Nodes()
		for k := range 50 {
			key := fmt.Sprint("owner", k)
			if i, _ := pc.Owner(key); pnodes[i].Node != pc.Placement(key).Chain[0].Node {
				t.Errorf("HashWithPrefix %v: Owner(%q) = node %s, want the chain's first, %s", withPrefix, key, pnodes[i].Node, pc.Placement(key).Chain[0].Node)
			}
		}
	}
	if _, err := c.SetServers(t.Context(), c.topo.Load().servers[1:], c.opts.Distribution); err != nil {
		t.Fatal(err)
	}
	if _, n := c.Owner("owner0"); n != 2 || c.Len() != 2 {
		t.Errorf("after SetServers of 2 nodes: Owner's n = %d, Len() = %d; want 2", n, c.Len())
	}
}

// multiDropper is a memcached of our own for a fault: it answers a gets
// of one key with a value of size bytes, and closes the connection on a
// gets of several (a node failing in the middle of a multi-get); version
// and anything else get what memcached would answer. It returns its
// port.
func multiDropper(t *testing.T, size int) int {
	t.Helper()
	value := strings.Repeat("v", size)
	srv := memcachedtest.StartScripted(t, func(line string, _ *bufio.Reader) (string, bool) {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && (f[0] == "gets" || f[0] == "get"):
			return memcachedtest.Value(f[1], value, 0, 1) + "END\r\n", true
		case len(f) > 2 && (f[0] == "gets" || f[0] == "get"):
			return "", false // the fault
		case len(f) > 0 && f[0] == "version":
			return "VERSION 1.6.0\r\n", true
		}
		return "ERROR\r\n", true
	})
	return srv.Port
}

// countRoom is an op.Room that takes everything and counts it.
type countRoom struct {
	mu                 sync.Mutex
	reserved, released int
}

func (r *countRoom) Reserve(n int) bool { r.mu.Lock(); r.reserved += n; r.mu.Unlock(); return true }
func (r *countRoom) Fits(int) bool      { return true }
func (r *countRoom) Holds(n int) int    { return n }
func (r *countRoom) Release(n int)      { r.mu.Lock(); r.released += n; r.mu.Unlock() }
func (r *countRoom) Lend(n int) []byte  { return make([]byte, n) }

// TestGetMultiRetryHoldsValues: when a node fails in the middle of a
// multi-get, its keys are read again one by one, and their values, small
// ones too, are still held through the multi-get's Room before it
// returns them, and given back once handed out.
func TestGetMultiRetryHoldsValues(t *testing.T) {
	const size = 10 << 10 // under op.LentValue: a single Get would not ask its Room
	port := multiDropper(t, size)
	c, err := New(Options{Servers: []Server{{Host: "127.0.0.1", Port: port, Weight: 1}}, PipelineConns: 1, Timeout: time.Second}, testLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	room := &countRoom{}
	found, failed := c.GetMulti(t.Context(), []string{"a", "b", "c", "d"}, 0, room)
	kept := 0
	for _, it := range found {
		kept += len(it.Value)
	}
	if len(found) != 4 {
		t.Fatalf("found %d of 4 after the node failed mid-batch (%v)", len(found), failed)
	}
	if room.reserved < kept || room.released != room.reserved {
		t.Errorf("kept %d bytes; the Room was asked for %d and given back %d; want all kept asked for, and given back", kept, room.reserved, room.released)
	}
}

// TestOutOfMemoryIsNotTooLarge: a memcached with no memory for an item
// that fits (-M: no evictions, full) answers "SERVER_ERROR out of memory
// storing object"; that is ErrNoMemory, which a client may retry, not
// ErrTooLarge, which says the value can never be stored. Neither is held
// against the node.
func TestOutOfMemoryIsNotTooLarge(t *testing.T) {
	mc := memcachedtest.Start(t, "-M", "-m", "2")
	c, _ := newTestCluster(t, []*memcachedtest.Server{mc}, nil)
	v := make([]byte, 500_000)
	var err error
	for i := 0; i < 20 && err == nil; i++ {
		err = c.Set(t.Context(), Item{Key: fmt.Sprint("k", i), Value: v})
	}
	if !errors.Is(err, ErrNoMemory) || errors.Is(err, ErrTooLarge) {
		t.Fatalf("sets into a full memcached -M: %v, want ErrNoMemory and not ErrTooLarge", err)
	}
	if n := c.topo.Load().nodes[0]; !n.available() || n.passiveRuns.Load() != 0 {
		t.Errorf("node up %v, passive timeouts %d: a full memcached is not a failing one", n.available(), n.passiveRuns.Load())
	}
}
