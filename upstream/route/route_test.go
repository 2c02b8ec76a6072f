package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// clusterOptions are a pool's cluster over mcs with fast health checks.
func clusterOptions(mcs []*memcachedtest.Server) upstream.Options {
	var servers []upstream.Server
	for _, m := range mcs {
		servers = append(servers, upstream.Server{Host: "127.0.0.1", Port: m.Port, Weight: 1})
	}
	return upstream.Options{Servers: servers, Timeout: 200 * time.Millisecond, PipelineConns: 2, BatchGets: true,
		FailoverTTL: 60 * time.Second,
		Health: upstream.HealthOptions{Interval: 50 * time.Millisecond, Timeout: 100 * time.Millisecond, Fall: 2, Rise: 2,
			PassiveFails: 2, MaxEjectedPercent: 100, FlapBackoff: 50 * time.Millisecond, FlapBackoffMax: 100 * time.Millisecond}}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newRouter builds a router and runs it until the test ends.
func newRouter(t *testing.T, o Options) (*Router, *prometheus.Registry) {
	t.Helper()
	return newLoggingRouter(t, o, discard())
}

// newLoggingRouter is newRouter with the router logging to log.
func newLoggingRouter(t *testing.T, o Options, log *slog.Logger) (*Router, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := New(o, log, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; r.Close() })
	waitUntil(t, 5*time.Second, "router ready", r.Ready)
	return r, reg
}

func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// direct reads key straight from one memcached, as stored (no prefix).
func direct(t *testing.T, addr, key string) (string, bool) {
	t.Helper()
	c := memcache.New(addr)
	c.Timeout = 5 * time.Second // a stall of the shared machine past gomemcache's 500ms is not a failure here
	defer c.Close()
	it, err := c.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return "", false
	}
	if err != nil {
		t.Fatalf("direct get %s from %s: %v", key, addr, err)
	}
	return string(it.Value), true
}

// copies returns the addresses of mcs that hold key with value.
func copies(t *testing.T, mcs []*memcachedtest.Server, key, value string) []string {
	t.Helper()
	var out []string
	for _, m := range mcs {
		if v, ok := direct(t, m.Addr, key); ok && v == value {
			out = append(out, m.Addr)
		}
	}
	return out
}

func set(ctx context.Context, r *Router, key, value string) error {
	return r.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: key, Value: []byte(value)}}).Err
}

func get(ctx context.Context, r *Router, key string) (string, error) {
	res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}})
	return string(res.Item.Value), res.Err
}

// TestPrefixRoutes: keys go to the pool of their longest prefix, the rest
// to the default pool; a replicated pool holds each key on as many nodes.
func TestPrefixRoutes(t *testing.T) {
	main := memcachedtest.StartN(t, 1)
	sess := memcachedtest.StartN(t, 3)
	tmp := memcachedtest.StartN(t, 1)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(main)},
		{Name: "sessions", Prefixes: []string{"session:"}, Cluster: clusterOptions(sess), Replicas: 2},
		{Name: "tmp", Prefixes: []string{"session:tmp:"}, Cluster: clusterOptions(tmp)},
	}})
	ctx := t.Context()
	for _, tc := range []struct {
		key    string
		pool   []*memcachedtest.Server
		copies int
		route  string
	}{
		{"user:1", main, 1, ""},
		{"session:abc", sess, 2, "session:"},
		{"session:tmp:x", tmp, 1, "session:tmp:"},
		{"sessio", main, 1, ""},
	} {
		if err := set(ctx, r, tc.key, "v-"+tc.key); err != nil {
			t.Fatalf("set %s: %v", tc.key, err)
		}
		if got := copies(t, tc.pool, tc.key, "v-"+tc.key); len(got) != tc.copies {
			t.Errorf("%s: %d copies in its pool (%v), want %d", tc.key, len(got), got, tc.copies)
		}
		if v, err := get(ctx, r, tc.key); err != nil || v != "v-"+tc.key {
			t.Errorf("get %s = %q, %v", tc.key, v, err)
		}
		p := r.Placement(tc.key)
		if p.Route != tc.route || len(p.ReplicaNodes) != tc.copies {
			t.Errorf("Placement(%s) = route %q, replicas %v; want route %q, %d replicas", tc.key, p.Route, p.ReplicaNodes, tc.route, tc.copies)
		}
	}
	if n := len(r.Nodes()); n != 5 {
		t.Errorf("Nodes: %d, want 5", n)
	}
}

// TestWritePolicies: with one of three replicas paused, all fails, the
// majority and first policies answer, and the paused replica's write is
// counted failed (majority: in the background, after the answer).
func TestWritePolicies(t *testing.T) {
	for _, tc := range []struct {
		policy WritePolicy
		ok     bool
	}{{WriteAll, false}, {WriteMajority, true}, {WriteFirst, true}} {
		t.Run(string(tc.policy), func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 3)
			co := clusterOptions(mcs)
			co.Health.PassiveFails = 0 // the paused node stays up: its writes time out
			co.Health.Interval = time.Hour
			// A write that waits for the paused replica takes this long,
			// far from what one that does not wait takes on a loaded machine.
			co.Timeout = 2 * time.Second
			r, reg := newRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 3, Write: tc.policy}}})
			ctx := t.Context()
			if err := set(ctx, r, "k", "v1"); err != nil {
				t.Fatal(err)
			}
			// Under first and majority, v1's last replicas may still be
			// on their way: the pause must not catch them.
			waitUntil(t, 10*time.Second, "v1's background writes done", func() bool { return r.bg.ops.Load() == 0 })
			mcs[2].Pause()
			defer mcs[2].Resume()
			start := time.Now()
			err := set(ctx, r, "k", "v2")
			took := time.Since(start)
			if (err == nil) != tc.ok {
				t.Fatalf("set with a paused replica = %v (after %v), want ok=%v", err, took, tc.ok)
			}
			if !tc.ok {
				var ne *upstream.NodeError
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("error %v is not the replica's timeout", err)
				}
			} else if took >= co.Timeout {
				t.Errorf("set took %v: it waited for the paused replica (timeout %v)", took, co.Timeout)
			}
			waitUntil(t, 10*time.Second, "v2 on both live replicas", func() bool { return len(copies(t, mcs[:2], "k", "v2")) == 2 })
			waitUntil(t, 10*time.Second, "the paused replica's write counted", func() bool {
				return testutil.ToFloat64(r.m.writes.WithLabelValues("main", string(tc.policy), "failed"))+
					testutil.ToFloat64(r.m.writes.WithLabelValues("main", string(tc.policy), "background_failed")) == 1
			})
			waitUntil(t, 10*time.Second, "the background budget given back", func() bool {
				return r.bg.ops.Load() == 0 && r.bg.bytes.Load() == 0
			})
			_ = reg
		})
	}
}

// TestReadFallback: a replica that lost a key (flushed, restarted) is
// read past with MissFallback; without it its miss is the answer.
func TestReadFallback(t *testing.T) {
	for _, miss := range []bool{true, false} {
		t.Run(fmt.Sprint("miss_fallback=", miss), func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 3)
			r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 2, MissFallback: miss}}})
			ctx := t.Context()
			if err := set(ctx, r, "k", "v"); err != nil {
				t.Fatal(err)
			}
			first := r.Placement("k").ReplicaNodes[0]
			mc := memcache.New(first)
			if err := mc.Delete("k"); err != nil {
				t.Fatal(err)
			}
			mc.Close()
			v, err := get(ctx, r, "k")
			switch {
			case miss && (err != nil || v != "v"):
				t.Errorf("get = %q, %v; want v from the second replica", v, err)
			case !miss && !errors.Is(err, upstream.ErrNotFound):
				t.Errorf("get = %q, %v; want the first replica's miss", v, err)
			}
			// A head reads as a get does.
			head := r.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: "k"}})
			switch {
			case miss && (head.Err != nil || head.N != 1):
				t.Errorf("head = size %d, %v; want v's size from the second replica", head.N, head.Err)
			case !miss && !errors.Is(head.Err, upstream.ErrNotFound):
				t.Errorf("head = size %d, %v; want the first replica's miss", head.N, head.Err)
			}
			// Multi-get falls back per key too.
			found, failed := r.GetMulti(ctx, []string{"k", "absent"}, 0, nil)
			if _, ok := found["k"]; ok != miss || len(failed) != 0 {
				t.Errorf("GetMulti = %v, %v; want k found: %v", found, failed, miss)
			}
		})
	}
}

// TestNoStaleAfterReturn: a replica that was away (paused, so it keeps
// its data) while its key was rewritten and deleted serves neither the
// old value nor the deleted one once it is back: it is flushed before it
// is re-admitted, and reads fall back past its misses.
func TestNoStaleAfterReturn(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 2, MissFallback: true}}})
	ctx := t.Context()
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		if err := set(ctx, r, keys[i], "old"); err != nil {
			t.Fatal(err)
		}
	}
	victim := mcs[0]
	victim.Pause()
	waitUntil(t, 5*time.Second, "paused node ejected", func() bool { return !nodeUp(r, victim.Addr) })
	for i, k := range keys {
		var err error
		if i%2 == 0 {
			err = set(ctx, r, k, "new")
		} else {
			err = r.Do(ctx, op.Op{Verb: op.Delete, Item: op.Item{Key: k}}).Err
		}
		if err != nil {
			t.Fatalf("write during the outage: %v", err)
		}
	}
	victim.Resume()
	waitUntil(t, 5*time.Second, "node re-admitted", func() bool { return nodeUp(r, victim.Addr) })
	for i, k := range keys {
		v, err := get(ctx, r, k)
		if i%2 == 0 && (err != nil || v != "new") {
			t.Errorf("%s = %q, %v after the replica's return; want new", k, v, err)
		}
		if i%2 == 1 && !errors.Is(err, upstream.ErrNotFound) {
			t.Errorf("%s = %q, %v after the replica's return; want the delete to hold", k, v, err)
		}
	}
}

// TestReturnKeepsCopiesPlacedByAnotherKey: writes placed by another key
// (op.Op.HashKey: the chunks of a large value, placed by its key) during
// a replica's outage keep their copy on the replica that stayed up once
// the node returns. Before, the re-admission's delete of the copies
// written elsewhere looked for their spare in the chain of each write's
// own key, not the key it was placed by: a third of the chunks of an
// 8 MB value were deleted from the one replica that held them all, and
// its GETs were cut short after 7 of 8 chunks.
func TestReturnKeepsCopiesPlacedByAnotherKey(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 2, MissFallback: true}}})
	ctx := t.Context()
	chain := r.Placement("big").Chain
	victim := slices.IndexFunc(mcs, func(m *memcachedtest.Server) bool { return m.Addr == chain[0].Node })
	kept, spare := chain[1].Node, chain[2].Node
	mcs[victim].Pause()
	waitUntil(t, 5*time.Second, "paused node ejected", func() bool { return !nodeUp(r, mcs[victim].Addr) })
	parts := make([]string, 40)
	for i := range parts {
		parts[i] = fmt.Sprint("part.", i)
		if err := r.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: parts[i], Value: []byte("v")}, HashKey: "big"}).Err; err != nil {
			t.Fatalf("write during the outage: %v", err)
		}
	}
	mcs[victim].Resume()
	waitUntil(t, 5*time.Second, "node re-admitted", func() bool { return nodeUp(r, mcs[victim].Addr) })
	waitUntil(t, 5*time.Second, "the spare's copies deleted", func() bool {
		for _, p := range parts {
			if _, ok := direct(t, spare, p); ok {
				return false
			}
		}
		return true
	})
	for _, p := range parts {
		if _, ok := direct(t, kept, p); !ok {
			t.Errorf("%s is gone from %s, the replica that stayed up", p, kept)
		}
	}
}

// TestLayoutFollowsHealth: in a pool of one copy, a node's ejection
// and its re-admission change Layout of its keys (a write of the key
// goes to another node then, and a value in chunks written across it is
// split between two nodes: before, an 8 MB PUT whose node was killed 1 s
// in answered 201 and its GET 404); in a replicated pool they do not
// (the replicas that stayed hold every chunk).
func TestLayoutFollowsHealth(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprint("replicas ", replicas), func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 3)
			r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: replicas, MissFallback: true}}})
			chain := r.Placement("big").Chain
			victim := mcs[slices.IndexFunc(mcs, func(m *memcachedtest.Server) bool { return m.Addr == chain[0].Node })]
			before := r.Layout("big")
			victim.Pause()
			waitUntil(t, 5*time.Second, "paused node ejected", func() bool { return !nodeUp(r, victim.Addr) })
			ejected := r.Layout("big")
			victim.Resume()
			waitUntil(t, 5*time.Second, "node re-admitted", func() bool { return nodeUp(r, victim.Addr) })
			back := r.Layout("big")
			if moved := ejected != before && back != ejected; moved != (replicas == 1) {
				t.Errorf("Layout(big) = %d, %d ejected, %d back; want changed at each: %v", before, ejected, back, replicas == 1)
			}
		})
	}
}

func nodeUp(r *Router, addr string) bool {
	for _, n := range r.Nodes() {
		if n.Node == addr {
			return n.Up
		}
	}
	return false
}

// TestCASAndIncr: cas is checked on the replica whose CAS value it names
// and copied to the others; one that names no replica conflicts. incr and decr keep
// the replicas equal and answer the first replica's value.
func TestCASAndIncr(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 3}}})
	ctx := t.Context()
	if err := set(ctx, r, "c", "1"); err != nil {
		t.Fatal(err)
	}
	res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "c"}})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.Item.CASNode != upstream.NodeTag(r.Placement("c").ReplicaNodes[0]) {
		t.Errorf("get: CAS value of node %#x, want the first replica's", res.Item.CASNode)
	}
	cas := op.Op{Verb: op.CAS, Item: op.Item{Key: "c", Value: []byte("2"), CAS: res.Item.CAS}}
	if err := r.Do(ctx, cas).Err; !errors.Is(err, upstream.ErrCASNode) {
		t.Fatalf("cas naming no replica: %v, want ErrCASNode", err)
	}
	cas.Item.CASNode = res.Item.CASNode
	if err := r.Do(ctx, cas).Err; err != nil {
		t.Fatalf("cas with the first replica's value: %v", err)
	}
	if got := copies(t, mcs, "c", "2"); len(got) != 3 {
		t.Errorf("after cas, 2 on %v, want every replica", got)
	}
	if err := r.Do(ctx, cas).Err; !errors.Is(err, upstream.ErrCASConflict) {
		t.Errorf("cas with a used value = %v, want a conflict", err)
	}
	// A CAS value read from the second replica does not fit the first.
	// (Replicas that took the same writes since they started count CAS
	// values alike: another write there first.)
	second := memcache.New(r.Placement("c").ReplicaNodes[1])
	for i := range 3 {
		if err := second.Set(&memcache.Item{Key: fmt.Sprint("other", i), Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := second.Set(&memcache.Item{Key: "c", Value: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	it, err := second.Get("c")
	second.Close()
	if err != nil {
		t.Fatal(err)
	}
	cas.Item.CAS, cas.Item.Value = it.CasID, []byte("3")
	if err := r.Do(ctx, cas).Err; !errors.Is(err, upstream.ErrCASConflict) && !errors.Is(err, upstream.ErrNotFound) {
		t.Errorf("cas with another replica's value = %v, want a conflict", err)
	}

	if err := set(ctx, r, "n", "10"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if res := r.Do(ctx, op.Op{Verb: op.Incr, Item: op.Item{Key: "n"}, Delta: 3}); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	res = r.Do(ctx, op.Op{Verb: op.Decr, Item: op.Item{Key: "n"}, Delta: 1})
	if res.Err != nil || res.N != 24 {
		t.Errorf("decr = %d, %v; want 24", res.N, res.Err)
	}
	if got := copies(t, mcs, "n", "24"); len(got) != 3 {
		t.Errorf("24 on %v, want every replica", got)
	}
}

// TestAppendCASReplicated: append_cas and prepend_cas are checked on the
// replica whose CAS a head reads (the first, here), and their bytes added
// to every copy; a check that fails there adds them nowhere.
func TestAppendCASReplicated(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 3}}})
	ctx := t.Context()
	if err := set(ctx, r, "a", "abc"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		verb  op.Verb
		stale bool // send the CAS the previous head read, used since
		err   error
		want  string // on every replica
	}{
		{name: "append", verb: op.AppendCAS, want: "abc+"},
		{name: "prepend", verb: op.PrependCAS, want: "+abc+"},
		{name: "changed since", verb: op.AppendCAS, stale: true, err: upstream.ErrCASConflict, want: "+abc+"},
	}
	var cas uint64
	var node uint32
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !tt.stale {
				head := r.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: "a"}})
				if head.Err != nil {
					t.Fatal(head.Err)
				}
				cas, node = head.Item.CAS, head.Item.CASNode
			}
			res := r.Do(ctx, op.Op{Verb: tt.verb, Item: op.Item{Key: "a", Value: []byte("+"), CAS: cas, CASNode: node}})
			if !errors.Is(res.Err, tt.err) || tt.err == nil && res.Err != nil {
				t.Errorf("%v = %v, want %v", tt.verb, res.Err, tt.err)
			}
			if got := copies(t, mcs, "a", tt.want); len(got) != 3 {
				t.Errorf("after %v, %q on %v, want every replica", tt.verb, tt.want, got)
			}
		})
	}
}

// TestDeleteCASReplicated: delete_cas is checked on the replica whose CAS
// a read of the key answers (the first, here), and deletes every copy once
// that check passed; a check that fails there deletes none. With no CAS it
// deletes every copy of a key the first replica holds.
func TestDeleteCASReplicated(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 3}}})
	ctx := t.Context()
	// Each node counts CAS values apart from the others: the same CAS
	// sent to every copy would delete on one only.
	for i, m := range mcs {
		mc := memcache.New(m.Addr)
		for j := range 3 * i {
			if err := mc.Set(&memcache.Item{Key: fmt.Sprint("other", j), Value: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
		mc.Close()
	}
	tests := []struct {
		name    string
		absent  bool
		cas     func(read uint64) uint64
		err     error
		deleted bool
	}{
		{name: "unchanged", cas: func(c uint64) uint64 { return c }, deleted: true},
		{name: "changed since", cas: func(c uint64) uint64 { return c + 1000 }, err: upstream.ErrCASConflict},
		{name: "any", cas: func(uint64) uint64 { return 0 }, deleted: true},
		{name: "gone", absent: true, cas: func(uint64) uint64 { return 1 }, err: upstream.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := strings.ReplaceAll(tt.name, " ", "_")
			var read uint64
			node := upstream.NodeTag(r.Placement(key).ReplicaNodes[0])
			if !tt.absent {
				if err := set(ctx, r, key, "v"); err != nil {
					t.Fatal(err)
				}
				res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}})
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				read, node = res.Item.CAS, res.Item.CASNode
			}
			res := r.Do(ctx, op.Op{Verb: op.DeleteCAS, Item: op.Item{Key: key, CAS: tt.cas(read), CASNode: node}})
			if !errors.Is(res.Err, tt.err) || tt.err == nil && res.Err != nil {
				t.Errorf("delete_cas = %v, want %v", res.Err, tt.err)
			}
			want := 3
			if tt.deleted || tt.absent {
				want = 0
			}
			if got := copies(t, mcs, key, "v"); len(got) != want {
				t.Errorf("after delete_cas, copies on %v, want %d", got, want)
			}
		})
	}
}

// TestWriteAnswerFollowsReads: when the key's first replica lost it (as
// a node flushed on its return has), a write that needs the key answers
// what a read would see: with MissFallback the next replica's success,
// without it the first replica's miss.
func TestWriteAnswerFollowsReads(t *testing.T) {
	tests := []struct {
		name string
		o    op.Op
	}{
		{"incr", op.Op{Verb: op.Incr, Item: op.Item{Key: "n"}, Delta: 1}},
		{"decr", op.Op{Verb: op.Decr, Item: op.Item{Key: "n"}, Delta: 1}},
		{"touch", op.Op{Verb: op.Touch, Item: op.Item{Key: "n", Expiration: 60}}},
		{"replace", op.Op{Verb: op.Replace, Item: op.Item{Key: "n", Value: []byte("7")}}},
		{"append", op.Op{Verb: op.Append, Item: op.Item{Key: "n", Value: []byte("0")}}},
		{"delete", op.Op{Verb: op.Delete, Item: op.Item{Key: "n"}}},
	}
	mcs := memcachedtest.StartN(t, 3)
	for _, miss := range []bool{true, false} {
		r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 2, MissFallback: miss}}})
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/miss_fallback=%v", tt.name, miss), func(t *testing.T) {
				ctx := t.Context()
				if err := set(ctx, r, "n", "5"); err != nil {
					t.Fatal(err)
				}
				mc := memcache.New(r.Placement("n").ReplicaNodes[0])
				defer mc.Close()
				if err := mc.Delete("n"); err != nil {
					t.Fatal(err)
				}
				err := r.Do(ctx, tt.o).Err
				if miss && err != nil {
					t.Errorf("%s = %v, want the second replica's success", tt.name, err)
				}
				if !miss && !errors.Is(err, upstream.ErrNotFound) {
					t.Errorf("%s = %v, want the first replica's miss", tt.name, err)
				}
			})
		}
	}
}

// TestBackgroundCopiesKeepWriteOrder: under the first policy a write is
// answered before its slower copies land, and the next write of the key
// must not overtake them on their replica: there it would be overwritten
// by the older value, and the replicas would part for good. The slow
// replica's copy of v1 is held in the proxy's delay line while v2 goes
// to the same node at no delay, on another of its connections.
func TestBackgroundCopiesKeepWriteOrder(t *testing.T) {
	for _, tc := range []struct {
		name          string
		pipelineConns int // 0: one connection per operation in flight (gomemcache's pool)
	}{{"pipelined", 2}, {"pooled", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			px := faultproxy.NewTCP(mcs[1].Addr)
			if err := px.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { px.Close() })
			_, port, _ := net.SplitHostPort(px.Addr())
			o := clusterOptions(mcs)
			o.Servers[1].Port, _ = strconv.Atoi(port)
			o.PipelineConns = tc.pipelineConns
			o.Timeout, o.Health.Timeout = 5*time.Second, 5*time.Second
			o.Health.Interval = time.Hour // no probe after the first: the proxy carries only the writes
			r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: o, Replicas: 2, Write: WriteFirst}}})
			ctx := t.Context()
			if err := set(ctx, r, "k", "v0"); err != nil {
				t.Fatal(err)
			}
			r.bg.wait() // v0 on both replicas: the bytes the proxy reads next are v1's
			px.SetLatency(time.Second)
			read := px.Stats().BytesFromClient
			if err := set(ctx, r, "k", "v1"); err != nil { // answered by the direct replica
				t.Fatal(err)
			}
			waitUntil(t, 5*time.Second, "the slow copy of v1 in the delay line", func() bool { return px.Stats().BytesFromClient > read })
			px.SetLatency(0)
			if err := set(ctx, r, "k", "v2"); err != nil {
				t.Fatal(err)
			}
			r.bg.wait()
			a, _ := direct(t, mcs[0].Addr, "k")
			b, _ := direct(t, mcs[1].Addr, "k")
			if a != "v2" || b != "v2" {
				t.Errorf("k is %q on the direct replica and %q on the slow one, want v2 on both", a, b)
			}
		})
	}
}

// TestCopiesMovedToASpareKeepWriteOrder: a write's copy that moves on to
// a spare (its replica went out of service for it) is ordered there, on
// the node it goes to: the next write of the key, which has the spare
// among its replicas once that replica is ejected, does not overtake it
// and leave the spare with the older value. The key's chain is A, B, S;
// the pool keeps two copies under the first policy, so each write is
// answered by B while its copy to A, paused, runs until it times out,
// which ejects A (one passive failure is enough) and moves the copy to
// S. The next write then goes to B and S. Either the moved copy is
// already on S, held in the proxy's delay line while the next write goes
// to S on another connection, or it is still waiting on A behind an
// earlier write's copy, and moves to S only after the next write has
// gone there.
func TestCopiesMovedToASpareKeepWriteOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the pool's: how long a copy to the paused A runs
		latency time.Duration // one way, to S, while the moved copy goes there
		writes  []string      // written before A is ejected; each moves to S
	}{
		{"held on the spare", 3 * time.Second, 500 * time.Millisecond, []string{"v1"}},
		{"moved after the next write", 2 * time.Second, 0, []string{"v0", "v1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 3)
			a, b := mcs[0], mcs[1]
			px := faultproxy.NewTCP(mcs[2].Addr)
			if err := px.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { px.Close() })
			_, port, _ := net.SplitHostPort(px.Addr())
			o := clusterOptions(mcs)
			o.Servers[2].Port, _ = strconv.Atoi(port)
			s := "127.0.0.1:" + port
			o.Timeout, o.Health.Timeout = tc.timeout, tc.timeout
			o.Health.Interval = time.Hour // no probe after the first: only the copy's timeout ejects A
			o.Health.PassiveFails = 1
			r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: o, Replicas: 2, Write: WriteFirst}}})
			t.Cleanup(a.Resume) // before the router's cleanup
			key := ""
			for i := 0; key == ""; i++ {
				k := fmt.Sprint("k", i)
				if c := r.Placement(k).Chain; c[0].Node == a.Addr && c[1].Node == b.Addr && c[2].Node == s {
					key = k
				}
			}
			// The writes' copies keep the request's deadline (detach):
			// far beyond the steps below, so that none of them ends by it
			// and stops waiting its turn on a stalled machine.
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			px.SetLatency(tc.latency)
			read := px.Stats().BytesFromClient
			a.Pause()
			for _, v := range tc.writes {
				if err := set(ctx, r, key, v); err != nil { // answered by B
					t.Fatal(err)
				}
			}
			waitUntil(t, 5*tc.timeout, "A ejected by the first copy's timeout", func() bool { return !nodeUp(r, a.Addr) })
			waitUntil(t, 5*tc.timeout, "the first copy moved on to S", func() bool { return px.Stats().BytesFromClient > read })
			px.SetLatency(0)
			if err := set(ctx, r, key, "v2"); err != nil { // to B and S
				t.Fatal(err)
			}
			r.bg.wait()
			if n := testutil.ToFloat64(r.m.substituted.WithLabelValues("main")); n != float64(len(tc.writes)) {
				t.Errorf("substitutions = %v, want %d: the copies to A did not all move to S", n, len(tc.writes))
			}
			vb, _ := direct(t, b.Addr, key)
			vs, _ := direct(t, mcs[2].Addr, key)
			if vb != "v2" || vs != "v2" {
				t.Errorf("%s is %q on B and %q on the spare S, want v2 on both", key, vb, vs)
			}
			if n := r.pools[0].order.n.Load(); n != 0 {
				t.Errorf("every write done: %d places kept in the write order, want none", n)
			}
		})
	}
}

// TestBadKeysInEveryPool: a key that a prefix routes is checked like any
// other: in a pool of one copy and in a replicated one, every verb
// refuses it with ErrBadKey, and no node is blamed for it.
func TestBadKeysInEveryPool(t *testing.T) {
	one := memcachedtest.StartN(t, 1)
	rep := memcachedtest.StartN(t, 3)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(one)},
		{Name: "sessions", Prefixes: []string{"session:"}, Cluster: clusterOptions(rep), Replicas: 2, Read: ReadHedged},
	}})
	keys := []struct{ name, key string }{
		{"over 250 bytes", "session:" + strings.Repeat("k", 243)},
		{"space", "session:a b"},
		{"newline", "session:a\r\nflush_all"},
		{"control byte", "session:\x01"},
		{"default pool, over 250 bytes", strings.Repeat("k", 251)},
	}
	verbs := []op.Op{
		{Verb: op.Get}, {Verb: op.GAT}, {Verb: op.Set, Item: op.Item{Value: []byte("v")}}, {Verb: op.Add, Item: op.Item{Value: []byte("v")}},
		{Verb: op.CAS, Item: op.Item{Value: []byte("v"), CAS: 1}}, {Verb: op.Incr, Delta: 1}, {Verb: op.Touch}, {Verb: op.Delete},
	}
	for _, k := range keys {
		for _, o := range verbs {
			t.Run(k.name+"/"+o.Verb.String(), func(t *testing.T) {
				o.Item.Key = k.key
				if o.Verb == op.CAS && r.Placement(k.key).Replicas > 1 {
					// A replicated pool's CAS value names its replica.
					o.Item.CASNode = upstream.NodeTag(r.Placement(k.key).ReplicaNodes[0])
				}
				if err := r.Do(t.Context(), o).Err; !errors.Is(err, upstream.ErrBadKey) {
					t.Errorf("Do(%s %q) = %v, want ErrBadKey", o.Verb, k.key, err)
				}
			})
		}
	}
	for _, n := range r.Nodes() {
		if !n.Up {
			t.Errorf("node %s is down after bad keys", n.Node)
		}
	}
	if err := set(t.Context(), r, "session:"+strings.Repeat("k", 242), "v"); err != nil {
		t.Errorf("set of a 250-byte routed key: %v", err)
	}
}

// TestSpareTakesTheWrite: a replica that refuses connections (killed) is
// replaced by the next live node for a write, which keeps its copies and
// answers under the all policy.
func TestSpareTakesTheWrite(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	co := clusterOptions(mcs)
	co.Health.Interval = time.Hour // only the write sees the death
	r, reg := newRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 2, Write: WriteAll}}})
	ctx := t.Context()
	p := r.Placement("k")
	var victim *memcachedtest.Server
	for _, m := range mcs {
		if m.Addr == p.ReplicaNodes[0] {
			victim = m
		}
	}
	victim.Kill()
	if err := set(ctx, r, "k", "v"); err != nil {
		t.Fatalf("set with a dead replica = %v, want the spare to take it", err)
	}
	var live []*memcachedtest.Server
	for _, m := range mcs {
		if m != victim {
			live = append(live, m)
		}
	}
	if got := copies(t, live, "k", "v"); len(got) != 2 {
		t.Errorf("v on %v, want both live nodes", got)
	}
	if n := testutil.ToFloat64(r.m.substituted.WithLabelValues("main")); n != 1 {
		t.Errorf("substitutions = %v, want 1", n)
	}
	_ = reg
}

// TestBackgroundBudget: a write whose other replicas would outlive its
// answer waits for them when the budget is full, and is counted.
func TestBackgroundBudget(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	co := clusterOptions(mcs)
	co.Health.PassiveFails = 0
	r, _ := newRouter(t, Options{BackgroundOps: 1, BackgroundBytes: 1 << 20,
		Pools: []PoolOptions{{Cluster: co, Replicas: 2, Write: WriteFirst}}})
	ctx := t.Context()
	slow := mcs[1]
	slow.Pause()
	defer slow.Resume()
	// The first write's slow replica holds the budget's one operation
	// until it times out; the second write then waits for its own.
	if err := set(ctx, r, "a", "v"); err != nil {
		t.Fatal(err)
	}
	if r.bg.ops.Load() != 1 {
		t.Fatalf("background ops = %d, want 1", r.bg.ops.Load())
	}
	start := time.Now()
	err := set(ctx, r, "b", strings.Repeat("x", 100))
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("second write took %v (err %v): it did not wait for its replicas", took, err)
	}
	if n := testutil.ToFloat64(r.m.bgRefused.WithLabelValues("main")); n != 1 {
		t.Errorf("background refusals = %v, want 1", n)
	}
	waitUntil(t, 2*time.Second, "budget given back", func() bool { return r.bg.ops.Load() == 0 })
}

// TestReconfigure: policies and prefixes change live; pools cannot be
// added or removed.
func TestReconfigure(t *testing.T) {
	a := memcachedtest.StartN(t, 1)
	b := memcachedtest.StartN(t, 3)
	o := Options{Pools: []PoolOptions{{Cluster: clusterOptions(a)}, {Name: "b", Prefixes: []string{"b:"}, Cluster: clusterOptions(b)}}}
	r, _ := newRouter(t, o)
	layout := r.Layout("x:1")
	o2 := o
	o2.Pools = []PoolOptions{o.Pools[0], o.Pools[1]}
	o2.Pools[1].Prefixes = []string{"x:"}
	o2.Pools[1].Replicas = 2
	ch, err := r.Reconfigure(t.Context(), o2)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Layout("x:1"); got == layout {
		t.Errorf("Layout() = %d after a reload that moved a prefix, want it changed", got)
	}
	layout = r.Layout("x:1")
	if len(ch) != 1 || ch[0].Pool != "b" || strings.Join(ch[0].Policy, ",") != "prefixes,replicas" {
		t.Errorf("changes = %+v", ch)
	}
	if p := r.Placement("x:1"); p.Pool != "b" || p.Replicas != 2 {
		t.Errorf("x:1 goes to %s with %d replicas, want b with 2", p.Pool, p.Replicas)
	}
	if p := r.Placement("b:1"); p.Pool != DefaultPool {
		t.Errorf("b:1 goes to %s, want the default pool", p.Pool)
	}
	o3 := o
	o3.Pools = o.Pools[:1]
	if _, err := r.Reconfigure(t.Context(), o3); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Errorf("removing a pool: %v, want an error naming the restart", err)
	}
	o4 := o2
	o4.Pools = []PoolOptions{o2.Pools[0], o2.Pools[1]}
	o4.Pools[1].Cluster.Failover = upstream.FailFast
	if _, err := r.Reconfigure(t.Context(), o4); err == nil || !strings.Contains(err.Error(), "failover policy") {
		t.Errorf("changing a pool's failover: %v, want an error naming the failover policy", err)
	}
	if p := r.Placement("x:1"); p.Pool != "b" || p.Replicas != 2 {
		t.Errorf("after the refused reloads x:1 goes to %s with %d replicas, want b with 2", p.Pool, p.Replicas)
	}
	if got := r.Layout("x:1"); got != layout {
		t.Errorf("Layout() = %d after refused reloads, want %d: nothing moved", got, layout)
	}
}

// TestReconfigureReplicasFlushAdded: a reload that makes a pool keep
// replicas and adds a node flushes that node before it takes traffic,
// as a replicated pool flushes every node it re-admits (docs/pools.md):
// a node it had removed, and a node new to the list that holds items
// (an earlier server list's, other clients'), whose keys may have newer
// values on other nodes. The flush is the replicated pool's even when
// the same reload starts the replication: the node was added back
// unflushed, its values from before its removal served as replicas.
func TestReconfigureReplicasFlushAdded(t *testing.T) {
	for _, removedFirst := range []bool{true, false} {
		name := "new to the list"
		if removedFirst {
			name = "removed and added back"
		}
		t.Run(name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			start := mcs[:1]
			if removedFirst {
				start = mcs
			}
			o := Options{Pools: []PoolOptions{{Cluster: clusterOptions(start)}}}
			r, _ := newRouter(t, o)
			direct := memcache.New(mcs[1].Addr)
			if err := direct.Set(&memcache.Item{Key: "before", Value: []byte("old")}); err != nil {
				t.Fatal(err)
			}
			if removedFirst {
				one := o
				one.Pools = []PoolOptions{{Cluster: clusterOptions(mcs[:1])}}
				if _, err := r.Reconfigure(t.Context(), one); err != nil {
					t.Fatal(err)
				}
			}
			two := o
			two.Pools = []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: 2}}
			if _, err := r.Reconfigure(t.Context(), two); err != nil {
				t.Fatal(err)
			}
			if it, err := direct.Get("before"); err == nil {
				t.Errorf("the node added with replicas on holds %q from before it joined, want it flushed", it.Value)
			}
		})
	}
}

// TestReconfigureKeysBackReplicas: a reload that gives nodes that stay
// copies of keys they held under an earlier configuration of the pool
// names them (Change.Servers.KeysBack): with replicas lowered, the writes
// reached the first replica only, so once replicas are raised again the
// others hold what they had before (served when the first fails or is
// slow to answer a hedged read). Every copy older than the last write is
// on a node named.
func TestReconfigureKeysBackReplicas(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	pool := func(replicas int) Options {
		return Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs), Replicas: replicas}}}
	}
	r, _ := newRouter(t, pool(2))
	ctx := t.Context()
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprint("rep-", i))
	}
	direct := map[string]*memcache.Client{}
	for _, m := range mcs {
		direct[m.Addr] = memcache.New(m.Addr)
	}
	steps := []struct {
		name     string
		replicas int
		back     bool // nodes are named
	}{
		{"replicas lowered", 1, false},
		{"replicas raised again", 2, true},
	}
	for i, st := range steps {
		want := fmt.Sprint("v", i)
		for _, k := range keys {
			if err := set(ctx, r, k, want); err != nil {
				t.Fatalf("%s: set: %v", st.name, err)
			}
		}
		ch, err := r.Reconfigure(t.Context(), pool(st.replicas))
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		var back []string
		for _, c := range ch {
			if c.Servers != nil {
				back = append(back, c.Servers.KeysBack...)
			}
		}
		if (len(back) > 0) != st.back {
			t.Errorf("%s: keys back on %v, want some: %v", st.name, back, st.back)
		}
		stale := 0
		for _, k := range keys {
			for _, node := range r.Placement(k).ReplicaNodes {
				it, err := direct[node].Get(k)
				if err != nil || string(it.Value) == want {
					continue
				}
				stale++
				if !slices.Contains(back, node) {
					t.Errorf("%s: %s holds %q, written %q, on replica %s, which the reload does not name (%v)", st.name, k, it.Value, want, node, back)
				}
			}
		}
		t.Logf("%s: %d stale copies of %d keys, on %v", st.name, stale, len(keys), back)
	}
}

// TestOnePoolIsItsCluster: with one pool of one copy the router adds no
// allocation to an operation.
func TestOnePoolIsItsCluster(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: clusterOptions(mcs)}}})
	ctx := context.Background()
	if err := set(ctx, r, "k", "v"); err != nil {
		t.Fatal(err)
	}
	o := op.Op{Verb: op.Get, Item: op.Item{Key: "k"}}
	c := r.pools[0].c
	// The fewest of three runs: a collection during one empties the
	// pools the operation draws on, and its allocations are not the
	// router's.
	allocs := func(f func()) float64 {
		n := math.Inf(1)
		for range 3 {
			n = min(n, testing.AllocsPerRun(200, f))
		}
		return n
	}
	viaCluster := allocs(func() { c.Do(ctx, o) })
	viaRouter := allocs(func() { r.Do(ctx, o) })
	if viaRouter > viaCluster {
		t.Errorf("Do allocates %v through the router, %v through the cluster", viaRouter, viaCluster)
	}
}

// TestHedgedRead: with one replica slowed by the fault proxy, a hedged
// read of a key whose first replica is the slow one is answered by the
// second after the hedge delay; under ReadFirst it waits for the slow one.
func TestHedgedRead(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	slow := faultproxy.NewTCP(mcs[0].Addr)
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	co := clusterOptions(mcs)
	_, port, _ := net.SplitHostPort(slow.Addr())
	co.Servers[0].Port, _ = strconv.Atoi(port)
	co.Timeout = 5 * time.Second
	slowAddr := "127.0.0.1:" + port
	for _, read := range []ReadPolicy{ReadHedged, ReadFirst} {
		t.Run(string(read), func(t *testing.T) {
			slow.SetLatency(0)
			r, _ := newRouter(t, Options{HedgeMinDelay: time.Millisecond, HedgeMaxDelay: 3 * time.Millisecond, HedgeMaxPercent: 100,
				Pools: []PoolOptions{{Cluster: co, Replicas: 2, Read: read}}})
			ctx := t.Context()
			var keys []string
			for i := 0; len(keys) < 20; i++ {
				k := fmt.Sprint("h", i)
				if r.Placement(k).ReplicaNodes[0] == slowAddr {
					keys = append(keys, k)
					if err := set(ctx, r, k, "v"); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Unhedged reads wait the slow replica's round trip, at
			// least 100ms however loaded the machine. Hedged ones are
			// answered after a few milliseconds: the slow replica then
			// takes 2s a round trip, so that a hedged read cannot pass
			// for one that waited, even on a machine busy enough to
			// stretch a millisecond a hundredfold.
			slowRTT := 100 * time.Millisecond
			if read == ReadHedged {
				slowRTT = 2 * time.Second
			}
			slow.SetLatency(slowRTT / 2)
			var worst time.Duration
			for _, k := range keys {
				start := time.Now()
				if v, err := get(ctx, r, k); err != nil || v != "v" {
					t.Fatalf("get %s = %q, %v", k, v, err)
				}
				worst = max(worst, time.Since(start))
			}
			sent := testutil.ToFloat64(r.m.hedges.WithLabelValues("main", "sent"))
			won := testutil.ToFloat64(r.m.hedges.WithLabelValues("main", "won"))
			t.Logf("%s: slowest of %d reads %v; hedges sent %v, won %v", read, len(keys), worst, sent, won)
			switch read {
			case ReadHedged:
				if worst >= slowRTT/2 || won < float64(len(keys))*0.9 {
					t.Errorf("hedged reads: slowest %v, %v hedges won; want under %v, most won", worst, won, slowRTT/2)
				}
			case ReadFirst:
				if worst < slowRTT || sent != 0 {
					t.Errorf("unhedged reads: slowest %v, %v hedges; want the slow replica's %v, none", worst, sent, slowRTT)
				}
			}
		})
	}
}

// TestRouterOwner: nodes are numbered pool after pool, in configured
// order, and a key's owner is its home node in its pool.
func TestRouterOwner(t *testing.T) {
	main := memcachedtest.StartN(t, 1)
	sess := memcachedtest.StartN(t, 3)
	tmp := memcachedtest.StartN(t, 1)
	old := memcachedtest.StartN(t, 2)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(main), Warm: "old"},
		{Name: "old", Cluster: clusterOptions(old)}, // a warm-up source, no key routed here: not numbered
		{Name: "sessions", Prefixes: []string{"session:"}, Cluster: clusterOptions(sess), Replicas: 2},
		{Name: "tmp", Prefixes: []string{"session:tmp:"}, Cluster: clusterOptions(tmp)},
	}})
	for _, tc := range []struct {
		key    string
		lo, hi int // the pool's node numbers, hi excluded
		pool   int
	}{
		{"user:1", 0, 1, 0},
		{"session:abc", 1, 4, 2},
		{"session:tmp:x", 4, 5, 3},
	} {
		i, n := r.Owner(tc.key)
		if n != 5 || i < tc.lo || i >= tc.hi {
			t.Errorf("Owner(%q) = %d, %d; want %d <= i < %d, 5", tc.key, i, n, tc.lo, tc.hi)
		}
		if home, _ := r.pools[tc.pool].c.Owner(tc.key); i != tc.lo+home {
			t.Errorf("Owner(%q) = %d, want %d: its pool's first node number plus its home in the pool, %d", tc.key, i, tc.lo+home, home)
		}
	}
}

// TestPoolsShareRequestSlots: the pools draw on the same request slots,
// so a pool of one stalled node takes at most half of them, as a node of
// a larger pool does; past that its operations are refused at once,
// unsent. Without the sharing, a slow single-node pool (a prefix pool,
// a warm pool) would take every slot from the default pool. The sets
// come one at a time, each once the one before holds its slot on the
// stalled node or was refused: the check reserves nothing, so sets
// checked at the same instant may pass the share together (decision
// 0021), and how many would be up to the scheduler.
func TestPoolsShareRequestSlots(t *testing.T) {
	main := memcachedtest.StartN(t, 1)
	stalled := memcachedtest.StartN(t, 1)[0]
	co := func(mcs []*memcachedtest.Server) upstream.Options {
		o := clusterOptions(mcs)
		o.Timeout, o.Health.Timeout, o.RequestSlots = 10*time.Second, 10*time.Second, 8
		o.Health.Interval = time.Hour // no probe after the first: none finds the stalled node and ejects it
		return o
	}
	r, _ := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: co(main)},
		{Name: "p", Prefixes: []string{"p:"}, Cluster: co([]*memcachedtest.Server{stalled})},
	}})
	stalled.Pause()
	t.Cleanup(stalled.Resume) // before the router's cleanup, which waits for the sets
	inFlight := func() int { return inFlightOn(t, r, stalled.Addr) }
	// Half of 8 slots: the other pool's node is one to keep slots for.
	const n, share = 10, 4
	key := func(i int) string { return fmt.Sprint("p:k", i) }
	setKey := func(i int) error {
		return r.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: key(i), Value: []byte("v")}}).Err
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range share {
		wg.Go(func() { errs[i] = setKey(i) })
		waitUntil(t, 5*time.Second, fmt.Sprintf("%s holding a slot of the stalled node", key(i)),
			func() bool { return inFlight() == i+1 })
	}
	for i := share; i < n; i++ {
		errs[i] = setKey(i)
	}
	stalled.Resume()
	wg.Wait()
	for i, err := range errs {
		var be *upstream.BusyError
		switch {
		case i < share && err != nil:
			t.Errorf("set %s: %v, want it answered: the stalled node held %d of its share of %d", key(i), err, i, share)
		case i >= share && (!errors.As(err, &be) || be.Share != share):
			t.Errorf("set %s: %v, want a *BusyError at a share of %d: the stalled node holds its share", key(i), err, share)
		}
		// The refused sets were never sent: memcached holds only the answered ones.
		if _, stored := direct(t, stalled.Addr, key(i)); stored != (i < share) {
			t.Errorf("%s stored on the stalled node: %v, want %v", key(i), stored, i < share)
		}
	}
}

// TestReplicatedWritesAdmitted: a replicated write is checked against
// every replica's share of request slots before any copy is sent. With
// one replica stalled (its memcached stopped) and at its share (4 of 8
// slots), the writes past it are refused whole: no more than the share
// hold a slot for the stalled round trip (all 30 held one before), and
// no replica is left older than the other: every key reads the same on
// both. The writes come one at a time, each once the one before holds
// its slot on the stalled node or was refused: the check reserves
// nothing, so writes checked at the same instant may pass the share
// together (decision 0021), and how many did varied with scheduling.
func TestReplicatedWritesAdmitted(t *testing.T) {
	for _, write := range []WritePolicy{WriteAll, WriteFirst} {
		t.Run(string(write), func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			stalled := mcs[1]
			o := clusterOptions(mcs)
			o.Timeout, o.Health.Timeout, o.RequestSlots = 10*time.Second, 10*time.Second, 8
			o.Health.Interval = time.Hour // no probe after the first: none of the stalled node's slots is a probe's
			r, reg := newRouter(t, Options{BackgroundOps: 2, Pools: []PoolOptions{{Cluster: o, Replicas: 2, Write: write}}})
			const n, share = 30, 4
			for i := range n {
				if err := set(t.Context(), r, fmt.Sprint("k", i), "old"); err != nil {
					t.Fatal(err)
				}
			}
			r.bg.wait() // every copy of "old" landed: none holds a slot
			stalled.Pause()
			t.Cleanup(stalled.Resume) // before the router's cleanup, which waits for the writes
			inFlight := func() int { return inFlightOn(t, r, stalled.Addr) }
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range share {
				// Under the first policy the first writes are answered
				// before their stalled copies, the later ones wait for
				// them (BackgroundOps): either way each holds a slot there.
				wg.Go(func() { errs[i] = set(t.Context(), r, fmt.Sprint("k", i), "new") })
				waitUntil(t, 5*time.Second, fmt.Sprintf("k%d's copy holding a slot of the stalled node", i),
					func() bool { return inFlight() == i+1 })
			}
			for i := share; i < n; i++ {
				errs[i] = set(t.Context(), r, fmt.Sprint("k", i), "new")
			}
			stalled.Resume()
			wg.Wait()
			r.bg.wait()
			busy := 0
			for i, err := range errs {
				var be *upstream.BusyError
				switch {
				case i < share && err != nil:
					t.Errorf("set k%d: %v, want it answered: the stalled node held %d of its share of %d", i, err, i, share)
				case i >= share && !errors.As(err, &be):
					t.Errorf("set k%d: %v, want a *BusyError: the stalled node holds its share of %d", i, err, share)
				}
				if errors.As(err, &be) {
					busy++
				}
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			counted := 0.0
			for _, mf := range mfs {
				if mf.GetName() != "memcgate_upstream_ops_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "result" && l.GetValue() == "busy" {
							counted += m.GetCounter().GetValue()
						}
					}
				}
			}
			if int(counted) != busy {
				t.Errorf(`ops_total{result="busy"} = %v, want the %d writes refused`, counted, busy)
			}
			for i := range n {
				key, want := fmt.Sprint("k", i), "new"
				if i >= share {
					want = "old"
				}
				a, _ := direct(t, mcs[0].Addr, key)
				b, _ := direct(t, stalled.Addr, key)
				if a != want || b != want {
					t.Errorf("%s: %q on one replica, %q on the other, want %q on both", key, a, b, want)
				}
			}
		})
	}
}

// inFlightOn is the requests in flight on r's node addr.
func inFlightOn(t *testing.T, r *Router, addr string) int {
	t.Helper()
	for _, ns := range r.Nodes() {
		if ns.Node == addr {
			return ns.InFlight
		}
	}
	t.Fatalf("no node %s in %v", addr, r.Nodes())
	return 0
}

// logLines is an io.Writer for a logger that passes on each line (slog
// writes one a call) to the test, and drops those the test has no room
// for rather than hold up the logger.
type logLines chan string

func (l logLines) Write(p []byte) (int, error) {
	select {
	case l <- string(p):
	default:
	}
	return len(p), nil
}

// await waits up to 10s for a JSON line whose msg starts with prefix,
// decodes it into rec and returns it.
func (l logLines) await(t *testing.T, prefix string, rec any) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		var line string
		select {
		case line = <-l:
		case <-timeout:
			t.Fatalf("no line %q logged within 10s", prefix)
		}
		var m struct{ Msg string }
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if strings.HasPrefix(m.Msg, prefix) {
			if err := json.Unmarshal([]byte(line), rec); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			return line
		}
	}
}

// TestReplicaWriteFailureLogged: a replica write that fails is logged at
// warn with its pool, policy, verb and node, the metric's result (failed
// before the answer, background_failed after it) and the count of lines
// held back, as well as counted.
func TestReplicaWriteFailureLogged(t *testing.T) {
	for _, tc := range []struct {
		policy WritePolicy
		result string
	}{{WriteAll, "failed"}, {WriteMajority, "background_failed"}} {
		t.Run(string(tc.policy), func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 3)
			co := clusterOptions(mcs)
			co.Health.PassiveFails = 0 // the paused node stays up: its writes time out
			co.Health.Interval = time.Hour
			lines := make(logLines, 256)
			r, _ := newLoggingRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 3, Write: tc.policy}}}, slog.New(slog.NewJSONHandler(lines, nil)))
			mcs[2].Pause()
			defer mcs[2].Resume()
			_ = set(t.Context(), r, "k", "v")
			var rec struct {
				Level, Pool, Policy, Verb, Node, Result, Err string
				Unlogged                                     *uint64 `json:"unlogged_before"`
			}
			line := lines.await(t, "a replica write failed", &rec)
			if rec.Level != "WARN" || rec.Pool != "main" || rec.Policy != string(tc.policy) || rec.Verb != "set" ||
				rec.Node != mcs[2].Addr || rec.Result != tc.result || rec.Err == "" || rec.Unlogged == nil || *rec.Unlogged != 0 {
				t.Errorf("logged %s, want WARN pool main, policy %s, verb set, node %s, result %s, an err and unlogged_before 0",
					line, tc.policy, mcs[2].Addr, tc.result)
			}
			if got := testutil.ToFloat64(r.m.writes.WithLabelValues("main", string(tc.policy), tc.result)); got != 1 {
				t.Errorf("memcgate_pool_replica_writes_total{result=%q} = %v, want 1", tc.result, got)
			}
		})
	}
}

// TestUnreadyNamesPool: with several pools, what /readyz says names the
// pool; a pool other than the default one that is down leaves the
// gateway ready (its own keys fail).
func TestUnreadyNamesPool(t *testing.T) {
	main := memcachedtest.StartN(t, 1)
	sess := memcachedtest.StartN(t, 1)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(main)},
		{Name: "sessions", Prefixes: []string{"session:"}, Cluster: clusterOptions(sess)},
	}})
	if got := r.Unready(); got != "" {
		t.Fatalf("Unready() with every node up = %q, want \"\"", got)
	}
	sess[0].Kill()
	waitUntil(t, 5*time.Second, "sessions node down", func() bool {
		return !r.pools[1].c.Nodes()[0].Up
	})
	if got := r.Unready(); got != "" {
		t.Errorf("Unready() with the sessions pool down = %q, want \"\" (ready)", got)
	}
	main[0].Kill()
	waitUntil(t, 5*time.Second, "not ready", func() bool { return !r.Ready() })
	if got, want := r.Unready(), "pool "+DefaultPool+": no memcached node is up (0 of 1)"; got != want {
		t.Errorf("Unready() with the default pool down = %q, want %q", got, want)
	}
}

// TestCASCheckUnanswered: a checked write whose replica does not answer
// in time (paused) may still be applied there once it resumes, and its
// copies never go to the other replicas. Those must not go on serving
// the version it replaced or deleted: the gateway cannot tell whether
// the check passed, so it drops the key from them (a miss, which a cache
// may always answer), under every write policy, over mcpipe's pipelined
// connections and gomemcache's pool (PipelineConns 0).
func TestCASCheckUnanswered(t *testing.T) {
	for _, pol := range []WritePolicy{WriteAll, WriteMajority, WriteFirst} {
		for _, verb := range []op.Verb{op.CAS, op.DeleteCAS} {
			for _, conns := range []int{2, 0} {
				t.Run(fmt.Sprintf("%s/%v/conns=%d", pol, verb, conns), func(t *testing.T) {
					mcs := memcachedtest.StartN(t, 2)
					co := clusterOptions(mcs)
					co.PipelineConns = conns
					// Nothing ejects the paused node: it is back, and
					// takes the write, before any health check could tell.
					co.Health.Interval, co.Health.PassiveFails = time.Hour, 1000
					r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 2, Write: pol}}})
					ctx := t.Context()
					if err := set(ctx, r, "k", "v1"); err != nil {
						t.Fatal(err)
					}
					waitUntil(t, 5*time.Second, "v1 on both", func() bool { return len(copies(t, mcs, "k", "v1")) == 2 })
					res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
					if res.Err != nil {
						t.Fatal(res.Err)
					}
					byAddr := map[string]*memcachedtest.Server{mcs[0].Addr: mcs[0], mcs[1].Addr: mcs[1]}
					nodes := r.Placement("k").ReplicaNodes
					checked, other := byAddr[nodes[0]], byAddr[nodes[1]]
					checked.Pause()
					o := op.Op{Verb: verb, Item: op.Item{Key: "k", Value: []byte("v3"), CAS: res.Item.CAS, CASNode: res.Item.CASNode}}
					err := r.Do(ctx, o).Err
					checked.Resume()
					if err == nil {
						t.Fatalf("%v on a paused replica answered", verb)
					}
					// The replica checked may apply it later, and the
					// other copies are gone: the error says so.
					if !errors.Is(err, upstream.ErrPartlyApplied) {
						t.Errorf("%v unanswered on the replica checked: %v, want it to wrap ErrPartlyApplied", verb, err)
					}
					waitUntil(t, 5*time.Second, "the other replica without v1", func() bool {
						v, ok := direct(t, other.Addr, "k")
						return !ok || v != "v1"
					})
					// The paused replica takes the write once resumed (what
					// makes v1 beside it wrong); memcached reads what was
					// sent before the connection closed.
					want, held := "v3", true
					if verb == op.DeleteCAS {
						want, held = "", false
					}
					for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
						v, ok := direct(t, checked.Addr, "k")
						if ok == held && v == want {
							break
						}
						if time.Now().After(deadline) {
							t.Logf("scenario: the paused replica holds %q (%v), not what %v wrote: it did not apply it", v, ok, verb)
							break
						}
					}
				})
			}
		}
	}
}
