// Package upstream talks to a cluster of memcached servers. It keeps one
// gomemcache client per server (so every node has its own keepalive pool,
// timeout and metrics), caps the operations in flight per node, places keys
// on a consistent-hash ring, checks node health actively and passively, and
// fails over to the next node on the ring.
//
// Goroutines: Run (health checks) is the caller's. Besides it, each
// pipelined connection has a reader goroutine (package mcpipe) from its
// first use to its failure or Close; a multi-get runs one goroutine per
// node batch for its duration; and a DoAsync read that fails on a
// transport error is retried on a goroutine of its own. No gomemcache
// type or error leaves the package.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/hashring"
	"github.com/memcgate/memcgate/upstream/mcpipe"
	"github.com/memcgate/memcgate/upstream/op"
)

// Server is one memcached node as configured.
type Server struct {
	Host   string // name or IP as written; hashed by the ring, resolved on every dial
	Port   int
	Weight int // share on the ring; < 1 means 1
	// UDPPort, if not zero, is the node's memcached UDP port (memcached -U):
	// SetQuiet then sends sets there as datagrams without waiting.
	UDPPort int
}

// HealthOptions configures active and passive health checking (see the
// comment at the top of health.go for the model).
type HealthOptions struct {
	Interval     time.Duration // between probe rounds; if zero, 1s
	Timeout      time.Duration // of one probe; if zero, 300ms
	Fall         int           // consecutive failed probes that eject a node; if zero, 2
	Rise         int           // consecutive passed probes that re-admit it; if zero, 2
	PassiveFails int           // consecutive data-path timeouts that eject it; 0 disables passive ejection
	// MaxEjectedPercent caps how many nodes passive ejection may hold down
	// at once (at least one); probes are not capped. If zero, 50.
	MaxEjectedPercent int
	// PanicPercent: while fewer than this share of nodes is up (but at
	// least one), route as if all were up. 0 disables panic mode.
	PanicPercent int
	// ReadyMinUpPercent is the share of nodes that must be up for Ready;
	// at least one node always. 0 means one node.
	ReadyMinUpPercent int
	FlapWindow        time.Duration // an ejection this soon after a re-admission is a flap; if zero, 60s
	FlapBackoff       time.Duration // hold-down after the first flap, doubling per flap; if zero, 5s
	FlapBackoffMax    time.Duration // cap of the hold-down; if zero, 2m
	// ReadmitFlush sends flush_all to a node before re-admitting it, so it
	// cannot serve values older than what its failover successors got.
	ReadmitFlush bool
}

// FailoverPolicy says what happens to the keys of a node that is down.
type FailoverPolicy string

const (
	// Rehash sends a down node's keys to the next live node on the ring;
	// no other key moves.
	Rehash FailoverPolicy = "rehash"
	// FailFast answers ErrNoNodes at once for a down node's keys and never
	// tries another node; the ring stays as it is.
	FailFast FailoverPolicy = "fail"
)

// Options configures a Cluster. Zero values take the defaults named on each
// field.
type Options struct {
	Servers      []Server              // required
	Distribution hashring.Distribution // if empty, hashring.Ketama
	KeyPrefix    string                // prepended to every key sent to memcached
	// HashWithPrefix places keys by the prefixed key. By default the
	// unprefixed key is hashed, as php-memcached does with OPT_PREFIX_KEY.
	HashWithPrefix bool
	Timeout        time.Duration // socket dial/read/write timeout per operation; if zero, mcpipe.DefaultTimeout (500ms)
	MaxIdleConns   int           // idle keepalive connections per node without pipelining; if zero, 64
	MaxConns       int           // without pipelining: connections, and so operations in flight, per node; if zero, 64
	// PipelineConns, if positive, sends each node's operations over that
	// many pipelined connections (package mcpipe) instead of gomemcache's
	// one operation per connection; MaxInFlight then caps operations in
	// flight.
	PipelineConns int
	// MaxInFlight caps operations in flight per node when pipelining; if
	// zero, 4096. (Without pipelining MaxConns is the cap.)
	MaxInFlight int
	MaxAttempts int            // distinct nodes tried per operation; if zero, 2
	Failover    FailoverPolicy // if empty, Rehash
	// FailoverTTL caps the expiration of writes that land on a node other
	// than the key's owner, so that when the owner returns the copies
	// elsewhere age out. 0 means no cap.
	FailoverTTL time.Duration
	Health      HealthOptions
	// BatchGets batches Gets that find all of a node's slots busy into
	// multi-key gets (see coalesce.go). The binary turns it on
	// (MEMCGATE_BATCH_GETS).
	BatchGets bool
	// Dialer opens data and probe connections; if nil, a net.Dialer with
	// Timeout. TLS to memcached plugs in here.
	Dialer func(ctx context.Context, network, address string) (net.Conn, error)
}

// WithDefaults returns o with every zero field that has a default set to
// it, as New uses it.
func (o Options) WithDefaults() Options {
	o.withDefaults()
	return o
}

func (o *Options) withDefaults() {
	if o.Distribution == "" {
		o.Distribution = hashring.Ketama
	}
	if o.Timeout <= 0 {
		o.Timeout = mcpipe.DefaultTimeout
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = 64
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 64
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 4096
	}
	o.PipelineConns = min(o.PipelineConns, o.MaxInFlight)
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 2
	}
	if o.Failover == "" {
		o.Failover = Rehash
	}
	h := &o.Health
	if h.Interval <= 0 {
		h.Interval = time.Second
	}
	if h.Timeout <= 0 {
		h.Timeout = 300 * time.Millisecond
	}
	if h.Fall <= 0 {
		h.Fall = 2
	}
	if h.Rise <= 0 {
		h.Rise = 2
	}
	if h.MaxEjectedPercent <= 0 {
		h.MaxEjectedPercent = 50
	}
	if h.FlapWindow <= 0 {
		h.FlapWindow = time.Minute
	}
	if h.FlapBackoff <= 0 {
		h.FlapBackoff = 5 * time.Second
	}
	if h.FlapBackoffMax <= 0 {
		h.FlapBackoffMax = 2 * time.Minute
	}
}

// Cluster is a set of memcached nodes behind a consistent-hash ring. It is
// safe for concurrent use. The ring never changes after New: a node that is
// down is skipped while walking the ring, which places its keys exactly
// where a ring without it would, and no other key moves.
type Cluster struct {
	nodes      []*node
	ring       *hashring.Ring
	opts       Options
	health     *healthPolicy
	m          *metrics
	log        *slog.Logger
	probed     chan struct{} // closed after the first probe round
	probedOnce sync.Once
	asyncOps   sync.Pool // of *asyncOp, GetAsync's and SetAsync's
}

// New builds a cluster. It opens no connection and starts no goroutine.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) (*Cluster, error) {
	opts.withDefaults()
	if len(opts.Servers) == 0 {
		return nil, errors.New("upstream: no servers")
	}
	members := make([]hashring.Member, len(opts.Servers))
	for i, s := range opts.Servers {
		members[i] = hashring.Member{Host: s.Host, Port: s.Port, Weight: max(s.Weight, 1)}
	}
	ring, err := hashring.New(opts.Distribution, members)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	m := newMetrics(reg)
	c := &Cluster{ring: ring, opts: opts, m: m, log: log, probed: make(chan struct{})}
	switch opts.Failover {
	case Rehash, FailFast:
	default:
		return nil, fmt.Errorf("upstream: unknown failover policy %q", opts.Failover)
	}
	c.health = &healthPolicy{
		HealthOptions: opts.Health,
		maxPassive:    int32(max(1, len(opts.Servers)*opts.Health.MaxEjectedPercent/100)),
		ejected:       func(node, reason string) { m.ejects.WithLabelValues(node, reason).Inc() },
		refused:       func(node string) { m.ejectsRefused.WithLabelValues(node).Inc() },
	}
	for _, s := range opts.Servers {
		name := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
		n := newNode(name, &c.opts, c.health, m.forNode(name), log)
		if s.UDPPort > 0 {
			n.udp = &udpSender{addr: net.JoinHostPort(s.Host, strconv.Itoa(s.UDPPort))}
		}
		c.nodes = append(c.nodes, n)
	}
	reg.MustRegister(newPoolCollector(c.nodes))
	return c, nil
}

// Close closes idle connections. The cluster may still be used afterwards.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.client.Close(), n.probe.Close())
		if n.udp != nil {
			n.udp.close()
		}
	}
	return errors.Join(errs...)
}

// keys returns the key as sent to memcached (with the prefix) and the one
// the ring places.
func (c *Cluster) keys(key string) (store, hash string) {
	if c.opts.KeyPrefix == "" {
		return key, key
	}
	store = c.opts.KeyPrefix + key
	if c.opts.HashWithPrefix {
		return store, store
	}
	return store, key
}

// Do runs one operation on its key's owner or, if the owner is down and
// the policy is Rehash, on the next live node of the key's ring order
// (route). The result's error is nil, one of the protocol outcomes
// (ErrNotFound, ErrExists, ErrCASConflict, ErrNotNumeric, ErrTooLarge,
// ErrBadKey), ErrNoNodes, or a *NodeError. A read's item may share its
// Value with other Gets of the same key batched with it: treat it as
// read-only.
func (c *Cluster) Do(ctx context.Context, o op.Op) op.Result {
	return c.doAfter(ctx, o, -1, nil)
}

// doAfter is Do after a first attempt, on node tried, failed with a node
// failure, prev (DoAsync's retry); tried < 0 if there was none.
func (c *Cluster) doAfter(ctx context.Context, o op.Op, tried int, prev error) op.Result {
	if !o.Verb.Valid() {
		return op.Result{Err: fmt.Errorf("upstream: no such verb %d", o.Verb)}
	}
	sk, hk := c.keysOf(&o)
	var res op.Result
	err := c.routeAfter(ctx, hk, o.Verb.Writes(), tried, prev, func(n *node, failover bool) (err error) {
		res, err = n.run(ctx, o, sk, failover, c.capTTL)
		return err
	})
	res.Err = err
	return res
}

// keysOf returns o's key as sent to memcached and the key the ring
// places: its HashKey if set.
func (c *Cluster) keysOf(o *op.Op) (store, hash string) {
	store, hash = c.keys(o.Item.Key)
	if o.HashKey != "" {
		hash = o.HashKey
	}
	return store, hash
}

// routeAfter runs call on the key's owner or, if the owner is down and
// the policy is Rehash, on the next live node of the key's ring order.
// After a transport failure it tries the next live node, at most
// MaxAttempts nodes in all: reads after any transport failure, writes
// only when the connection was never made, because otherwise the first
// node may have applied the write. call learns whether its node is not
// the owner. tried is a node a first attempt already failed on, with
// prev; tried < 0 if there was none.
func (c *Cluster) routeAfter(ctx context.Context, hashKey string, write bool, tried int, prev error, call func(n *node, failover bool) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ignoreHealth := c.panicking()
	failFast := c.opts.Failover == FailFast
	attempts, owner := 0, -1
	var last error
	for i := range c.ring.Owners(hashKey) {
		if owner < 0 {
			owner = i
		}
		if i == tried {
			attempts, last = attempts+1, prev
			continue
		}
		n := c.nodes[i]
		if !ignoreHealth && !n.available() {
			if failFast {
				return fmt.Errorf("%w: %s, the key's node, is down (failover policy %q)", ErrNoNodes, n.name, FailFast)
			}
			continue
		}
		attempts++
		failover := i != owner
		if failover {
			c.nodes[owner].m.failovers.Inc()
		}
		err := call(n, failover)
		if err == nil {
			return nil
		}
		dial, ok := nodeFailure(err)
		if !ok {
			return err
		}
		last = err
		if failFast || attempts >= c.opts.MaxAttempts || (write && !dial) || ctx.Err() != nil {
			return last
		}
	}
	if last != nil {
		return last
	}
	return ErrNoNodes
}

// nodeFailure reports whether err is a *NodeError, and whether it
// happened before a connection existed.
func nodeFailure(err error) (dial, ok bool) {
	var ne *NodeError
	if !errors.As(err, &ne) {
		return false, false
	}
	return ne.dial, true
}

// capTTL applies FailoverTTL to an expiration (memcached semantics:
// relative seconds up to 30 days, a Unix time above).
func (c *Cluster) capTTL(exp int32) int32 {
	limit := int32(c.opts.FailoverTTL / time.Second)
	if limit <= 0 || exp < 0 {
		return exp
	}
	if exp > relativeExpiryMax {
		if remaining := int64(exp) - time.Now().Unix(); remaining <= int64(limit) {
			return exp
		}
		return limit
	}
	if exp == 0 || exp > limit {
		return limit
	}
	return exp
}

// relativeExpiryMax is memcached's 30 days: larger expirations are Unix times.
const relativeExpiryMax = 60 * 60 * 24 * 30

// itemOf is a memcached item as an op.Item, under the client's key.
func itemOf(key string, mi *memcache.Item) op.Item {
	return op.Item{Key: key, Value: mi.Value, Flags: mi.Flags, CAS: mi.CasID}
}

// Ready reports whether the cluster can serve: the first probe round has
// finished and at least ReadyMinUpPercent of the nodes (and at least one)
// are up.
func (c *Cluster) Ready() bool {
	select {
	case <-c.probed:
	default:
		return false
	}
	n := len(c.nodes)
	need := max(1, (n*c.opts.Health.ReadyMinUpPercent+99)/100)
	return c.up() >= need
}

// Nodes returns a snapshot of every node's state, in configured order.
func (c *Cluster) Nodes() []NodeStatus {
	out := make([]NodeStatus, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.status()
	}
	return out
}

// Placement describes where a key lives, for the admin API.
type Placement struct {
	Key      string      `json:"key"`
	StoreKey string      `json:"store_key"` // with the prefix, as sent to memcached
	Serving  string      `json:"serving"`   // the node a request would use now; "" if none
	Chain    []ChainNode `json:"chain"`     // the key's nodes in failover order; the first is the owner
}

// ChainNode is one node of a key's failover chain.
type ChainNode struct {
	Node string `json:"node"`
	Up   bool   `json:"up"`
}

// Placement returns the key's owner and failover chain and the node that
// would serve it now under the failover policy.
func (c *Cluster) Placement(key string) Placement {
	sk, hk := c.keys(key)
	p := Placement{Key: key, StoreKey: sk}
	if idx, _, err := c.pick(hk); err == nil {
		p.Serving = c.nodes[idx].name
	}
	for i := range c.ring.Owners(hk) {
		p.Chain = append(p.Chain, ChainNode{Node: c.nodes[i].name, Up: c.nodes[i].available()})
	}
	return p
}
