package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// warmRouter is a router whose default pool (cold) fills from pool "old"
// (warm), which no prefix reaches.
func warmRouter(t *testing.T) (r *Router, reg *prometheus.Registry, cold, warm *memcachedtest.Server) {
	t.Helper()
	c, w := memcachedtest.StartN(t, 1), memcachedtest.StartN(t, 1)
	r, reg = newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(c), Warm: "old"},
		{Name: "old", Cluster: clusterOptions(w)},
	}, WarmDefaultTTL: 30 * time.Second})
	return r, reg, c[0], w[0]
}

func directSet(t *testing.T, addr, key, value string, ttl int32) {
	t.Helper()
	c := memcache.New(addr)
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: key, Value: []byte(value), Flags: 7, Expiration: ttl}); err != nil {
		t.Fatalf("direct set %s on %s: %v", key, addr, err)
	}
}

// directTTL is the remaining TTL memcached at addr reports for key (-1:
// never expires), with the meta protocol.
func directTTL(t *testing.T, r *Router, pool, key string) int32 {
	t.Helper()
	for _, p := range r.pools {
		if p.name == pool {
			ttl, _, err := p.c.TTL(t.Context(), op.Op{Item: op.Item{Key: key}})
			if err != nil {
				t.Fatalf("TTL(%s) in %s: %v", key, pool, err)
			}
			return ttl
		}
	}
	t.Fatalf("no pool %s", pool)
	return 0
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func TestWarmUpReadsFillTheColdPool(t *testing.T) {
	r, reg, cold, warm := warmRouter(t)
	ctx := t.Context()
	directSet(t, warm.Addr, "ttl", "from-warm", 100)
	directSet(t, warm.Addr, "forever", "kept", 0)

	tests := []struct {
		key, want string
		ttlMin    int32
		ttlMax    int32
	}{
		{"ttl", "from-warm", 95, 99}, // less a second, never longer than the warm item's
		{"forever", "kept", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: tt.key}})
			if res.Err != nil || string(res.Item.Value) != tt.want || res.Item.Flags != 7 {
				t.Fatalf("Get(%q) = %q flags %d, %v; want %q flags 7", tt.key, res.Item.Value, res.Item.Flags, res.Err, tt.want)
			}
			waitUntil(t, 10*time.Second, "write-back", func() bool { v, ok := direct(t, cold.Addr, tt.key); return ok && v == tt.want })
			if ttl := directTTL(t, r, DefaultPool, tt.key); ttl < tt.ttlMin || ttl > tt.ttlMax {
				t.Errorf("cold TTL of %q = %d, want %d..%d", tt.key, ttl, tt.ttlMin, tt.ttlMax)
			}
		})
	}
	if _, err := get(ctx, r, "absent"); err == nil {
		t.Errorf("Get(absent) = nil error, want a miss")
	}
	if got := counter(t, reg, "memcgate_warmup_reads_total", "result", "warm_hit"); got != 2 {
		t.Errorf("warm_hit = %v, want 2", got)
	}
	if got := counter(t, reg, "memcgate_warmup_reads_total", "result", "miss"); got != 1 {
		t.Errorf("miss = %v, want 1", got)
	}
	if _, err := get(ctx, r, "ttl"); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, reg, "memcgate_warmup_reads_total", "result", "cold_hit"); got != 1 {
		t.Errorf("cold_hit = %v, want 1", got)
	}
}

// TestWarmUpHead: a head of a key only in the warm pool answers from
// there, without reading the value and so without writing it back.
func TestWarmUpHead(t *testing.T) {
	r, reg, cold, warm := warmRouter(t)
	ctx := t.Context()
	directSet(t, warm.Addr, "only-warm", "from-warm", 100)
	res := r.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: "only-warm"}})
	if res.Err != nil || res.N != uint64(len("from-warm")) || res.Item.Flags != 7 || res.Item.Value != nil {
		t.Fatalf("head = %+v size %d, %v; want flags 7, size %d, no value", res.Item, res.N, res.Err, len("from-warm"))
	}
	if got := counter(t, reg, "memcgate_warmup_reads_total", "result", "warm_hit"); got != 1 {
		t.Errorf("warm_hit = %v, want 1", got)
	}
	r.px.warmBG.wait() // a write-back, were there one, holds the warm-up budget from before the head was answered until it lands
	if v, ok := direct(t, cold.Addr, "only-warm"); ok {
		t.Errorf("the cold pool holds %q after a head: written back without a value", v)
	}
	if res := r.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: "absent"}}); !errors.Is(res.Err, upstream.ErrNotFound) {
		t.Errorf("head of a key in neither pool: %v, want a miss", res.Err)
	}
}

// TestWarmUpPeek: a get marked Peek (the look at an item before a write
// of its key decides how to write it) of a key only in the warm pool
// answers from there but is not written back: the write that follows
// (a delete) would race the copy, which could land after it.
func TestWarmUpPeek(t *testing.T) {
	r, reg, cold, warm := warmRouter(t)
	ctx := t.Context()
	directSet(t, warm.Addr, "only-warm", "from-warm", 100)
	res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "only-warm"}, Peek: true})
	if res.Err != nil || string(res.Item.Value) != "from-warm" {
		t.Fatalf("peek = %q, %v; want the warm pool's value", res.Item.Value, res.Err)
	}
	if got := counter(t, reg, "memcgate_warmup_reads_total", "result", "warm_hit"); got != 1 {
		t.Errorf("warm_hit = %v, want 1", got)
	}
	r.px.warmBG.wait()
	if v, ok := direct(t, cold.Addr, "only-warm"); ok {
		t.Errorf("the cold pool holds %q after a peek: written back", v)
	}
}

// TestWarmUpRetire: a touch marked Retire (a value's chunks let go after
// their index was replaced or deleted) touches the key where it is, in
// either pool, and copies nothing into the cold pool. Before, each chunk
// only the warm pool held was copied into the cold pool first, as for a
// touch that keeps an item: a DELETE of a 30 MB value read from the warm
// pool copied all 30 MB (29 chunks) into the cold pool to let it expire,
// in 129 ms on loopback (7 ms after).
func TestWarmUpRetire(t *testing.T) {
	r, reg, cold, warm := warmRouter(t)
	ctx := t.Context()
	directSet(t, warm.Addr, "only-warm", "w", 3600)
	directSet(t, cold.Addr, "only-cold", "c", 3600)
	tests := []struct {
		key     string
		wantErr error
	}{
		{"only-warm", nil},
		{"only-cold", nil},
		{"nowhere", upstream.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			res := r.Do(ctx, op.Op{Verb: op.Touch, Item: op.Item{Key: tt.key, Expiration: 60}, Retire: true})
			if !errors.Is(res.Err, tt.wantErr) {
				t.Fatalf("retiring touch of %s = %v, want %v", tt.key, res.Err, tt.wantErr)
			}
		})
	}
	if v, ok := direct(t, cold.Addr, "only-warm"); ok {
		t.Errorf("the cold pool holds %q after a retiring touch: copied", v)
	}
	if got := counter(t, reg, "memcgate_warmup_writebacks_total", "result", "stored"); got != 0 {
		t.Errorf("write-backs stored = %v, want 0", got)
	}
	for _, tc := range []struct{ pool, key string }{{"old", "only-warm"}, {DefaultPool, "only-cold"}} {
		if ttl := directTTL(t, r, tc.pool, tc.key); ttl < 55 || ttl > 60 {
			t.Errorf("TTL of %s in %s after a retiring touch to 60 s = %d", tc.key, tc.pool, ttl)
		}
	}
}

func TestWarmUpWritesInvalidateTheWarmPool(t *testing.T) {
	r, _, cold, warm := warmRouter(t)
	ctx := t.Context()
	tests := []struct {
		name      string
		o         op.Op
		coldValue string // "" = absent
	}{
		{"set", op.Op{Verb: op.Set, Item: op.Item{Key: "k-set", Value: []byte("new")}}, "new"},
		{"delete", op.Op{Verb: op.Delete, Item: op.Item{Key: "k-delete"}}, ""},
		{"append fills first", op.Op{Verb: op.Append, Item: op.Item{Key: "k-append", Value: []byte("+c")}}, "old+c"},
		{"incr fills first", op.Op{Verb: op.Incr, Item: op.Item{Key: "k-incr"}, Delta: 1}, ""},
		// If-Match: *: the key exists, if only in the warm pool.
		{"delete_cas fills first", op.Op{Verb: op.DeleteCAS, Item: op.Item{Key: "k-delete-cas"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tt.o.Item.Key
			old := "old"
			if tt.o.Verb == op.Incr {
				old = "41"
			}
			directSet(t, warm.Addr, k, old, 0)
			res := r.Do(ctx, tt.o)
			if res.Err != nil && tt.o.Verb != op.Delete {
				t.Fatalf("%s %s: %v", tt.o.Verb, k, res.Err)
			}
			if _, ok := direct(t, warm.Addr, k); ok {
				t.Errorf("%s %s: the warm pool still holds the key", tt.o.Verb, k)
			}
			want := tt.coldValue
			if tt.o.Verb == op.Incr {
				want = "42"
				if res.N != 42 {
					t.Errorf("incr %s = %d, want 42", k, res.N)
				}
			}
			got, ok := direct(t, cold.Addr, k)
			if want == "" && ok || want != "" && got != want {
				t.Errorf("%s %s: cold pool holds %q (%v), want %q", tt.o.Verb, k, got, ok, want)
			}
			if _, err := get(ctx, r, k); tt.o.Verb == op.Delete && err == nil {
				t.Errorf("Get after delete found the key: the warm value came back")
			}
		})
	}
}

func TestWarmUpGetMulti(t *testing.T) {
	r, _, cold, warm := warmRouter(t)
	ctx := t.Context()
	directSet(t, cold.Addr, "a", "cold-a", 0)
	directSet(t, warm.Addr, "b", "warm-b", 0)
	found, failed := r.GetMulti(ctx, []string{"a", "b", "c", "b"}, 0, nil)
	if len(failed) != 0 || string(found["a"].Value) != "cold-a" || string(found["b"].Value) != "warm-b" || len(found) != 2 {
		t.Fatalf("GetMulti = %v, %v; want a from cold, b from warm, c missing", found, failed)
	}
	waitUntil(t, 2*time.Second, "write-back of b", func() bool { v, ok := direct(t, cold.Addr, "b"); return ok && v == "warm-b" })
}

func TestShadowComparesAndNeverAnswers(t *testing.T) {
	main, shadow := memcachedtest.StartN(t, 1), memcachedtest.StartN(t, 1)
	so := clusterOptions(shadow)
	so.Timeout = 2 * time.Second // a loaded machine must not turn comparisons into errors
	r, reg := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(main), Shadow: "next", ShadowPercent: 100},
		{Name: "next", Cluster: so},
	}})
	ctx := t.Context()
	for i := range 10 {
		if err := set(ctx, r, fmt.Sprint("s", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, "mirrored sets", func() bool {
		return counter(t, reg, "memcgate_shadow_total", "op", "set", "result", "match") == 10
	})
	directSet(t, shadow[0].Addr, "s3", "different", 0)
	for i := range 10 {
		if v, err := get(ctx, r, fmt.Sprint("s", i)); err != nil || v != "v" {
			t.Fatalf("Get(s%d) = %q, %v; want the primary's v", i, v, err)
		}
	}
	waitUntil(t, 10*time.Second, "compared gets", func() bool {
		return counter(t, reg, "memcgate_shadow_total", "op", "get") == 10
	})
	if got := counter(t, reg, "memcgate_shadow_total", "op", "get", "result", "mismatch"); got != 1 {
		t.Errorf("get mismatches = %v, want 1 (s3 and its flags differ)", got)
	}
	if got := counter(t, reg, "memcgate_shadow_total", "op", "get", "result", "match"); got != 9 {
		t.Errorf("get matches = %v, want 9", got)
	}
}

func TestShadowSampleIsStable(t *testing.T) {
	tests := []struct {
		pct  float64
		want float64
	}{{1, 0.01}, {10, 0.10}, {50, 0.50}, {100, 1}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.pct), func(t *testing.T) {
			p := policies{shadow: &view{}, shadowCut: uint64(tt.pct / 100 * sampleSpace)}
			n := 0
			const keys = 20000
			for i := range keys {
				k := fmt.Sprint("user:", i)
				if a, b := p.sampled(k), p.sampled(k); a != b {
					t.Fatalf("sampled(%q) changes", k)
				}
				if p.sampled(k) {
					n++
				}
			}
			if got := float64(n) / keys; got < tt.want*0.8 || got > tt.want*1.2+0.001 {
				t.Errorf("sampled share at %g%% = %.4f, want about %.4f", tt.pct, got, tt.want)
			}
		})
	}
}

func TestPolicyValidation(t *testing.T) {
	collide := []upstream.Server{{Host: "127.3.120.184", Port: 11211}, {Host: "127.3.156.24", Port: 11211}}
	if a, b := upstream.NodeTag("127.3.120.184:11211"), upstream.NodeTag("127.3.156.24:11211"); a != b || a != 0xee3207b6 {
		t.Fatalf("tags %08x and %08x, want both ee3207b6", a, b)
	}
	servers := clusterOptions(nil)
	servers.Servers = []upstream.Server{{Host: "127.0.0.1", Port: 1}}
	pool := func(name string, mod func(*PoolOptions)) PoolOptions {
		p := PoolOptions{Name: name, Cluster: servers}
		if mod != nil {
			mod(&p)
		}
		return p
	}
	tests := []struct {
		name  string
		pools []PoolOptions
		want  string // "" = valid
	}{
		{"warm source without prefix", []PoolOptions{pool("main", func(p *PoolOptions) { p.Warm = "old" }), pool("old", nil)}, ""},
		{"unreached pool", []PoolOptions{pool("main", nil), pool("old", nil)}, `pool "old" has no prefix`},
		{"itself", []PoolOptions{pool("main", func(p *PoolOptions) { p.Warm = "main" })}, "names itself as its warm pool"},
		{"unknown", []PoolOptions{pool("main", func(p *PoolOptions) { p.Shadow = "nope" })}, `shadow pool "nope" is not a pool`},
		{"both", []PoolOptions{pool("main", func(p *PoolOptions) { p.Warm, p.Shadow = "old", "old" }), pool("old", nil)}, "both its warm and its shadow"},
		{"percent", []PoolOptions{pool("main", func(p *PoolOptions) { p.Shadow, p.ShadowPercent = "old", 150 }), pool("old", nil)}, "shadow percent 150"},
		{"percent alone", []PoolOptions{pool("main", func(p *PoolOptions) { p.ShadowPercent = 5 })}, "without a shadow pool"},
		// 127.3.120.184:11211 and 127.3.156.24:11211 share the CAS tag
		// ee3207b6 (upstream.NodeTag): a CAS value read from either
		// would name both.
		{"replicas share a CAS tag", []PoolOptions{pool("main", func(p *PoolOptions) {
			p.Replicas, p.Cluster.Servers = 2, []upstream.Server{collide[0], collide[1]}
		})}, `node 127.3.120.184:11211 of pool "main" and node 127.3.156.24:11211 of pool "main" share the CAS tag ee3207b6`},
		// A failover read of a pool of one copy names the node that
		// answered it (0079), so its nodes must be told apart too.
		{"one copy, a failover's tag", []PoolOptions{pool("main", func(p *PoolOptions) { p.Cluster.Servers = []upstream.Server{collide[0], collide[1]} })}, "share the CAS tag ee3207b6"},
		{"one copy, warm node shares a node's tag", []PoolOptions{pool("main", func(p *PoolOptions) {
			p.Warm, p.Cluster.Servers = "old", []upstream.Server{collide[0], {Host: "127.0.0.1", Port: 1}}
		}), pool("old", func(p *PoolOptions) { p.Cluster.Servers = []upstream.Server{collide[1]} })}, `node 127.3.120.184:11211 of pool "main" and node 127.3.156.24:11211 of pool "old" (the warm-up pool of "main") share the CAS tag ee3207b6`},
		{"warm node shares a replica's tag", []PoolOptions{pool("main", func(p *PoolOptions) {
			p.Replicas, p.Warm, p.Cluster.Servers = 2, "old", []upstream.Server{collide[0], {Host: "127.0.0.1", Port: 1}}
		}), pool("old", func(p *PoolOptions) { p.Cluster.Servers = []upstream.Server{collide[1]} })}, `node 127.3.120.184:11211 of pool "main" and node 127.3.156.24:11211 of pool "old" (the warm-up pool of "main") share the CAS tag ee3207b6`},
		{"warm pool shares a node", []PoolOptions{pool("main", func(p *PoolOptions) {
			p.Replicas, p.Warm, p.Cluster.Servers = 2, "old", []upstream.Server{collide[0], {Host: "127.0.0.1", Port: 1}}
		}), pool("old", func(p *PoolOptions) { p.Cluster.Servers = []upstream.Server{collide[0]} })}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := Options{Pools: tt.pools}
			o.withDefaults()
			err := o.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("validate() = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestWarmBudget: a write-back that finds the budget full is dropped and
// counted, and the client still gets the warm value.
func TestWarmBudget(t *testing.T) {
	c, w := memcachedtest.StartN(t, 1), memcachedtest.StartN(t, 1)
	r, _ := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(c), Warm: "old"},
		{Name: "old", Cluster: clusterOptions(w)},
	}, WarmBackgroundBytes: 4})
	directSet(t, w[0].Addr, "big", "more than four bytes", 0)
	if v, err := get(context.Background(), r, "big"); err != nil || v != "more than four bytes" {
		t.Fatalf("Get(big) = %q, %v", v, err)
	}
	if got := testutil.ToFloat64(r.px.m.writeBacks.WithLabelValues(DefaultPool, "old", "dropped")); got != 1 {
		t.Errorf("dropped write-backs = %v, want 1", got)
	}
}

// TestShadowGetMultiIsBounded: a mirrored multi-get reads the shadow pool
// within a bound of the primary's answer, so a shadow pool that holds
// what the primary lost (evicted, never written) cannot make one
// multi-get keep its whole values in the background; a value it holds
// where the primary missed is still a mismatch.
func TestShadowGetMultiIsBounded(t *testing.T) {
	main, shadow := memcachedtest.StartN(t, 1), memcachedtest.StartN(t, 1)
	so := clusterOptions(shadow)
	so.Timeout = 2 * time.Second
	r, reg := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(main), Shadow: "next", ShadowPercent: 100},
		{Name: "next", Cluster: so},
	}})
	const n, size = 16, 512 << 10
	var keys []string
	for i := range n {
		k := fmt.Sprint("m", i)
		keys = append(keys, k)
		directSet(t, shadow[0].Addr, k, strings.Repeat("x", size), 0)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	found, failed := r.GetMulti(t.Context(), keys[:n/2], 64<<20, nil)
	if len(found)+len(failed) != 0 {
		t.Fatalf("GetMulti = %d found, %d failed; want misses (the shadow never answers)", len(found), len(failed))
	}
	for _, k := range keys[n/2:] { // single GETs are mirrored as multi-gets of one key
		if res := r.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: k}}); !errors.Is(res.Err, upstream.ErrNotFound) {
			t.Fatalf("GET %s = %v, want a miss (the shadow never answers)", k, res.Err)
		}
	}
	waitUntil(t, 10*time.Second, "compared gets", func() bool {
		return counter(t, reg, "memcgate_shadow_total", "op", "get") == n
	})
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > n*size/2 {
		t.Errorf("mirrored gets allocated %d bytes for the shadow's %d values of %d bytes: it kept them", got, n, size)
	}
	if got := counter(t, reg, "memcgate_shadow_total", "op", "get", "result", "mismatch"); got != n {
		t.Errorf("get mismatches = %v, want %d (the shadow has what the primary missed)", got, n)
	}
}

// answerRoom is an op.Room that takes every value or none.
type answerRoom bool

func (r answerRoom) Reserve(int) bool { return bool(r) }
func (r answerRoom) Fits(int) bool    { return bool(r) }
func (answerRoom) Holds(n int) int    { return n }
func (answerRoom) Release(int)        {}
func (answerRoom) Lend(n int) []byte  { return make([]byte, 0, n) }

// TestShadowRefusedGAT: a gat whose value the caller's Room refused
// (upstream.ErrNoFit, the gateway's budget full) still touched the
// primary's item, which memcached had: mirrored as a touch of the
// shadow's copy, it is a match, not a mismatch. A refused gat is the
// gateway's doing, not a difference between the pools.
func TestShadowRefusedGAT(t *testing.T) {
	main, shadow := memcachedtest.StartN(t, 1), memcachedtest.StartN(t, 1)
	so := clusterOptions(shadow)
	so.Timeout = 2 * time.Second
	r, reg := newRouter(t, Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(main), Shadow: "next", ShadowPercent: 100},
		{Name: "next", Cluster: so},
	}})
	ctx := t.Context()
	big := strings.Repeat("g", 20_000) // asks the Room (16 KiB or more)
	if err := set(ctx, r, "g", big); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "mirrored set", func() bool {
		return counter(t, reg, "memcgate_shadow_total", "op", "set", "result", "match") == 1
	})
	tests := []struct {
		name    string
		room    answerRoom
		wantErr error
	}{
		{"kept", true, nil},
		{"refused", false, upstream.ErrNoFit},
	}
	for i, tt := range tests {
		res := r.Do(ctx, op.Op{Verb: op.GAT, Item: op.Item{Key: "g", Expiration: 100}, Room: tt.room})
		if !errors.Is(res.Err, tt.wantErr) {
			t.Fatalf("%s: gat = %v, want %v", tt.name, res.Err, tt.wantErr)
		}
		waitUntil(t, 10*time.Second, "compared gat", func() bool {
			return counter(t, reg, "memcgate_shadow_total", "op", "gat") == float64(i+1)
		})
		if got := counter(t, reg, "memcgate_shadow_total", "op", "gat", "result", "match"); got != float64(i+1) {
			t.Errorf("%s: %v of %d mirrored gats match, want all", tt.name, got, i+1)
		}
	}
}

// TestWarmUpFailuresLogged: a warm-up copy the cold pool refuses (a
// value over its item size) and a delete the warm pool cannot take (it
// is stopped) after a write are counted and logged at warn, with their
// pools and the count of lines held back.
func TestWarmUpFailuresLogged(t *testing.T) {
	tests := []struct {
		name   string
		metric string // its result="failed" counts the failure
		msg    string // the log line starts with it
		fail   func(t *testing.T, r *Router, warm *memcachedtest.Server)
	}{
		{"copy", "memcgate_warmup_writebacks_total", "a warm-up copy into the pool failed",
			func(t *testing.T, r *Router, warm *memcachedtest.Server) {
				big := strings.Repeat("v", 4<<10) // over the cold pool's item size
				directSet(t, warm.Addr, "big", big, 0)
				if v, err := get(t.Context(), r, "big"); err != nil || v != big {
					t.Fatalf("get big: %d bytes, %v; want the warm pool's %d", len(v), err, len(big))
				}
			}},
		{"invalidation", "memcgate_warmup_invalidations_total", "a delete in the warm pool after a write failed",
			func(t *testing.T, r *Router, warm *memcachedtest.Server) {
				warm.Pause()
				t.Cleanup(warm.Resume)
				if err := set(t.Context(), r, "k", "v"); err != nil {
					t.Fatalf("set with the warm pool stopped: %v; want the cold pool's answer", err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cold, warm := memcachedtest.StartN(t, 1, "-I", "2k", "-o", "slab_chunk_max=1024"), memcachedtest.StartN(t, 1)
			lines := make(logLines, 256)
			r, reg := newLoggingRouter(t, Options{Pools: []PoolOptions{
				{Cluster: clusterOptions(cold), Warm: "old"},
				{Name: "old", Cluster: clusterOptions(warm)},
			}, WarmDefaultTTL: 30 * time.Second}, slog.New(slog.NewJSONHandler(lines, nil)))
			tt.fail(t, r, warm[0])
			var rec struct {
				Level, Pool, Warm, Err string
				Unlogged               *uint64 `json:"unlogged_before"`
			}
			line := lines.await(t, tt.msg, &rec)
			if rec.Level != "WARN" || rec.Pool != DefaultPool || rec.Warm != "old" || rec.Err == "" || rec.Unlogged == nil || *rec.Unlogged != 0 {
				t.Errorf("logged %s, want WARN pool %s, warm old, an err and unlogged_before 0", line, DefaultPool)
			}
			if got := counter(t, reg, tt.metric, "result", "failed"); got != 1 {
				t.Errorf("%s{result=failed} = %v, want 1", tt.metric, got)
			}
		})
	}
}

// TestWarmUpCASNamesTheWarmNode: an item a warm pool answered carries a
// CAS value the warm pool's node gave out, and the cold pool's node counts
// its own. A cas with it must fail in the cold pool even when the cold
// node gives a later version of the key that very number: the client
// never read that version. Read by a get and by a multi-get, both pools
// of one copy.
func TestWarmUpCASNamesTheWarmNode(t *testing.T) {
	for _, how := range []string{"get", "multi-get"} {
		t.Run(how, func(t *testing.T) {
			r, _, cold, warm := warmRouter(t)
			ctx := t.Context()
			for range 20 { // the warm node's count runs ahead of the cold one's
				directSet(t, warm.Addr, "other", "x", 0)
			}
			directSet(t, warm.Addr, "k", "v1", 0)
			var read op.Item
			if how == "get" {
				res := r.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				read = res.Item
			} else {
				found, failed := r.GetMulti(ctx, []string{"k"}, 0, nil)
				if len(failed) != 0 || len(found) != 1 {
					t.Fatalf("GetMulti = %v, %v", found, failed)
				}
				read = found["k"]
			}
			waitUntil(t, 10*time.Second, "write-back", func() bool { _, ok := direct(t, cold.Addr, "k"); return ok })
			// Another client's writes of the key, until the cold node
			// gives one the CAS value read from the warm pool.
			mc := memcache.New(cold.Addr)
			defer mc.Close()
			for {
				it, err := mc.Get("k")
				if err != nil {
					t.Fatal(err)
				}
				if it.CasID >= read.CAS {
					if it.CasID != read.CAS {
						t.Fatalf("scenario: cold CAS %d past %d", it.CasID, read.CAS)
					}
					break
				}
				if err := set(ctx, r, "k", "v2"); err != nil {
					t.Fatal(err)
				}
			}
			res := r.Do(ctx, op.Op{Verb: op.CAS, Item: op.Item{Key: "k", Value: []byte("v3"), CAS: read.CAS, CASNode: read.CASNode}})
			if !errors.Is(res.Err, upstream.ErrCASConflict) {
				t.Errorf("cas with the CAS value read from the warm pool = %v, want a conflict: it replaced v2, which the client never read", res.Err)
			}
			if v, _ := direct(t, cold.Addr, "k"); v != "v2" {
				t.Errorf("cold pool holds %q, want v2", v)
			}
		})
	}
}
