package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// udpRig is a handler whose asynchronous sets go through a real cluster's
// SetQuiet, to one memcached whose UDP port is udpPort, with the
// cluster's health checks running.
type udpRig struct {
	mc      *memcachedtest.Server
	cluster *upstream.Cluster
	h       *Handler
	reg     *prometheus.Registry
	drain   func() // stops the handler's Run, which applies what is queued
}

func newUDPRig(t *testing.T, mc *memcachedtest.Server, udpPort int) *udpRig {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{
		Servers:       []upstream.Server{{Host: "127.0.0.1", Port: mc.Port, UDPPort: udpPort}},
		PipelineConns: 2, Timeout: time.Second,
		Health: upstream.HealthOptions{Interval: time.Hour, Timeout: 200 * time.Millisecond},
	}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, stop := context.WithCancel(context.Background())
	probed := make(chan error)
	go func() { probed <- c.Run(ctx) }()
	t.Cleanup(func() { stop(); <-probed })
	for !c.Probed() { // the first round, then none for an hour
		time.Sleep(time.Millisecond)
	}
	g := &udpRig{mc: mc, cluster: c, reg: reg}
	g.h = NewHandler(c, log, reg, Options{Quiet: c, AsyncWorkers: 8})
	hctx, hstop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- g.h.Run(hctx) }()
	var drained bool
	g.drain = func() {
		if !drained {
			drained = true
			hstop()
			<-ran
		}
	}
	t.Cleanup(g.drain)
	return g
}

// async sends one request with Prefer: respond-async and wants 202.
func (g *udpRig) async(t *testing.T, method, path, body string) {
	t.Helper()
	if w := asyncDo(g.h, method, path, body); w.Code != http.StatusAccepted {
		t.Fatalf("%s %s with Prefer: respond-async = %d %s, want 202", method, path, w.Code, w.Body)
	}
}

// counter is the value of a counter of the rig's registry.
func (g *udpRig) counter(t *testing.T, name string) float64 {
	t.Helper()
	fams, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			total := 0.0
			for _, m := range f.GetMetric() {
				if m.GetCounter() != nil {
					total += m.GetCounter().GetValue()
				} else {
					total += m.GetGauge().GetValue()
				}
			}
			return total
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// get reads key from memcached.
func (g *udpRig) get(t *testing.T, key string) (op.Item, error) {
	t.Helper()
	r := g.cluster.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: key}})
	return r.Item, r.Err
}

// waitCmdSet waits until memcached has counted want sets: datagrams are
// applied after the queue has let go of them.
func (g *udpRig) waitCmdSet(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		st, err := g.mc.Stats()
		if err == nil && st["cmd_set"] == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached counted cmd_set = %s, want %d (%v)", st["cmd_set"], want, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAsyncUDPKeepsPerKeyOrder: a set and then a delete of the same key,
// queued together in one asynchronous batch, end deleted with UDP sets
// on: a set with a later write of its key waiting beside it goes over
// TCP, and the write after it waits for its answer. A set with no later
// write of its key waiting goes out as a datagram, unconfirmed.
func TestAsyncUDPKeepsPerKeyOrder(t *testing.T) {
	mc := memcachedtest.StartUDP(t)
	g := newUDPRig(t, mc, mc.UDPPort)
	const keys = 150
	var ops []string
	for i := range keys {
		ops = append(ops,
			fmt.Sprintf(`{"op":"set","key":"pair%d","value":"v"}`, i),
			fmt.Sprintf(`{"op":"delete","key":"pair%d"}`, i),
			fmt.Sprintf(`{"op":"set","key":"alone%d","value":"%d"}`, i, i))
	}
	g.async(t, "POST", "/", `{"ops":[`+strings.Join(ops, ",")+`]}`)
	g.drain()
	g.waitCmdSet(t, 2*keys)
	present := 0
	for i := range keys {
		if _, err := g.get(t, fmt.Sprint("pair", i)); err == nil {
			present++
		}
		if it, err := g.get(t, fmt.Sprint("alone", i)); err != nil || string(it.Value) != fmt.Sprint(i) {
			t.Errorf("alone%d = %v, %v; want %d", i, it, err, i)
		}
	}
	if present > 0 {
		t.Errorf("%d of %d keys set and then deleted in one asynchronous batch are still there", present, keys)
	}
	if got := g.counter(t, "memcgate_async_writes_unconfirmed_total"); got != keys {
		t.Errorf("unconfirmed = %v, want %d (the sets with no later write of their key)", got, keys)
	}
	if got := g.counter(t, "memcgate_async_writes_applied_total"); got != 2*keys {
		t.Errorf("applied = %v, want %d (the pairs' sets and deletes, over TCP)", got, 2*keys)
	}
}

// TestAsyncUDPPortNothingListens: with a UDP port configured that nothing
// listens on (memcached without -U), no set is lost: after the first
// probe round every asynchronous set goes over TCP and is applied.
func TestAsyncUDPPortNothingListens(t *testing.T) {
	mc := memcachedtest.Start(t)
	port, err := memcachedtest.FreeUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	g := newUDPRig(t, mc, port)
	const n = 100
	for i := range n {
		g.async(t, "PUT", fmt.Sprint("/k", i), fmt.Sprint(i))
	}
	g.drain()
	for i := range n {
		if it, err := g.get(t, fmt.Sprint("k", i)); err != nil || string(it.Value) != fmt.Sprint(i) {
			t.Errorf("k%d = %v, %v; want %d", i, it, err, i)
		}
	}
	if got := g.counter(t, "memcgate_async_writes_applied_total"); got != n {
		t.Errorf("applied = %v, want %d", got, n)
	}
	if got := g.counter(t, "memcgate_async_writes_unconfirmed_total"); got != 0 {
		t.Errorf("unconfirmed = %v, want 0", got)
	}
	if got := g.counter(t, "memcgate_upstream_node_udp_up"); got != 0 {
		t.Errorf("memcgate_upstream_node_udp_up = %v, want 0", got)
	}
	if st, _ := mc.Stats(); st["cmd_set"] != fmt.Sprint(n) {
		t.Errorf("memcached cmd_set = %s, want %d", st["cmd_set"], n)
	}
}

// TestLastOfKey: a set may go out quietly only if it is the last job of
// its key in the slice being applied.
func TestLastOfKey(t *testing.T) {
	tests := []struct {
		keys []string
		want []bool
	}{
		{[]string{"a"}, []bool{true}},
		{[]string{"a", "b"}, []bool{true, true}},
		{[]string{"a", "a"}, []bool{false, true}},
		{[]string{"a", "b", "a", "c", "b"}, []bool{false, false, true, true, true}},
	}
	sh := &shard{}
	for _, tt := range tests {
		jobs := make([]job, len(tt.keys))
		for i, k := range tt.keys {
			jobs[i] = job{Op: op.Op{Verb: op.Set, Item: op.Item{Key: k}}}
		}
		if got := sh.lastOfKey(jobs); !slices.Equal(got, tt.want) {
			t.Errorf("lastOfKey(%v) = %v, want %v", tt.keys, got, tt.want)
		}
	}
}
