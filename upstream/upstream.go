// Package upstream talks to a cluster of memcached servers. It keeps one
// gomemcache client per server (so every node has its own keepalive pool,
// timeout and metrics), caps the operations in flight per node, places keys
// on a consistent-hash ring, checks node health actively and passively, and
// fails over to the next node on the ring.
//
// Nothing in this package starts a goroutine except Run, which the caller
// owns. No gomemcache type or error leaves the package.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/hashring"
)

// Item is a memcached item.
type Item struct {
	Key        string // as the client named it, without the cluster's KeyPrefix
	Value      []byte
	Flags      uint32
	Expiration int32  // seconds; 0 = never; memcached's 30-day rule applies
	CAS        uint64 // filled by Get; required by CompareAndSwap
}

// Server is one memcached node as configured.
type Server struct {
	Host   string // name or IP as written; hashed by the ring, resolved on every dial
	Port   int
	Weight int // share on the ring; < 1 means 1
}

// HealthOptions configures active and passive health checking.
type HealthOptions struct {
	Interval     time.Duration // between probe rounds; if zero, 1s
	Timeout      time.Duration // of one probe; if zero, 300ms
	Fall         int           // consecutive failed probes that eject a node; if zero, 2
	Rise         int           // consecutive passed probes that re-admit it; if zero, 2
	PassiveFails int           // consecutive data-path timeouts that eject it; 0 disables passive ejection
}

// healthPolicy is HealthOptions plus the cluster's hooks.
type healthPolicy struct {
	HealthOptions
	ejected func(node, reason string)
}

// Options configures a Cluster. Zero values take the defaults named on each
// field.
type Options struct {
	Servers      []Server              // required
	Distribution hashring.Distribution // if empty, hashring.Ketama
	KeyPrefix    string                // prepended to every key sent to memcached
	// HashWithPrefix places keys by the prefixed key. By default the
	// unprefixed key is hashed, as php-memcached does with OPT_PREFIX_KEY.
	HashWithPrefix bool
	Timeout        time.Duration // socket dial/read/write timeout per operation; if zero, 500ms
	MaxIdleConns   int           // idle keepalive connections per node; if zero, 64
	MaxConns       int           // operations in flight per node; if zero, 64
	MaxAttempts    int           // distinct nodes tried per operation; if zero, 2
	Health         HealthOptions
	// Dialer opens data and probe connections; if nil, a net.Dialer with
	// Timeout. TLS to memcached plugs in here.
	Dialer func(ctx context.Context, network, address string) (net.Conn, error)
}

func (o *Options) withDefaults() {
	if o.Distribution == "" {
		o.Distribution = hashring.Ketama
	}
	if o.Timeout <= 0 {
		o.Timeout = 500 * time.Millisecond
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = 64
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 64
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 2
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
}

// Cluster is a set of memcached nodes behind a consistent-hash ring. It is
// safe for concurrent use. The ring never changes after New: a node that is
// down is skipped while walking the ring, which places its keys exactly
// where a ring without it would, and no other key moves.
type Cluster struct {
	nodes  []*node
	ring   *hashring.Ring
	opts   Options
	m      *metrics
	log    *slog.Logger
	probed chan struct{} // closed after the first probe round
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
	pol := healthPolicy{HealthOptions: opts.Health, ejected: func(node, reason string) {
		m.ejects.WithLabelValues(node, reason).Inc()
	}}
	for _, s := range opts.Servers {
		name := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
		c.nodes = append(c.nodes, newNode(name, &c.opts, pol, m.forNode(name), log))
	}
	reg.MustRegister(newPoolCollector(c.nodes))
	return c, nil
}

// Close closes idle connections. The cluster may still be used afterwards.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.client.Close(), n.probe.Close())
	}
	return errors.Join(errs...)
}

// storeKey is the key as sent to memcached; hashKey the one the ring places.
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

// route runs f on the key's owner and, on a transport failure that allows
// it, on the next live nodes of the key's ring order, at most MaxAttempts
// nodes in all. Reads retry after any transport failure; writes only when
// the connection was never made, because otherwise the first node may have
// applied the write.
func (c *Cluster) route(ctx context.Context, o op, hashKey string, write bool, f func(*memcache.Client) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	attempts := 0
	var last error
	for i := range c.ring.Owners(hashKey) {
		n := c.nodes[i]
		if !n.available() {
			continue
		}
		attempts++
		err := n.do(ctx, o, f)
		var ne *NodeError
		if !errors.As(err, &ne) {
			return err
		}
		last = err
		if attempts >= c.opts.MaxAttempts || (write && !ne.dial) || ctx.Err() != nil {
			return last
		}
	}
	if last != nil {
		return last
	}
	return ErrNoNodes
}

// Get reads one item.
func (c *Cluster) Get(ctx context.Context, key string) (Item, error) {
	sk, hk := c.keys(key)
	var it *memcache.Item
	err := c.route(ctx, opGet, hk, false, func(mc *memcache.Client) (err error) {
		it, err = mc.Get(sk)
		return err
	})
	if err != nil {
		return Item{}, err
	}
	return Item{Key: key, Value: it.Value, Flags: it.Flags, CAS: it.CasID}, nil
}

func (c *Cluster) store(ctx context.Context, o op, it Item, f func(*memcache.Client, *memcache.Item) error) error {
	sk, hk := c.keys(it.Key)
	mi := &memcache.Item{Key: sk, Value: it.Value, Flags: it.Flags, Expiration: it.Expiration, CasID: it.CAS}
	return c.route(ctx, o, hk, true, func(mc *memcache.Client) error { return f(mc, mi) })
}

// Set stores an item unconditionally.
func (c *Cluster) Set(ctx context.Context, it Item) error {
	return c.store(ctx, opSet, it, (*memcache.Client).Set)
}

// Add stores an item only if the key is absent; ErrExists otherwise.
func (c *Cluster) Add(ctx context.Context, it Item) error {
	return c.store(ctx, opAdd, it, (*memcache.Client).Add)
}

// Replace stores an item only if the key exists; ErrNotFound otherwise.
func (c *Cluster) Replace(ctx context.Context, it Item) error {
	return c.store(ctx, opReplace, it, (*memcache.Client).Replace)
}

// CompareAndSwap stores an item only if it is unchanged since it.CAS was
// read: ErrCASConflict if it changed, ErrNotFound if it is gone.
func (c *Cluster) CompareAndSwap(ctx context.Context, it Item) error {
	return c.store(ctx, opCAS, it, (*memcache.Client).CompareAndSwap)
}

// Append adds it.Value after the existing value; ErrNotFound if the key
// is missing. Flags and expiration are left as they are.
func (c *Cluster) Append(ctx context.Context, it Item) error {
	return c.store(ctx, opAppend, it, (*memcache.Client).Append)
}

// Prepend adds it.Value before the existing value; ErrNotFound if the key
// is missing.
func (c *Cluster) Prepend(ctx context.Context, it Item) error {
	return c.store(ctx, opPrepend, it, (*memcache.Client).Prepend)
}

// Delete removes a key; ErrNotFound if it was not there.
func (c *Cluster) Delete(ctx context.Context, key string) error {
	sk, hk := c.keys(key)
	return c.route(ctx, opDelete, hk, true, func(mc *memcache.Client) error { return mc.Delete(sk) })
}

// Incr adds delta to a decimal value and returns the new value (wrapping
// at 2^64, as memcached does).
func (c *Cluster) Incr(ctx context.Context, key string, delta uint64) (uint64, error) {
	return c.incrDecr(ctx, opIncr, key, delta, (*memcache.Client).Increment)
}

// Decr subtracts delta from a decimal value, stopping at 0.
func (c *Cluster) Decr(ctx context.Context, key string, delta uint64) (uint64, error) {
	return c.incrDecr(ctx, opDecr, key, delta, (*memcache.Client).Decrement)
}

func (c *Cluster) incrDecr(ctx context.Context, o op, key string, delta uint64, f func(*memcache.Client, string, uint64) (uint64, error)) (uint64, error) {
	sk, hk := c.keys(key)
	var v uint64
	err := c.route(ctx, o, hk, true, func(mc *memcache.Client) (err error) {
		v, err = f(mc, sk, delta)
		return err
	})
	return v, err
}

// Touch sets a new expiration on an existing key; ErrNotFound if missing.
func (c *Cluster) Touch(ctx context.Context, key string, exptime int32) error {
	sk, hk := c.keys(key)
	return c.route(ctx, opTouch, hk, true, func(mc *memcache.Client) error { return mc.Touch(sk, exptime) })
}

// Ready reports whether the cluster can serve: the first probe round has
// finished and at least one node is up.
func (c *Cluster) Ready() bool {
	select {
	case <-c.probed:
	default:
		return false
	}
	for _, n := range c.nodes {
		if n.available() {
			return true
		}
	}
	return false
}

// Nodes returns a snapshot of every node's state, in configured order.
func (c *Cluster) Nodes() []NodeStatus {
	out := make([]NodeStatus, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.status()
	}
	return out
}

// Owners returns the key's nodes in failover order (first is the owner).
func (c *Cluster) Owners(key string) []string {
	_, hk := c.keys(key)
	var out []string
	for i := range c.ring.Owners(hk) {
		out = append(out, c.nodes[i].name)
	}
	return out
}
