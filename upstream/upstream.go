// Package upstream talks to a cluster of memcached servers. It keeps one
// data client per server, mcpipe's pipelined connections or, with
// Options.PipelineConns 0, gomemcache's pool (so every node has its own
// connections, timeout and metrics), caps the operations in flight per
// node, places keys on a consistent-hash ring, checks node health actively
// and passively, and fails over to the next node on the ring.
//
// Goroutines: Run (health checks) is the caller's; each probe round
// runs at most maxProbes (64) goroutines, which end with the round.
// Besides, each pipelined connection has a reader goroutine (package
// mcpipe) from its first use to its failure or Close; a multi-get runs
// one goroutine per node batch for its duration; a DoAsync read that
// fails on a transport error is retried on a goroutine of its own; and
// Prepare (SetServers) probes the nodes it adds on goroutines of their
// own, at most maxProbes at once, each ending within one probe timeout,
// one more when its answer waited unread in its socket (0061), or when
// Prepare's context ends. No gomemcache type or error leaves the
// package.
package upstream

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

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/hashring"
	"github.com/memcgate/memcgate/upstream/mcpipe"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
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
	// ReadmitFlush sends flush_all to a node before re-admitting it, and
	// to a node a server change adds before it joins, so it cannot serve
	// values older than what its keys got on other nodes meanwhile.
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
	// Name names the cluster when it is one of several (a pool of package
	// route): it is in the cluster's log lines and its NodeStatus. Empty
	// for a cluster of its own.
	Name         string
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
	// Claims, with PipelineConns 0, holds each value's length as its
	// VALUE line claims it, once the reply's values would pass
	// UnheldClaim, from before gomemcache allocates it to the end of its
	// reply: a value it refuses fails the read with ErrNoFit. nil: a claim is bounded only by memcached's
	// largest item (1 GiB); a claim past that fails the read as the
	// node's (a NodeError) either way. Pipelined connections grow their
	// buffers with the bytes that come, or hold op.Op.Room, instead.
	Claims Claims
	// UnheldClaim, with PipelineConns 0, is the most bytes of values a
	// reply (one value, or the many of a multi-key get) reads without
	// holding them in Claims, as gomemcache reads them; if zero, 64 KiB. The gateway's is its MAX_VALUE_BYTES: the largest value it
	// writes as one item, and so its chunks, which it holds itself.
	UnheldClaim int
	// MaxInFlight caps operations in flight per node when pipelining; if
	// zero, 4096. (Without pipelining MaxConns is the cap.)
	MaxInFlight int
	// RequestSlots is the caller's cap on its requests in flight (the
	// gateway's MEMCGATE_MAX_REQUESTS); 0: none. While another node is up,
	// a node's operations in flight and waiting for a slot may hold at
	// most half of them; past that they fail at once with a *BusyError
	// (busy.go).
	RequestSlots int
	MaxAttempts  int            // distinct nodes tried per operation; if zero, 2
	Failover     FailoverPolicy // if empty, Rehash
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
	// Timeout. TLS to memcached plugs in here. It must return when ctx
	// ends (a TLS handshake included): a probe's deadline and a
	// shutdown reach the dial only through ctx.
	Dialer func(ctx context.Context, network, address string) (net.Conn, error)
	// Panics, if not nil, stops the panics of a request's code on the
	// cluster's goroutines: the pipelined connections' reply readers and
	// callbacks (mcpipe.Options.Panics) and the retries of asynchronous
	// reads. If nil, such a panic ends the process.
	Panics *panicguard.Guard
	// Copies is how many nodes at the head of each key's chain hold its
	// copies: the copies a caller keeping replicas asks Replicas for
	// (package route); if zero, 1. SetServers's Change.KeysBack looks at
	// those nodes; a committed server list (NextServers.Copies) changes it.
	Copies int

	// staleKeyBytes bounds each node's set of keys written elsewhere
	// (stale.go); if zero, defaultStaleKeyBytes. Unexported, and not
	// filled in by WithDefaults: tests set it small to overflow the set.
	staleKeyBytes int
	// keptIdle is how long a connection kept for raw commands or meta
	// lookups may stay unused (keptIdleFor); if zero, defaultKeptIdle.
	// Unexported: tests set it short.
	keptIdle time.Duration
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
// safe for concurrent use. A node that is down is skipped while walking
// the ring, which places its keys exactly where a ring without it would,
// and no other key moves. SetServers replaces the nodes and the ring
// together, keeping the nodes (and their connections and health) that
// stay.
type Cluster struct {
	topo       atomic.Pointer[topology]
	opts       Options
	health     *healthPolicy
	share      requestShare // each node's share of RequestSlots
	m          *metrics
	log        *slog.Logger
	probed     chan struct{} // closed after the first probe round
	probedOnce sync.Once
	asyncOps   sync.Pool // of *asyncOp, DoAsync's
	// retryPanics stops a panic of an asynchronous read's retry
	// (Options.Panics); nil: none.
	retryPanics *panicguard.Site
	// multiPanics stops a panic of a multi-key read's batch
	// (Options.Panics); nil: none.
	multiPanics *panicguard.Site
	// cmdPanics stops a panic in a raw command sent to every node
	// (everyNodeOf: /memc?cmd=stats reaches it).
	cmdPanics *panicguard.Site
	// probePanics counts a panic of a health check or probe
	// (Options.Panics), logged a line a second at most: a bug, or a
	// node's answer that sets one off, repeats it at every probe of
	// every round. Nil: each is logged.
	probePanics *panicguard.Site

	// setMu serializes server changes: Prepare takes it, and Commit or
	// Discard releases it, so it is held while the probes of the nodes
	// added are waited for; nothing else takes it.
	setMu sync.Mutex

	mu      sync.Mutex // guards the fields below; never held across I/O
	retired []*node    // nodes SetServers removed, closed by Run once idle
	// past are the server lists before the current one, oldest first,
	// at most maxPastRings: a node that stays and gets keys back that it
	// held under one of them may hold older values of them (keysBack).
	past []pastRing
	// copies is Options.Copies of the current server list, nextCopies
	// that of the list a Commit takes in (NextServers.Copies).
	copies, nextCopies int
}

// pastRing is a server list the cluster ran before: its ring, its
// nodes' names in ring order, and how many nodes of a key's chain held
// its copies.
type pastRing struct {
	ring   *hashring.Ring
	names  []string
	copies int
}

// maxPastRings bounds Cluster.past: a ring of a hundred nodes is a few
// hundred kilobytes, and a reload places keysBackSamples keys on each.
const maxPastRings = 16

// keysBackSamples is how many keys keysBack places to find the nodes
// that get keys back: enough to see a node's share of a hundredth of
// the keys, and at most a few milliseconds of hashing per ring at a
// reload.
const keysBackSamples = 4096

// topology is one set of nodes and the ring that places keys on them
// (ring members are nodes, in order). It never changes: SetServers swaps
// in a new one, so an operation sees one consistent pair.
type topology struct {
	nodes   []*node
	ring    *hashring.Ring
	servers []Server // as configured, in ring order
	dist    hashring.Distribution
}

// New builds a cluster. It opens no connection and starts no goroutine.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) (*Cluster, error) {
	opts.withDefaults()
	switch opts.Failover {
	case Rehash, FailFast:
	default:
		return nil, fmt.Errorf("upstream: unknown failover policy %q", opts.Failover)
	}
	m := newMetrics(reg)
	if opts.Name != "" {
		log = log.With("pool", opts.Name)
	}
	c := &Cluster{opts: opts, m: m, log: log, probed: make(chan struct{}), copies: max(opts.Copies, 1), retryPanics: opts.Panics.Site("upstream_retry"), multiPanics: opts.Panics.Site("upstream_multi_get"), cmdPanics: opts.Panics.Site("upstream_command"), probePanics: opts.Panics.Site("health_check")}
	c.nextCopies = c.copies
	c.health = &healthPolicy{
		HealthOptions: opts.Health,
		ejected:       func(node, reason string) { m.ejects.WithLabelValues(node, reason).Inc() },
		refused:       func(node string) { m.ejectsRefused.WithLabelValues(node).Inc() },
	}
	c.health.readmitFlush.Store(opts.Health.ReadmitFlush)
	c.share.slots.Store(int64(opts.RequestSlots))
	c.share.down = &c.health.down
	t, _, err := c.newTopology(opts.Servers, opts.Distribution, nil)
	if err != nil {
		return nil, err
	}
	c.setTopology(t)
	reg.MustRegister(newPoolCollector(func() []*node { return c.topo.Load().nodes }))
	return c, nil
}

// newTopology builds the nodes and ring of servers placed by dist,
// taking the nodes of old (by name) that stay, and returns the new nodes
// it made.
func (c *Cluster) newTopology(servers []Server, dist hashring.Distribution, old *topology) (*topology, []*node, error) {
	if len(servers) == 0 {
		return nil, nil, errors.New("upstream: no servers")
	}
	members := make([]hashring.Member, len(servers))
	for i, s := range servers {
		members[i] = hashring.Member{Host: s.Host, Port: s.Port, Weight: max(s.Weight, 1)}
	}
	ring, err := hashring.New(dist, members)
	if err != nil {
		return nil, nil, fmt.Errorf("upstream: %w", err)
	}
	keep := map[string]*node{}
	if old != nil {
		for _, n := range old.nodes {
			keep[n.name] = n
		}
	}
	t := &topology{ring: ring, servers: slices.Clone(servers), dist: dist}
	var added []*node
	for _, s := range servers {
		name := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
		n := keep[name]
		if n == nil {
			n = newNode(name, &c.opts, c.health, &c.share, c.m.forNode(name, s.UDPPort > 0), c.log)
			n.setUDP(s) // a node that stays keeps its UDP port: it is in use
			// What it went through before it joined is not known until
			// it is seen in service (node.unseen).
			n.unseen.Store(true)
			added = append(added, n)
		}
		t.nodes = append(t.nodes, n)
	}
	return t, added, nil
}

// setTopology makes t current, with the passive-ejection cap and the
// nodes' share of request slots of its size.
func (c *Cluster) setTopology(t *topology) {
	c.health.maxPassive.Store(int32(max(1, len(t.nodes)*c.opts.Health.MaxEjectedPercent/100)))
	c.share.setNodes(len(t.nodes))
	c.topo.Store(t)
}

// Change is what SetServers changed, by node name.
type Change struct {
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// Reweighted is true when the ring changed for nodes that stayed
	// (weights, order or the distribution).
	Reweighted bool `json:"reweighted,omitempty"`
	// KeysBack names the nodes that stayed and got copies of keys back
	// that they held under an earlier server list (Options.Copies): they
	// may hold older values of them than were written meanwhile (a node
	// added and removed again, a weight change undone, replicas lowered
	// and raised again).
	KeysBack []string `json:"keys_back,omitempty"`
}

// SetServers makes servers, placed by dist, the cluster's nodes, without
// stopping a request: nodes that stay keep their connections and health;
// removed nodes take no new operations, finish what they have, and are
// closed by Run once idle. With a consistent distribution only the keys
// of the nodes added or removed move. It is Prepare, with the cluster's
// flush-before-re-admission policy and copies, then Commit: see Prepare
// for the probes of the nodes added and the lists refused.
func (c *Cluster) SetServers(ctx context.Context, servers []Server, dist hashring.Distribution) (Change, error) {
	c.mu.Lock()
	copies := c.nextCopies
	c.mu.Unlock()
	p, err := c.Prepare(ctx, NextServers{Servers: servers, Distribution: dist, ReadmitFlush: c.health.readmitFlush.Load(), Copies: copies})
	if err != nil {
		return Change{}, err
	}
	return p.Commit(), nil
}

// NextServers is a server list Prepare readies, with the settings that
// take effect with it.
type NextServers struct {
	Servers      []Server
	Distribution hashring.Distribution
	// ReadmitFlush is Health.ReadmitFlush from the list on: it says
	// whether the nodes it adds are flushed before they join.
	ReadmitFlush bool
	// Copies is Options.Copies from the list on (KeysBack compares the
	// copies of the running list with these); < 1 means 1.
	Copies int
}

// Prepared is a server list that Prepare built, probed and checked, to
// be swapped in by Commit or dropped by Discard. Until then it holds the
// cluster's server change: another Prepare or SetServers waits. One of
// Commit and Discard must be called; Discard after Commit does nothing.
type Prepared struct {
	c      *Cluster
	next   NextServers
	old, t *topology
	probes []addedProbe
	done   bool
}

// Prepare readies next to take the cluster's nodes' place, and changes
// nothing that operations, Ready, Nodes or the health checks see: it
// builds the ring and the nodes added, probes them, and runs every
// check that can refuse the list, so that Commit, which swaps it in,
// cannot fail. Several clusters prepared first and committed only if
// every one was prepared change all together or not at all (package
// route's pools).
//
// The nodes added are probed (probeAdded): at most maxProbes at once,
// started within one Health.Timeout however many they are, each awaited
// until it ends but at most two Health.Timeouts from its start (its own,
// and one more when its answer waited unread in the socket), or until
// ctx is done; a wait the gateway came to its end late goes on once, two
// more from then, for a probe sent again on waking (roundTrip). One
// whose probe passed takes traffic once committed; one whose probe
// failed, did not start in time, or ended past that wait, starts down
// and waits for Rise probes like any down node. A
// node added may hold values its keys were given on other nodes before
// it joined (it was in an earlier server list, of this process or of
// one before it): with next.ReadmitFlush it is flushed instead of
// probed (if the flush does not answer it starts down and is flushed
// before its re-admission); without, its probe asks it stats too, and
// one that holds items is counted and logged at Commit (stale.go,
// "Unknown history"). Neither the probes nor the wait for them hold a
// lock that operations, Ready, Nodes or Run take.
//
// A server list none of whose nodes would be up (those added did not
// answer, those that stay are down) while a running node is up is
// refused with ErrNoNodeUp: such a list (every line mistyped, a DNS
// answer naming targets that do not resolve) would turn every request of
// the cluster into an error. A list refused, or whose ring cannot be
// built, changes nothing; the nodes added for its probes are dropped as
// Discard drops them.
func (c *Cluster) Prepare(ctx context.Context, next NextServers) (*Prepared, error) {
	c.setMu.Lock()
	old := c.topo.Load()
	t, added, err := c.newTopology(next.Servers, next.Distribution, old)
	if err != nil {
		c.setMu.Unlock()
		return nil, err
	}
	p := &Prepared{c: c, next: next, old: old, t: t, probes: make([]addedProbe, len(added))}
	for i, n := range added {
		// Its keys may have been written on other nodes while it was out
		// of the ring, and no write was remembered for it (it was not in
		// this process's list, or not down but gone). With ReadmitFlush
		// it starts empty, or down until the flush is done at its
		// re-admission; without, it keeps its warm cache, as other
		// clients of the same memcached may still be writing it, and is
		// reported if it holds items.
		p.probes[i] = addedProbe{n: n, flush: next.ReadmitFlush}
	}
	c.probeAdded(ctx, p.probes)
	if err := noneUp(old, t, p.probes); err != nil {
		p.Discard()
		return nil, err
	}
	return p, nil
}

// Discard drops a prepared list: the nodes it added go as removed ones
// do, with their metric series, and the running list stays. It releases
// the cluster's server change.
func (p *Prepared) Discard() {
	if p.done {
		return
	}
	p.done = true
	c := p.c
	defer c.setMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pr := range p.probes {
		pr.n.retire()
		c.retired = append(c.retired, pr.n)
		c.m.forget(pr.n.name)
	}
}

// Commit swaps the prepared list in, with its flush-before-re-admission
// policy and copies, retires the nodes it removes, logs what changed and
// returns it. It cannot fail. It releases the cluster's server change.
func (p *Prepared) Commit() Change {
	if p.done {
		panic("upstream: a prepared server list committed after Commit or Discard")
	}
	p.done = true
	c, old, t := p.c, p.old, p.t
	defer c.setMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.health.readmitFlush.Store(p.next.ReadmitFlush)
	c.nextCopies = max(p.next.Copies, 1)
	var ch Change
	for _, pr := range p.probes {
		ch.Added = append(ch.Added, pr.n.name)
	}
	var down, flushed, holding []string
	var downErr error    // the first node's that starts down
	var holdsAttrs []any // what the first node holding items said
	for _, pr := range p.probes {
		switch {
		case pr.err != nil:
			// Still unseen: its re-admission asks what it holds.
			if pr.n.startDown(pr.err) {
				down = append(down, pr.n.name)
				if downErr == nil {
					downErr = pr.err
				}
			}
		case pr.flush:
			pr.n.flushOwed.Store(false)
			pr.n.unseen.Store(false)
			flushed = append(flushed, pr.n.name)
		default:
			// Counted before the node is in the list /debug/nodes shows.
			if pr.holds {
				pr.n.m.unknownHistory.Inc()
				holding = append(holding, pr.n.name)
				if holdsAttrs == nil {
					holdsAttrs = pr.holdsAttrs
				}
			}
			pr.n.unseen.Store(false)
		}
	}
	stays := map[*node]bool{}
	for _, n := range t.nodes {
		stays[n] = true
	}
	for _, n := range old.nodes {
		if !stays[n] {
			ch.Removed = append(ch.Removed, n.name)
			n.retire()
			n.stale.drop() // it will not be re-admitted
			c.retired = append(c.retired, n)
		}
	}
	ch.Reweighted = reweighted(old, t)
	if len(ch.Added)+len(ch.Removed) > 0 || ch.Reweighted || c.nextCopies != c.copies {
		ch.KeysBack = c.keysBack(old, t)
		c.rememberRing(old)
		c.copies = c.nextCopies
	}
	c.setTopology(t)
	// Counted down once they are in the ring that Ready and panic mode
	// count them against: counted before, nodes added that do not answer
	// would take nodes up from the old ring's count.
	c.health.down.Add(int32(len(down)))
	for _, name := range ch.Removed {
		c.m.forget(name)
	}
	if len(ch.Added)+len(ch.Removed) > 0 || ch.Reweighted {
		c.log.Info("servers changed", "added", ch.Added, "removed", ch.Removed, "reweighted", ch.Reweighted, "nodes", len(t.nodes))
	}
	if len(flushed) > 0 {
		c.log.Info(fmt.Sprintf("%d nodes added and flushed (MEMCGATE_READMIT_FLUSH, or a replicated pool): they may have held values from before they joined", len(flushed)), nodesAttrs(flushed)...)
	}
	if len(holding) > 0 {
		// One line for them all, as for the nodes that start down.
		c.log.Warn(fmt.Sprintf("%d of %d nodes added hold items: keys written to other nodes before they joined (while a reload or DNS answer had removed them, or under an earlier server list) were not recorded here, so they may serve values older than those until written again or expired (MEMCGATE_READMIT_FLUSH=true flushes a node added; flush_all on the node clears it now)", len(holding), len(ch.Added)),
			append(nodesAttrs(holding), holdsAttrs...)...)
	}
	if len(down) > 0 {
		// One line for them all: a reload into a network partition adds
		// many at once. Each node's own error is on the status page
		// (NodeStatus.Reason) and in a debug line.
		c.log.Warn(fmt.Sprintf("%d of %d nodes added start down: their first probe failed or did not answer in time; each takes traffic once MEMCGATE_HEALTH_RISE probes pass", len(down), len(ch.Added)),
			append(nodesAttrs(down), "err", downErr.Error())...)
	}
	if len(ch.KeysBack) > 0 {
		c.log.Warn("keys go back to nodes that held them under an earlier server list (a node added and removed again, a weight change undone, replicas lowered and raised again, a SERVERS_DNS answer that flaps): "+
			"those nodes may hold older values of them than were written meanwhile on the nodes that had them, so such keys may read stale, and keys deleted meanwhile come back, until written again or expired",
			"nodes", ch.KeysBack)
	}
	return ch
}

// noneUp returns ErrNoNodeUp, with why, if no node of t would be up
// (the nodes added whose probes failed, the nodes that stay down) while
// a node of old is up; else nil.
func noneUp(old, t *topology, probes []addedProbe) error {
	var firstErr error
	for _, p := range probes {
		if p.err == nil {
			return nil
		}
		if firstErr == nil {
			firstErr = p.err
		}
	}
	added := make(map[*node]bool, len(probes))
	for _, p := range probes {
		added[p.n] = true
	}
	for _, n := range t.nodes {
		if !added[n] && n.available() {
			return nil
		}
	}
	running := 0
	for _, n := range old.nodes {
		if n.available() {
			running++
		}
	}
	if running == 0 {
		return nil // nothing up to keep: the list may bring the cluster back
	}
	var why []string
	if len(probes) > 0 {
		why = append(why, fmt.Sprintf("none of the %s it adds answered its probe (the first: %v)", nodeCount(len(probes)), firstErr))
	}
	if stay := len(t.nodes) - len(probes); stay > 0 {
		why = append(why, fmt.Sprintf("the %s it keeps %s down", nodeCount(stay), map[bool]string{true: "is", false: "are"}[stay == 1]))
	}
	return fmt.Errorf("%w: no node of it would be up (%s) while %d of the %s running %s up: the running nodes stay",
		ErrNoNodeUp, strings.Join(why, "; "), running, nodeCount(len(old.nodes)), map[bool]string{true: "is", false: "are"}[running == 1])
}

// nodeCount is "1 node" or "n nodes".
func nodeCount(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}

// maxLoggedNodes is how many nodes a log line about many of them
// names; the status page and the reload history list every one.
const maxLoggedNodes = 5

// nodesAttrs are the log attributes naming nodes: "nodes", the first
// maxLoggedNodes of names, and "more", how many others there are, if
// any.
func nodesAttrs(names []string) []any {
	if len(names) <= maxLoggedNodes {
		return []any{"nodes", names}
	}
	return []any{"nodes", names[:maxLoggedNodes], "more", len(names) - maxLoggedNodes}
}

// addedProbe is the probe of one node SetServers adds (or, under
// Health.ReadmitFlush, its flush) and its outcome.
type addedProbe struct {
	n        *node
	flush    bool
	answered bool  // the probe ended before the wait did
	err      error // nil if the node answered in time; else why not
	// holds and holdsAttrs are what unseenHolds found on a node probed,
	// not flushed, that answered.
	holds      bool
	holdsAttrs []any
}

// probeAdded probes or flushes the nodes of probes, at most maxProbes
// at once, and waits for them for one Health.Timeout in all, or until
// ctx is done. A probe that passes asks its node stats too, for what it
// holds (unseenHolds), within another Health.Timeout; the node answered
// when its probe did, and if the wait ends before its stats, what it
// holds is unknown and counts as items held, as a stats that fails
// does. A node that answers frees its place within a round trip: only
// maxProbes nodes that hang keep the others from being probed before
// the wait ends, and those then start down. A probe still running when
// the wait ends is awaited on until two Health.Timeouts from its start:
// past its deadline it reads on only an answer that came in time
// (onTimeConn, 0061), so a probe that passes, read late, starts its
// node up, and one that fails at its deadline ends the wait then. If
// the wait's end came a quarter of a timeout or more late (the gateway
// was not running), it goes on once, two timeouts from then: a probe
// the gateway came to late is sent once more (roundTrip, 0087). A
// probe still running after that goes on on its own goroutine until its
// reads end or ctx is done, and its answer is dropped: its node starts
// down, and the health checker admits it, asking it stats then
// (readmit).
func (c *Cluster) probeAdded(ctx context.Context, probes []addedProbe) {
	if len(probes) == 0 {
		return
	}
	wait := c.opts.Health.Timeout
	timer := time.NewTimer(wait)
	defer timer.Stop()
	type answer struct {
		i          int
		err        error
		stats      bool // the stats of a node that answered: holds and holdsAttrs
		holds      bool
		holdsAttrs []any
	}
	answers := make(chan answer, 2*len(probes)) // buffered: a late probe never blocks
	slots := make(chan struct{}, maxProbes)
	record := func(a answer) {
		p := &probes[a.i]
		if a.stats {
			p.holds, p.holdsAttrs = a.holds, a.holdsAttrs
			return
		}
		p.answered, p.err = true, a.err
		if a.err == nil && !p.flush && p.n.unseen.Load() {
			// Until its stats say otherwise.
			p.holds, p.holdsAttrs = true, []any{"stats_err", "no stats within the wait for the nodes added"}
		}
	}
	// stats counts the nodes that answered whose stats are awaited.
	started, answered, stats := 0, 0, 0
	var lastStart time.Time // of the probe started last
	var cut error           // why the wait ended before every node answered
	for (answered < len(probes) || stats > 0) && cut == nil {
		var slot chan struct{} // nil, which blocks, once every probe started
		if started < len(probes) {
			slot = slots
		}
		select {
		case slot <- struct{}{}:
			i, n, flush := started, probes[started].n, probes[started].flush
			started++
			lastStart = time.Now()
			if flush {
				n.flushOwed.Store(true) // until the flush is known to be done
			}
			go func() {
				defer func() { <-slots }()
				a := answer{i: i, err: c.probeOnce(ctx, n, flush)}
				answers <- a
				if a.err == nil && !flush {
					sctx, cancel := context.WithTimeout(ctx, c.opts.Health.Timeout)
					holds, attrs := c.unseenHolds(sctx, n)
					cancel()
					answers <- answer{i: i, stats: true, holds: holds, holdsAttrs: attrs}
				}
			}()
		case a := <-answers:
			record(a)
			switch {
			case a.stats:
				stats--
			case a.err == nil && !probes[a.i].flush:
				answered++
				stats++
			default:
				answered++
			}
		case <-timer.C:
			cut = fmt.Errorf("no answer within %s (the probe timeout) while the servers changed", wait)
		case <-ctx.Done():
			cut = fmt.Errorf("the server change was cut short: %w", context.Cause(ctx))
		}
	}
	// A probe running past the wait is past its own deadline, or close
	// to it: it passes if its answer waited unread in the socket, read
	// with one more timeout (onTimeConn, 0061), and the node it passed
	// must start up. So each probe started is waited for two timeouts
	// from its start; one that fails at its deadline ends the wait then.
	// No probe starts any more, and the stats of a node that answers now
	// are not waited for (its holds are unknown).
	//
	// A wait that ends a quarter of a timeout or more after it was due
	// is a gateway that was not running (stopped, starved, throttled):
	// a probe it made late is sent once more on waking (roundTrip), and
	// has had less time than it was given. Such a wait goes on once, two
	// timeouts from then, as the probe's own late deadline does (0090).
	if cut != nil && ctx.Err() == nil && answered < started {
		due := lastStart.Add(2 * wait)
		timer.Reset(time.Until(due))
		extended := false
	grace:
		for answered < started {
			select {
			case a := <-answers:
				record(a)
				if !a.stats {
					answered++
				}
			case <-timer.C:
				if extended || time.Since(due) < wait/4 {
					break grace
				}
				extended, due = true, time.Now().Add(2*wait)
				timer.Reset(time.Until(due))
			case <-ctx.Done():
				cut = fmt.Errorf("the server change was cut short: %w", context.Cause(ctx))
				break grace
			}
		}
	}
drain: // answers in before the wait ended
	for {
		select {
		case a := <-answers:
			record(a)
		default:
			break drain
		}
	}
	for i := range probes {
		if p := &probes[i]; !p.answered {
			p.err = fmt.Errorf("%s: %w", p.n.name, cut)
			if p.flush {
				p.n.flushOwed.Store(true) // never started: it is owed all the same
			}
		}
	}
}

// probeOnce pings n, or flushes it if flush, and returns the classified
// error; a panic is one. It returns within Health.Timeout (two when the
// probe is sent again: probeClient.roundTrip), or when ctx ends.
func (c *Cluster) probeOnce(ctx context.Context, n *node, flush bool) (err error) {
	what := "probe"
	if flush {
		what = "flush"
	}
	defer func() {
		if r := recover(); r != nil {
			c.probePanics.Stopped(c.log, r, "node", n.name, "op", what)
			err = fmt.Errorf("%s %s panicked: %v", what, n.name, r)
		}
	}()
	if flush {
		err = n.probe.FlushAll(ctx)
	} else {
		err = n.probe.Ping(ctx)
	}
	return classify(n.name, what, err)
}

// keysBack returns the nodes of both old and t that hold copies of keys
// under t but not under old, and did under an earlier server list
// (c.past): what they hold of such keys may be older than what was
// written on the nodes that held them since. A key's copies are on the
// first c.nextCopies nodes of its chain under t, c.copies under old. It
// tells by placing keysBackSamples keys on the rings. c.mu is held.
func (c *Cluster) keysBack(old, t *topology) []string {
	if len(c.past) == 0 {
		return nil
	}
	stays := map[string]bool{}
	for _, n := range old.nodes {
		stays[n.name] = true
	}
	oldNames, newNames := namesOf(old), namesOf(t)
	var out []string
	for i := range keysBackSamples {
		k := "memcgate-keys-back-" + strconv.Itoa(i)
		before := homes(old.ring, oldNames, k, c.copies)
		for _, to := range homes(t.ring, newNames, k, c.nextCopies) {
			if !stays[to] || slices.Contains(before, to) || slices.Contains(out, to) {
				continue
			}
			for _, p := range c.past {
				if slices.Contains(homes(p.ring, p.names, k, p.copies), to) {
					out = append(out, to)
					break
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// homes returns the names of the first copies nodes of key's chain on
// ring, whose members are named names.
func homes(ring *hashring.Ring, names []string, key string, copies int) []string {
	out := make([]string, 0, copies)
	for i := range ring.Owners(key) {
		out = append(out, names[i])
		if len(out) == copies {
			break
		}
	}
	return out
}

// namesOf returns the names of t's nodes, in ring order.
func namesOf(t *topology) []string {
	out := make([]string, len(t.nodes))
	for i, n := range t.nodes {
		out[i] = n.name
	}
	return out
}

// rememberRing adds t, which ran with c.copies, to c.past, forgetting
// the oldest past maxPastRings. c.mu is held.
func (c *Cluster) rememberRing(t *topology) {
	c.past = append(c.past, pastRing{ring: t.ring, names: namesOf(t), copies: c.copies})
	if len(c.past) > maxPastRings {
		c.past = slices.Delete(c.past, 0, len(c.past)-maxPastRings)
	}
}

// reweighted reports whether the ring of b places the nodes a and b share
// otherwise than a did: the distribution, or their weights or order,
// changed.
func reweighted(a, b *topology) bool {
	if a.dist != b.dist {
		return true
	}
	in := func(t *topology, name string) bool {
		return slices.ContainsFunc(t.nodes, func(n *node) bool { return n.name == name })
	}
	var sa, sb []Server
	for i, s := range a.servers {
		if in(b, a.nodes[i].name) {
			sa = append(sa, Server{Host: s.Host, Port: s.Port, Weight: max(s.Weight, 1)})
		}
	}
	for i, s := range b.servers {
		if in(a, b.nodes[i].name) {
			sb = append(sb, Server{Host: s.Host, Port: s.Port, Weight: max(s.Weight, 1)})
		}
	}
	return !slices.Equal(sa, sb)
}

// closeRetired closes the retired nodes that have nothing in flight.
func (c *Cluster) closeRetired() {
	c.mu.Lock()
	var idle []*node
	rest := c.retired[:0]
	for _, n := range c.retired {
		if len(n.sem) == 0 {
			idle = append(idle, n)
		} else {
			rest = append(rest, n)
		}
	}
	clear(c.retired[len(rest):])
	c.retired = rest
	c.mu.Unlock()
	for _, n := range idle {
		n.close()
	}
}

// Close closes idle connections. The cluster may still be used afterwards.
func (c *Cluster) Close() error {
	var errs []error
	c.mu.Lock()
	nodes := append(slices.Clone(c.topo.Load().nodes), c.retired...)
	c.mu.Unlock()
	for _, n := range nodes {
		errs = append(errs, n.close())
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
// (ErrNotFound, ErrExists, ErrCASConflict, ErrCASNode, ErrNotNumeric,
// ErrTooLarge, ErrBadKey), ErrNoNodes, or a *NodeError. A read's item may
// share its Value with other Gets of the same key batched with it: treat
// it as read-only.
//
// Each node counts CAS values of its own, and a key moves between nodes
// as its owner is ejected and re-admitted. So an item a node other than
// the owner answered names that node (op.Item.CASNode), one the owner
// answered names none, and a write checked against a CAS value (casHere)
// runs only on the node its CAS value came from: the owner for a value
// that names none.
func (c *Cluster) Do(ctx context.Context, o op.Op) op.Result {
	return c.doAfter(ctx, o, nil, nil)
}

// casHere reports whether o, if it is checked against a CAS value
// (op.Verb.Checked, with a value: If-Match: * has none), may be checked
// on n, failover telling whether n is not the key's owner: the CAS
// value's node, when it names one (op.Item.CASNode), else the owner. Any
// other node counts CAS values apart, and the same number there can be
// another version of the key: the write fails its check (ErrCASNode)
// rather than risk replacing or deleting a version its client never
// read.
func casHere(o *op.Op, n *node, failover bool) bool {
	if o.Item.CAS == 0 && o.Item.CASNode == 0 || !o.Verb.Checked() {
		return true
	}
	if o.Item.CASNode == 0 {
		return !failover
	}
	return o.Item.CASNode == n.tag
}

// doAfter is Do after a first attempt, on node tried, failed with a node
// failure, prev (DoAsync's retry); tried is nil if there was none.
func (c *Cluster) doAfter(ctx context.Context, o op.Op, tried *node, prev error) op.Result {
	if !o.Verb.Valid() {
		return op.Result{Err: fmt.Errorf("upstream: no such verb %d", o.Verb)}
	}
	sk, hk := c.keysOf(&o)
	writeKey := ""
	if o.Verb.Writes() {
		writeKey = sk
	}
	var res op.Result
	err := c.routeAfter(ctx, hk, sk, writeKey, tried, prev, func(n *node, failover bool) (err error) {
		if !casHere(&o, n, failover) {
			return ErrCASNode
		}
		res, err = n.run(ctx, o, sk, failover, c.capTTL)
		if err == nil && failover && res.Item.CAS != 0 {
			res.Item.CASNode = n.tag // the owner's answers name no node: "<cas>", as ever
		}
		return err
	})
	res.Err = err
	return res
}

// keysOf returns o's key as sent to memcached and the key the ring
// places: that of its HashKey if set, prefixed as Item.Key would be
// (HashWithPrefix), so that an operation placed by another key lands
// where that key's own operations do.
func (c *Cluster) keysOf(o *op.Op) (store, hash string) {
	store, hash = c.keys(o.Item.Key)
	if o.HashKey != "" {
		_, hash = c.keys(o.HashKey)
	}
	return store, hash
}

// routeAfter runs call on the key's owner or, if the owner is down and
// the policy is Rehash, on the next live node of the key's ring order.
// After a transport failure it tries the next live node, at most
// MaxAttempts nodes in all: reads after any transport failure, writes
// only when the node is not there (movesWrite): its connection could
// not be made, and the failure took it out of service (a refused
// connection ejects it at once). A write whose node timed out, or
// whose connection broke once made, answers that failure: the node may
// have applied it and, still in service, is where the key's reads go,
// so a copy stored on the next node would be answered as stored and
// never read while that node serves its older value (decisions/0086).
// call learns whether its node is not the owner. tried is a node a
// first attempt already failed on, with prev; nil if there was none.
// storeKey is the key as sent to memcached: in panic mode a down node
// that recorded it is passed over all the same (node.passedOver).
// writeKey is a write's key as sent to memcached, empty for a read:
// each node a write passes over (down, or moved on from) records it
// (stale.go). A read that misses on a node after a node ahead of it
// failed with a timeout (of a reply, or of a dial) returns that
// failure, not ErrNotFound: the node that timed out is still there and
// may hold the key, which the next node never got (decisions/0085). A
// node that is not there (refused, reset: hardFailure), or passed over
// as down, holds nothing to answer for: the next node's miss stands.
func (c *Cluster) routeAfter(ctx context.Context, hashKey, storeKey, writeKey string, tried *node, prev error, call func(n *node, failover bool) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := c.topo.Load()
	ignoreHealth := c.panicking(t)
	failFast := c.opts.Failover == FailFast
	write := writeKey != ""
	attempts, owner := 0, -1
	var last error
	for i := range t.ring.Owners(hashKey) {
		if owner < 0 {
			owner = i
		}
		n := t.nodes[i]
		if n == tried {
			attempts, last = attempts+1, prev
			continue
		}
		if n.passedOver(ignoreHealth, storeKey) {
			if failFast {
				return fmt.Errorf("%w: %s, the key's node, is down (failover policy %q)", ErrNoNodes, n.name, FailFast)
			}
			if !write || n.skipForWrite(writeKey, c.placedBy(writeKey, hashKey)) {
				continue
			}
			// Re-admitted since: the write goes to n after all.
		}
		attempts++
		failover := i != owner
		if failover {
			t.nodes[owner].m.failovers.Inc()
		}
		err := call(n, failover)
		if err == nil {
			return nil
		}
		dial, ok := nodeFailure(err)
		if !ok {
			if last != nil && !write && !hardFailure(last) && errors.Is(err, ErrNotFound) {
				// A node ahead of n in the key's ring order failed the
				// read but may still hold the key (it timed out, or its
				// connection could not be had in time): n's miss says
				// nothing of the key, and that failure is the answer.
				return last
			}
			return err
		}
		last = err
		if failFast || attempts >= c.opts.MaxAttempts || (write && !movesWrite(n, dial)) || ctx.Err() != nil {
			return last
		}
		if write {
			// n never got the write, which goes on to the next node: n
			// may hold an older value of the key.
			n.recordStale(writeKey, c.placedBy(writeKey, hashKey))
		}
	}
	if last != nil {
		return last
	}
	return ErrNoNodes
}

// movesWrite reports whether a write that failed on n before a
// connection existed (dial) may go on to the next node of its key's
// chain: nothing reached n, and the failure took n out of service (a
// connection refused, which ejects it at once, or a timeout past
// PASSIVE_FAILS), so the key's reads no longer go to n and the value
// stored elsewhere is the one read. n records the key (stale.go) and
// forgets it before it serves again. A failure that leaves n in service
// leaves n serving the key's older value, and no re-admission comes to
// forget the key there: the write fails instead (decisions/0086). That
// is a timeout, and also a refused or reset connection that ejected
// nothing: passive ejection off (PASSIVE_FAILS 0), or a reset held back
// by MAX_EJECTED_PERCENT.
func movesWrite(n *node, dial bool) bool {
	return dial && !n.available()
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

// Len returns the number of nodes in the server list now, up or down.
func (c *Cluster) Len() int { return len(c.topo.Load().nodes) }

// Ready reports whether the cluster can serve: the first probe round has
// finished and at least ReadyMinUpPercent of the nodes (and at least one)
// are up, a node no probe has found in service counting only while its
// last probe passed (Unready says which is missing).
func (c *Cluster) Ready() bool { return c.Unready() == "" }

// Unready says why the cluster cannot serve, for an operator reading
// /readyz, or returns "" when it can (Ready). The nodes up are counted on
// one ring, not taken from the count of nodes down, which a SetServers
// swapping rings changes apart from the ring.
func (c *Cluster) Unready() string {
	if !c.Probed() {
		return "the first round of health checks has not finished"
	}
	t := c.topo.Load()
	need := max(1, (len(t.nodes)*c.opts.Health.ReadyMinUpPercent+99)/100)
	up := 0
	for _, n := range t.nodes {
		if n.readyUp() {
			up++
		}
	}
	if up >= need {
		return ""
	}
	if c.opts.Health.ReadyMinUpPercent == 0 {
		return fmt.Sprintf("no memcached node is up (0 of %d)", len(t.nodes))
	}
	return fmt.Sprintf("%d of %d memcached nodes up, %d needed (%d%%)", up, len(t.nodes), need, c.opts.Health.ReadyMinUpPercent)
}

// Probed reports whether the first probe round has finished.
func (c *Cluster) Probed() bool {
	select {
	case <-c.probed:
		return true
	default:
		return false
	}
}

// Nodes returns a snapshot of every node's state, in configured order.
func (c *Cluster) Nodes() []NodeStatus {
	t := c.topo.Load()
	out := make([]NodeStatus, len(t.nodes))
	for i, n := range t.nodes {
		out[i] = n.status()
		out[i].Pool = c.opts.Name
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
	t := c.topo.Load()
	if n, _, err := c.pick(t, hk, sk, false); err == nil {
		p.Serving = n.name
	}
	for i := range t.ring.Owners(hk) {
		p.Chain = append(p.Chain, ChainNode{Node: t.nodes[i].name, Up: t.nodes[i].available()})
	}
	return p
}
