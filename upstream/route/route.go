// Package route puts several named pools of memcached nodes behind one
// Store: a key goes to the pool whose prefix it starts with (the longest
// one), or to the default pool. A pool is an *upstream.Cluster with its
// own ring, weights and health, and a replication policy: with Replicas
// = N each key is stored on N distinct nodes of its ring, writes go to
// all of them and are answered under a write policy (all, majority,
// first), and reads ask the first replica and fall back to the next, or
// hedge: ask a second one when the first is slow. docs/pools.md describes
// each policy and what it trades.
//
// A pool of one copy is its cluster: Do, GetMulti, DoAsync and SetQuiet
// go straight to it, and with one such pool the Router adds one atomic
// load per operation and nothing else. Replication and hedging multiply
// upstream work, so both are bounded: writes finished after their answer
// (the first and majority policies) share a budget in bytes and
// operations (a write that finds it full waits for every replica), and a
// pool's hedges are capped at a share of its reads and never wait for a
// busy node.
//
// Goroutines: Run (each pool's health checks and the hedge delays) is the
// caller's. Besides it, a replicated write runs one goroutine per replica
// until that replica answers, past the write's answer for the first and
// majority policies; a hedged read runs one goroutine per replica it asks.
// A pool may also fill its misses from a warm pool or mirror a sample of
// its keys to a shadow pool (policy.go, docs/routes.md): each warm-up copy
// and each mirrored operation runs on a goroutine of its own after the
// answer, within a budget of its own, bounded by the pools' timeouts.
// Close waits for the goroutines that outlive their answers.
package route

import (
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
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/loggate"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// WritePolicy says when a write to a replicated pool is answered.
type WritePolicy string

const (
	// WriteAll answers once every replica has answered (mcrouter's
	// AllSyncRoute): the client knows every copy took the write or hears
	// that one did not.
	WriteAll WritePolicy = "all"
	// WriteMajority answers once more than half of the pool's Replicas
	// have answered (AllMajorityRoute); the rest finish in the background.
	WriteMajority WritePolicy = "majority"
	// WriteFirst answers with the first replica's answer (AllFastestRoute
	// for writes); the rest finish in the background.
	WriteFirst WritePolicy = "first"
)

// ReadPolicy says which replicas a read of a replicated pool asks.
type ReadPolicy string

const (
	// ReadFirst asks the first replica, then the next after an error (or
	// a miss, with MissFallback), one at a time.
	ReadFirst ReadPolicy = "first"
	// ReadHedged asks the first replica and, if it has not answered
	// within the pool's hedge delay, the second as well, and takes the
	// first answer: at most one extra request per read.
	ReadHedged ReadPolicy = "hedged"
)

// DefaultPool is the default pool's name when there are several.
const DefaultPool = "main"

// PoolOptions configures one pool. Zero values take the defaults named on
// each field.
type PoolOptions struct {
	// Name names the pool in metrics, logs and the admin API; if empty,
	// DefaultPool. Names are unique.
	Name string
	// Prefixes are the key prefixes routed to the pool (the key as the
	// client names it, before the cluster's KeyPrefix); the longest
	// prefix of any pool that a key starts with wins. The default pool
	// (the first) takes every key no prefix matches and needs none.
	Prefixes []string
	// Cluster configures the pool's nodes. Its Name is set to the pool's
	// when there are several pools, its Copies to Replicas; with
	// Replicas > 1 its Health.ReadmitFlush is forced on (see
	// docs/pools.md).
	Cluster upstream.Options
	// Replicas is the number of distinct nodes holding each key; if
	// zero, 1 (no replication).
	Replicas int
	// Write is the write policy; if empty, WriteAll.
	Write WritePolicy
	// Read is the read policy; if empty, ReadFirst.
	Read ReadPolicy
	// MissFallback makes a miss on one replica read the next, as an
	// error does; default false (the binary's MEMCGATE_MISS_FALLBACK is
	// true). A node that comes back starts empty, so without it its keys
	// are misses until written again.
	MissFallback bool
	// Warm names the pool this one fills its misses from (warm-up,
	// warm.go); empty for none. It must be another pool.
	Warm string
	// Shadow names the pool a sample of this pool's keys is also sent to,
	// its answers compared and counted (shadow.go); empty for none. It
	// must be another pool, not the Warm one.
	Shadow string
	// ShadowPercent is the share of keys in the shadow sample, in (0,
	// 100]; if zero with a Shadow pool, 100.
	ShadowPercent float64
}

// Options configures a Router. Zero values take the defaults named on
// each field.
type Options struct {
	// Pools are the pools; the first is the default pool. At least one.
	Pools []PoolOptions
	// HedgeMinDelay and HedgeMaxDelay bound a pool's hedge delay, which
	// follows its nodes' read latency (docs/pools.md); if zero, 1ms and
	// 50ms.
	HedgeMinDelay, HedgeMaxDelay time.Duration
	// HedgeMaxPercent caps a pool's hedged requests at this share of its
	// reads (a token bucket); if zero, 50. It is that high so that one
	// slow node of three, the first replica of a third of the reads, can
	// be hedged around; the delay, which follows the typical node, keeps
	// hedges rare when no node stands out.
	HedgeMaxPercent int
	// BackgroundBytes caps the value bytes of replica writes running
	// after their write was answered, over all pools; if zero, 16 MiB.
	BackgroundBytes int64
	// BackgroundOps caps those writes in number; if zero, 1024.
	BackgroundOps int
	// WarmDefaultTTL is the expiration of a warm-up copy whose warm item's
	// TTL could not be learned (a memcached without the meta protocol);
	// if zero, 5m.
	WarmDefaultTTL time.Duration
	// WarmBackgroundBytes and WarmBackgroundOps cap the warm-up
	// write-backs running, over all pools, in value bytes and in number;
	// past them a write-back is dropped (and counted). If zero, 16 MiB
	// and 1024.
	WarmBackgroundBytes int64
	WarmBackgroundOps   int
	// ShadowBackgroundBytes and ShadowBackgroundOps cap the operations
	// mirrored to shadow pools and running, over all pools, in value
	// bytes held and in number; past them one is dropped (and counted).
	// If zero, 16 MiB and 1024.
	ShadowBackgroundBytes int64
	ShadowBackgroundOps   int
}

func (o *Options) withDefaults() {
	if o.HedgeMinDelay <= 0 {
		o.HedgeMinDelay = time.Millisecond
	}
	if o.HedgeMaxDelay <= 0 {
		o.HedgeMaxDelay = 50 * time.Millisecond
	}
	o.HedgeMaxDelay = max(o.HedgeMaxDelay, o.HedgeMinDelay)
	if o.HedgeMaxPercent <= 0 {
		o.HedgeMaxPercent = 50
	}
	if o.BackgroundBytes <= 0 {
		o.BackgroundBytes = 16 << 20
	}
	if o.BackgroundOps <= 0 {
		o.BackgroundOps = 1024
	}
	o.withPolicyDefaults()
	for i := range o.Pools {
		p := &o.Pools[i]
		if p.Name == "" {
			p.Name = DefaultPool
		}
		if p.Replicas <= 0 {
			p.Replicas = 1
		}
		if p.Write == "" {
			p.Write = WriteAll
		}
		if p.Read == "" {
			p.Read = ReadFirst
		}
		if p.Replicas > 1 {
			p.Cluster.Health.ReadmitFlush = true
		}
		p.Cluster.Copies = p.Replicas
	}
}

// validate checks what New and Reconfigure need beyond the clusters' own
// checks.
func (o *Options) validate() error {
	if len(o.Pools) == 0 {
		return errors.New("route: no pools")
	}
	var errs []error
	names := map[string]bool{}
	prefixes := map[string]string{}
	for i, p := range o.Pools {
		if names[p.Name] {
			errs = append(errs, fmt.Errorf("route: pool %q is named twice", p.Name))
		}
		names[p.Name] = true
		if i > 0 && len(p.Prefixes) == 0 && !o.source(p.Name) {
			errs = append(errs, fmt.Errorf("route: pool %q has no prefix: no key would reach it", p.Name))
		}
		for _, pre := range p.Prefixes {
			if pre == "" {
				errs = append(errs, fmt.Errorf("route: pool %q has an empty prefix", p.Name))
			}
			if other, ok := prefixes[pre]; ok {
				errs = append(errs, fmt.Errorf("route: prefix %q goes to both pool %q and pool %q", pre, other, p.Name))
			}
			prefixes[pre] = p.Name
		}
		switch p.Write {
		case WriteAll, WriteMajority, WriteFirst:
		default:
			errs = append(errs, fmt.Errorf("route: pool %q: unknown write policy %q", p.Name, p.Write))
		}
		switch p.Read {
		case ReadFirst, ReadHedged:
		default:
			errs = append(errs, fmt.Errorf("route: pool %q: unknown read policy %q", p.Name, p.Read))
		}
		if n := len(p.Cluster.Servers); p.Replicas > n {
			errs = append(errs, fmt.Errorf("route: pool %q: %d replicas need at least %d nodes, it has %d", p.Name, p.Replicas, p.Replicas, n))
		}
	}
	errs = append(errs, o.validatePolicies()...)
	errs = append(errs, o.tagClashes()...)
	return errors.Join(errs...)
}

// tagClashes refuses two nodes whose CAS tags (upstream.NodeTag, 32
// bits of their host:port) are equal where a check would have to tell
// them apart: two nodes of a pool (a replica's read names its node, 0074,
// and so does a read a pool of one copy fails over to, 0079), or a node
// of its warm-up pool and one of its own (a warm hit names the warm
// node, 0078). The
// check refuses such a tag at run time (upstream.ErrCASNode), which
// would leave every conditional write of the keys on both nodes a 412
// with nothing to say why; a name spelled otherwise (an IP for a DNS
// name) has another tag.
func (o *Options) tagClashes() []error {
	byName := map[string]*PoolOptions{}
	for i := range o.Pools {
		byName[o.Pools[i].Name] = &o.Pools[i]
	}
	type node struct{ name, of string } // of: the pool the node is listed in, as the message names it
	var errs []error
	for _, p := range o.Pools {
		tags := map[uint32]node{}
		add := func(servers []upstream.Server, of string) {
			for _, s := range servers {
				name := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
				t := upstream.NodeTag(name)
				if other, ok := tags[t]; ok && other.name != name {
					errs = append(errs, fmt.Errorf("route: pool %q: node %s of %s and node %s of %s share the CAS tag %08x (FNV-1a of host:port), and an ETag could not tell them apart: spell one otherwise (an IP for a DNS name, or the reverse)",
						p.Name, other.name, other.of, name, of, t))
				}
				tags[t] = node{name, of}
			}
		}
		add(p.Cluster.Servers, fmt.Sprintf("pool %q", p.Name))
		if w := byName[p.Warm]; p.Warm != "" && w != nil {
			// Named as the pool whose servers= lists it, so that the
			// operator knows which entry to spell otherwise.
			add(w.Cluster.Servers, fmt.Sprintf("pool %q (the warm-up pool of %q)", w.Name, p.Name))
		}
	}
	return errs
}

// Router routes operations to pools by key prefix and applies each pool's
// replication policy. It implements the gateway's Store, AsyncStore and
// QuietSetter, and the memc endpoints' cluster commands. It is safe for
// concurrent use.
type Router struct {
	t     atomic.Pointer[table]
	pools []*pool // in configured order; the set is fixed at New
	opts  Options
	bg    *bound
	px    *policyState // warm-up and shadow budgets and metrics
	m     *metrics
	log   *slog.Logger

	mu    sync.Mutex // serializes Reconfigure and SetRequestSlots
	slots int        // the pools' RequestSlots; guarded by mu

	layout atomic.Uint64 // counts twice each Reconfigure committed: before any change, and after the last (Layout)
}

// Layout says where key is placed, as a number that changes when its
// placement may have: at each reload (Reconfigure) committed, counted
// before any change applies and again after the last, and, when key's
// pool keeps one copy, at each change of its nodes' health
// (upstream.Cluster.Moves: a write then goes to the next node, and a
// node's return takes its keys back). A caller that spreads one value
// over several operations placed by key (the chunks of a large value
// and their index) reads it before the first and after the last: if it
// is the same, they were all placed alike. A replicated pool's health
// is not counted: a copy moved to the next node leaves the value whole
// on the replicas that stayed.
func (r *Router) Layout(key string) uint64 {
	reloads := r.layout.Load()
	t := r.t.Load()
	v := t.def
	if !t.direct {
		v, _ = t.pick(key)
	}
	var moves uint64
	if v.replicas == 1 {
		moves = v.c.Moves()
	}
	return reloads<<32 + moves&(1<<32-1)
}

// table is one routing configuration: which pool each key goes to and
// each pool's policy. It never changes: Reconfigure swaps in another.
type table struct {
	def    *view
	routes []prefixRoute // longest prefix first
	views  []*view       // by pool, in configured order
	// direct: one pool, one copy; every operation is its cluster's.
	direct bool
}

type prefixRoute struct {
	prefix string
	v      *view
}

// view is a pool under one policy.
type view struct {
	*pool
	prefixes []string
	replicas int
	write    WritePolicy
	read     ReadPolicy
	miss     bool // MissFallback
	pm       policyMetrics
	pol      policies // warm-up and shadow (policy.go)
}

// pool is what stays of a pool across reconfigurations: its cluster, its
// read latencies and hedge budget, its metrics.
type pool struct {
	name    string
	c       *upstream.Cluster
	timeout time.Duration           // the cluster's socket timeout, for writes that outlive their request
	fail    upstream.FailoverPolicy // the cluster's, which Reconfigure cannot change
	bg      *bound                  // the router's background budget
	log     *slog.Logger            // the router's; nil: none
	failLog loggate.Gate            // replica write failures logged (replicaFailed)
	copyLog loggate.Gate            // warm-up copies into the pool that failed, logged (copyFailed)
	invLog  loggate.Gate            // deletes in its warm pool that failed, logged (invalidate)
	order   writeOrder              // keeps each key's writes in order on its replicas (order.go)
	lat     latencies
	hedge   hedgeBudget
	delay   atomic.Int64 // hedge delay now, in nanoseconds

	// Where panics of the pool's goroutines are stopped (the cluster's
	// Options.Panics; nil: nowhere): the copies of a replicated write,
	// the reads of a hedged or multi-pool read, and the work done in the
	// background (warm-up copies, invalidations, shadow reads).
	writePanics, readPanics, bgPanics *panicguard.Site
}

// New builds the pools' clusters and the router. It opens no connection
// and starts no goroutine. With more than one pool, every cluster's
// metrics carry a pool label; with one they are as a lone cluster's.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) (*Router, error) {
	opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	r := &Router{opts: opts, log: log, m: newMetrics(reg)}
	r.bg = newBound(opts.BackgroundBytes, int64(opts.BackgroundOps), r.m)
	r.px = newPolicyState(opts, reg)
	for _, po := range opts.Pools {
		co := po.Cluster
		creg := reg
		if len(opts.Pools) > 1 {
			co.Name = po.Name
			creg = prometheus.WrapRegistererWith(prometheus.Labels{"pool": po.Name}, reg)
		}
		c, err := upstream.New(co, log, creg)
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", po.Name, err)
		}
		p := &pool{name: po.Name, c: c, timeout: co.WithDefaults().Timeout, fail: co.WithDefaults().Failover, bg: r.bg, log: log,
			writePanics: co.Panics.Site("route_write"), readPanics: co.Panics.Site("route_read"), bgPanics: co.Panics.Site("route_background")}
		p.hedge.init(opts.HedgeMaxPercent)
		p.delay.Store(int64(opts.HedgeMaxDelay))
		r.m.hedgeDelay.WithLabelValues(p.name).Set(opts.HedgeMaxDelay.Seconds())
		r.pools = append(r.pools, p)
	}
	r.slots = opts.Pools[0].Cluster.RequestSlots // one setting for every pool
	r.shareSlots()
	r.t.Store(r.newTable(opts.Pools))
	return r, nil
}

// newTable builds the routing table of pools, which name the router's
// pools.
func (r *Router) newTable(pools []PoolOptions) *table {
	t := &table{}
	for _, po := range pools {
		i := slices.IndexFunc(r.pools, func(p *pool) bool { return p.name == po.Name })
		v := &view{pool: r.pools[i], prefixes: slices.Clone(po.Prefixes), replicas: po.Replicas,
			write: po.Write, read: po.Read, miss: po.MissFallback}
		v.pm = r.m.forPolicy(v)
		t.views = append(t.views, v)
		for _, pre := range po.Prefixes {
			t.routes = append(t.routes, prefixRoute{prefix: pre, v: v})
		}
	}
	t.linkPolicies(pools, r.px)
	t.def = t.views[0]
	slices.SortStableFunc(t.routes, func(a, b prefixRoute) int { return len(b.prefix) - len(a.prefix) })
	t.direct = len(t.views) == 1 && t.def.replicas == 1
	return t
}

// pick returns the view of key's pool and the prefix that chose it ("" for
// the default pool).
func (t *table) pick(key string) (*view, string) {
	for _, rt := range t.routes {
		if strings.HasPrefix(key, rt.prefix) {
			return rt.v, rt.prefix
		}
	}
	return t.def, ""
}

// routeKey is the key o is routed by: the one the ring places.
func routeKey(o *op.Op) string {
	if o.HashKey != "" {
		return o.HashKey
	}
	return o.Item.Key
}

// Do runs one operation in its key's pool under the pool's policy. The
// result's error is one of package upstream's; a replicated write that
// did not reach as many replicas as its policy needs wraps the failure
// that stopped it.
func (r *Router) Do(ctx context.Context, o op.Op) op.Result {
	t := r.t.Load()
	if t.direct {
		return t.def.c.Do(ctx, o)
	}
	v, _ := t.pick(routeKey(&o))
	if v.pol.active() {
		return v.doPolicies(ctx, o)
	}
	if v.replicas == 1 {
		return v.c.Do(ctx, o)
	}
	return v.do(ctx, o)
}

// DoAsync starts o without waiting if its pool keeps one copy (see
// upstream.Cluster.DoAsync); for a replicated pool it declines, and the
// caller's Do replicates.
func (r *Router) DoAsync(ctx context.Context, o op.Op, done func(op.Result)) bool {
	t := r.t.Load()
	if t.direct {
		return t.def.c.DoAsync(ctx, o, done)
	}
	v, _ := t.pick(routeKey(&o))
	if v.replicas != 1 || v.pol.active() {
		return false
	}
	return v.c.DoAsync(ctx, o, done)
}

// SetQuiet sets without waiting for memcached where the key's pool keeps
// one copy (see upstream.Cluster.SetQuiet); udp reports whether the set
// left as a datagram nobody confirms. A replicated pool's quiet set is an
// ordinary replicated Set: a datagram nobody answers cannot be counted
// toward a write policy.
func (r *Router) SetQuiet(ctx context.Context, it op.Item) (udp bool, err error) {
	t := r.t.Load()
	if t.direct {
		return t.def.c.SetQuiet(ctx, it)
	}
	v, _ := t.pick(it.Key)
	switch {
	case v.pol.active():
		return false, v.doPolicies(ctx, op.Op{Verb: op.Set, Item: it, Queued: true}).Err
	case v.replicas == 1:
		return v.c.SetQuiet(ctx, it)
	}
	return false, v.do(ctx, op.Op{Verb: op.Set, Item: it, Queued: true}).Err
}

// Up reports whether an operation on key could be served now: in a pool
// of one copy, its node or one it fails over to is up; in a replicated
// pool, enough replicas are up for the write policy.
func (r *Router) Up(key string) bool {
	t := r.t.Load()
	if t.direct {
		return t.def.c.Up(key)
	}
	v, _ := t.pick(key)
	if v.replicas == 1 {
		return v.c.Up(key)
	}
	set := v.c.Replicas(&op.Op{Item: op.Item{Key: key}}, v.replicas)
	_, err := v.need(len(set.Replicas))
	return err == nil
}

// Owner returns the index of key's home node (upstream.Cluster.Owner in
// the key's pool) among the n nodes of the pools keys are routed to (the
// default pool and those with prefixes; not a pool that is only a warm-up
// source or a shadow, where no write is routed), numbered pool after pool
// in configured order: 0 <= i < n. In a replicated pool the home is the
// first of the key's replicas.
func (r *Router) Owner(key string) (i, n int) {
	t := r.t.Load()
	if t.direct {
		return t.def.c.Owner(key)
	}
	v, _ := t.pick(key)
	for _, w := range t.views {
		switch {
		case w == v:
			home, nodes := w.c.Owner(key)
			i, n = n+home, n+nodes
		case w == t.def || len(w.prefixes) > 0:
			n += w.c.Len()
		}
	}
	return i, n
}

// Run runs every pool's health checks, and updates the pools' hedge
// delays every second, until ctx is done; it returns nil then.
func (r *Router) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, p := range r.pools {
		wg.Go(func() { _ = p.c.Run(ctx) })
	}
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				r.updateDelays()
			}
		}
	})
	wg.Wait()
	return nil
}

// Ready reports whether the gateway can serve: the default pool is ready
// (upstream.Cluster.Ready) and every other pool has finished its first
// probe round. A pool other than the default one that is down fails its
// own keys (503) but does not take the gateway out of its load balancer,
// where every gateway would be out alike.
func (r *Router) Ready() bool { return r.Unready() == "" }

// Unready says why the gateway cannot serve (Ready is false), naming the
// pool when there are several, or returns "" when it can.
func (r *Router) Unready() string {
	for i, p := range r.pools {
		why := ""
		switch {
		case i == 0:
			why = p.c.Unready()
		case !p.c.Probed():
			why = "the first round of health checks has not finished"
		}
		if why == "" {
			continue
		}
		if len(r.pools) > 1 {
			return "pool " + p.name + ": " + why
		}
		return why
	}
	return ""
}

// Close waits for the work that runs past its answers (replica writes
// under the first and majority policies, warm-up write-backs, mirrored
// shadow operations; each ends by its own deadline), so that writes
// already answered are not dropped, and then closes every pool's idle
// connections. Call it once no operation is being started.
func (r *Router) Close() error {
	r.bg.wait()
	r.px.warmBG.wait()
	r.px.shadBG.wait()
	var errs []error
	for _, p := range r.pools {
		errs = append(errs, p.c.Close())
	}
	return errors.Join(errs...)
}

// SetRequestSlots changes every pool's upstream.Options.RequestSlots: the
// caller's cap on requests in flight, of which each node may hold a share.
func (r *Router) SetRequestSlots(slots int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slots = slots
	r.shareSlots()
}

// CountRequests gives every pool the caller's count of its requests in
// flight (upstream.Cluster.CountRequests).
func (r *Router) CountRequests(f func() int64) {
	for _, p := range r.pools {
		p.c.CountRequests(f)
	}
}

// ShareBytes gives every pool the caller's byte budget, of which each
// node's reads hold at most a share (upstream.Cluster.ShareBytes).
func (r *Router) ShareBytes(b upstream.ByteBudget) {
	for _, p := range r.pools {
		p.c.ShareBytes(b)
	}
}

// shareSlots gives every pool the slots and the number of nodes of the
// other pools: the pools draw on the same slots, so a pool of one node
// takes at most half of them, as a node of a larger pool does. r.mu is
// held, or r is not yet shared.
func (r *Router) shareSlots() {
	total := 0
	for _, p := range r.pools {
		total += p.c.Len()
	}
	for _, p := range r.pools {
		p.c.SetRequestSlots(r.slots, total-p.c.Len())
	}
}

// Pools returns the pools' names, in configured order.
func (r *Router) Pools() []string {
	out := make([]string, len(r.pools))
	for i, p := range r.pools {
		out[i] = p.name
	}
	return out
}
