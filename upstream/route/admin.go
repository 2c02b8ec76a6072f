package route

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/hashring"
	"github.com/memcgate/memcgate/upstream/op"
)

// Placement is where a key goes, for /debug/owners: the route that
// chose its pool, the pool's policy, the key's replicas now, and its
// chain in that pool.
type Placement struct {
	// Route is the prefix that sent the key to its pool; empty for the
	// default pool.
	Route string `json:"route"`
	// Pool names the pool the key goes to.
	Pool string `json:"pool"`
	// Replicas is the copies the pool keeps of each key.
	Replicas int `json:"replicas"`
	// WritePolicy says which replicas' answers a write waits for.
	WritePolicy WritePolicy `json:"write_policy"`
	// ReadPolicy says how reads pick among the replicas.
	ReadPolicy ReadPolicy `json:"read_policy"`
	// MissFallback says whether a miss asks the next replica.
	MissFallback bool `json:"miss_fallback"`
	// ReplicaNodes are the nodes holding the key's copies now, in the
	// order reads ask them; with one copy, the node serving it.
	ReplicaNodes []string `json:"replica_nodes"`
	// Warm is the pool the key's misses are read from; empty for none.
	Warm string `json:"warm,omitempty"`
	// Shadow is the pool the key's pool mirrors its sample to; Shadowed
	// says whether this key is in the sample.
	Shadow   string `json:"shadow,omitempty"`
	Shadowed bool   `json:"shadowed,omitempty"`
	upstream.Placement
}

// Placement returns where key goes now.
func (r *Router) Placement(key string) Placement {
	t := r.t.Load()
	v, prefix := t.pick(key)
	p := Placement{Route: prefix, Pool: v.name, Replicas: v.replicas, WritePolicy: v.write, ReadPolicy: v.read,
		MissFallback: v.miss, ReplicaNodes: []string{}, Placement: v.c.Placement(key)}
	if v.pol.warm != nil {
		p.Warm = v.pol.warm.name
	}
	if v.pol.shadow != nil {
		p.Shadow, p.Shadowed = v.pol.shadow.name, v.pol.sampled(key)
	}
	if v.replicas == 1 {
		if p.Serving != "" {
			p.ReplicaNodes = append(p.ReplicaNodes, p.Serving)
		}
		return p
	}
	set := v.c.Replicas(&op.Op{Item: op.Item{Key: key}}, v.replicas)
	for _, rep := range set.Replicas {
		p.ReplicaNodes = append(p.ReplicaNodes, rep.Node())
	}
	return p
}

// Nodes returns every pool's node states, pool by pool in configured
// order; with several pools each names its pool.
func (r *Router) Nodes() []upstream.NodeStatus {
	var out []upstream.NodeStatus
	for _, p := range r.pools {
		out = append(out, p.c.Nodes()...)
	}
	return out
}

// PoolStatus is one pool as the status page shows it.
type PoolStatus struct {
	Name          string        // PoolOptions.Name; the pool label of the metrics
	Prefixes      []string      // empty for the default pool, which takes the other keys
	Replicas      int           // copies of each key
	Write         WritePolicy   // when a write is answered
	Read          ReadPolicy    // first, or hedged
	MissFallback  bool          // a miss on one replica reads the next
	HedgeDelay    time.Duration // the current delay of a hedged pool; 0 otherwise
	Warm          string        // the pool its misses are read from; empty for none
	Shadow        string        // the pool its shadow sample goes to; empty for none
	ShadowPercent float64       // the sample's share of the keys, with a Shadow pool
	Nodes         []upstream.NodeStatus
	Shares        map[string]float64 // each node's share of the keys (upstream.Cluster.Shares)
}

// Status returns every pool's state, in configured order.
func (r *Router) Status() []PoolStatus {
	t := r.t.Load()
	out := make([]PoolStatus, len(t.views))
	for i, v := range t.views {
		out[i] = PoolStatus{Name: v.name, Prefixes: slices.Clone(v.prefixes), Replicas: v.replicas, Write: v.write,
			Read: v.read, MissFallback: v.miss, Nodes: v.c.Nodes(), Shares: v.c.Shares()}
		if v.read == ReadHedged && v.replicas > 1 {
			out[i].HedgeDelay = time.Duration(v.delay.Load())
		}
		if v.pol.warm != nil {
			out[i].Warm = v.pol.warm.name
		}
		if v.pol.shadow != nil {
			out[i].Shadow, out[i].ShadowPercent = v.pol.shadow.name, v.pol.shadowPct
		}
	}
	return out
}

// FlushAll sends flush_all to every node of every pool once (a node in
// two pools once), as upstream.Cluster.FlushAll.
func (r *Router) FlushAll(ctx context.Context, delay int32) []upstream.NodeReply {
	return r.everyPool(func(c *upstream.Cluster) []upstream.NodeReply { return c.FlushAll(ctx, delay) })
}

// Stats asks every node of every pool for its stats, once per node.
func (r *Router) Stats(ctx context.Context) []upstream.NodeReply {
	return r.everyPool(func(c *upstream.Cluster) []upstream.NodeReply { return c.Stats(ctx) })
}

// Version asks every node of every pool for its version, once per node.
func (r *Router) Version(ctx context.Context) []upstream.NodeReply {
	return r.everyPool(func(c *upstream.Cluster) []upstream.NodeReply { return c.Version(ctx) })
}

// everyPool runs a cluster-wide command on the pools in parallel and
// keeps one reply per node name.
func (r *Router) everyPool(f func(*upstream.Cluster) []upstream.NodeReply) []upstream.NodeReply {
	if len(r.pools) == 1 {
		return f(r.pools[0].c)
	}
	replies := make([][]upstream.NodeReply, len(r.pools))
	var wg sync.WaitGroup
	for i, p := range r.pools {
		wg.Go(func() { replies[i] = f(p.c) })
	}
	wg.Wait()
	var out []upstream.NodeReply
	seen := map[string]bool{}
	for _, rs := range replies {
		for _, rep := range rs {
			if !seen[rep.Node] {
				seen[rep.Node] = true
				out = append(out, rep)
			}
		}
	}
	return out
}

// Change is what Reconfigure changed in one pool.
type Change struct {
	Pool string `json:"pool"`
	// Servers is what changed in the pool's nodes, nil if nothing did.
	Servers *upstream.Change `json:"servers,omitempty"`
	// Policy lists the routing settings that changed: prefixes,
	// replicas, write, read, miss_fallback, warm, shadow, shadow_percent.
	Policy []string `json:"policy,omitempty"`
}

// Reconfigure applies opts to the running pools without stopping a
// request: each pool's nodes and distribution, prefixes, replicas and
// policies. The pools must be the same ones, by name, with the same
// default pool, and each keeps its failover policy: a pool added or
// removed needs a restart (its health checks and metric series start
// with the process), and a cluster's failover policy is fixed when it is
// built. The pools' other cluster options and the router's options are
// not changed.
//
// It changes every pool or none: each pool's new server list is
// prepared first (upstream.Cluster.Prepare: its ring built, the nodes it
// adds probed, every refusal checked), all pools at once, and committed
// only if every pool's was; else every prepared list is discarded, and
// the error names each pool refused. ctx cuts short the wait for the
// probes of the nodes added, which then start down; that wait holds no
// lock that operations or Ready take.
func (r *Router) Reconfigure(ctx context.Context, opts Options) ([]Change, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	have, want := r.Pools(), make([]string, len(opts.Pools))
	for i, p := range opts.Pools {
		want[i] = p.Name
	}
	if want[0] != have[0] || !sameSet(have, want) {
		return nil, fmt.Errorf("route: the pools would change from %s to %s: adding or removing a pool, or changing the default one, needs a restart",
			strings.Join(have, ", "), strings.Join(want, ", "))
	}
	pools := make([]*pool, len(opts.Pools)) // the pool of each of opts.Pools
	for i, po := range opts.Pools {
		if _, err := hashring.New(distributionOf(po.Cluster), membersOf(po.Cluster.Servers)); err != nil {
			return nil, fmt.Errorf("pool %q: %w", po.Name, err)
		}
		pools[i] = r.pools[slices.IndexFunc(r.pools, func(p *pool) bool { return p.name == po.Name })]
		if f := po.Cluster.WithDefaults().Failover; f != pools[i].fail {
			return nil, fmt.Errorf("pool %q: its failover policy would change from %s to %s, which needs a restart", po.Name, pools[i].fail, f)
		}
	}
	prepared, err := prepare(ctx, pools, opts.Pools)
	if err != nil {
		return nil, err
	}
	old := r.t.Load()
	r.layout.Add(1) // before any change applies (Layout)
	var changes []Change
	for i, po := range opts.Pools {
		p := pools[i]
		ch := Change{Pool: po.Name}
		if sc := prepared[i].Commit(); len(sc.Added)+len(sc.Removed) > 0 || sc.Reweighted || len(sc.KeysBack) > 0 {
			ch.Servers = &sc
		}
		ov := old.views[slices.IndexFunc(old.views, func(v *view) bool { return v.pool == p })]
		if !slices.Equal(ov.prefixes, po.Prefixes) {
			ch.Policy = append(ch.Policy, "prefixes")
		}
		if ov.replicas != po.Replicas {
			ch.Policy = append(ch.Policy, "replicas")
		}
		if ov.write != po.Write {
			ch.Policy = append(ch.Policy, "write")
		}
		if ov.read != po.Read {
			ch.Policy = append(ch.Policy, "read")
		}
		if ov.miss != po.MissFallback {
			ch.Policy = append(ch.Policy, "miss_fallback")
		}
		ch.Policy = append(ch.Policy, policyChanges(ov, po)...)
		if ch.Servers != nil || len(ch.Policy) > 0 {
			changes = append(changes, ch)
		}
	}
	ordered := make([]PoolOptions, 0, len(opts.Pools))
	for _, name := range have { // the pools keep their configured order
		ordered = append(ordered, opts.Pools[slices.IndexFunc(opts.Pools, func(p PoolOptions) bool { return p.Name == name })])
	}
	r.t.Store(r.newTable(ordered))
	r.layout.Add(1) // after the last change (Layout)
	r.shareSlots()  // the pools' node counts may have changed
	return changes, nil
}

// prepare readies the server list of opts[i] for pools[i], every pool
// at once, so that the reload waits for one round of probes however
// many pools add nodes. If any pool's is refused, it discards every one
// prepared and returns the refusals, each naming its pool. A pool's
// flush-before-re-admission policy (a replicated pool flushes the nodes
// it adds back) and copies go with its list.
func prepare(ctx context.Context, pools []*pool, opts []PoolOptions) ([]*upstream.Prepared, error) {
	next := func(po PoolOptions) upstream.NextServers {
		return upstream.NextServers{Servers: po.Cluster.Servers, Distribution: distributionOf(po.Cluster),
			ReadmitFlush: po.Cluster.Health.ReadmitFlush, Copies: po.Replicas}
	}
	if len(pools) == 1 {
		p, err := pools[0].c.Prepare(ctx, next(opts[0]))
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", opts[0].Name, err)
		}
		return []*upstream.Prepared{p}, nil
	}
	prepared := make([]*upstream.Prepared, len(pools))
	errs := make([]error, len(pools))
	var wg sync.WaitGroup
	for i, p := range pools {
		wg.Go(func() {
			prepared[i], errs[i] = p.c.Prepare(ctx, next(opts[i]))
			if errs[i] != nil {
				errs[i] = fmt.Errorf("pool %q: %w", opts[i].Name, errs[i])
			}
		})
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		return prepared, nil
	}
	for _, p := range prepared {
		if p != nil {
			p.Discard()
		}
	}
	return nil, fmt.Errorf("%w (no pool changed: a reload changes every pool or none)", err)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// distributionOf is o's distribution with upstream's default.
func distributionOf(o upstream.Options) hashring.Distribution {
	return o.WithDefaults().Distribution
}

func membersOf(servers []upstream.Server) []hashring.Member {
	out := make([]hashring.Member, len(servers))
	for i, s := range servers {
		out[i] = hashring.Member{Host: s.Host, Port: s.Port, Weight: max(s.Weight, 1)}
	}
	return out
}
