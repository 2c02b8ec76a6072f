package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/mcpipe"
	"github.com/memcgate/memcgate/upstream/op"
)

// node is one memcached server: its own data client (mcpipe's pipelined
// connections or gomemcache's pool, so its own connections and timeout), a
// semaphore that caps operations in flight (and so, on gomemcache's pool,
// open connections), a separate one-connection probe client, and its
// health state.
//
// node holds atomics and a mutex: it must not be copied.
type node struct {
	name    string                                                               // host:port as configured; what the ring hashes and what metrics show
	tag     uint32                                                               // NodeTag(name): how a CAS value names the node that gave it out
	client  dataClient                                                           // gomemcache's pool, or mcpipe's pipelined connections
	pipe    *mcpipe.Client                                                       // client, if it is mcpipe's: it also starts operations without waiting (DoAsync)
	dial    func(ctx context.Context, network, address string) (net.Conn, error) // counted data connections
	timeout time.Duration
	probe   prober        // its own one-connection client; never the data pool
	udp     *udpPort      // nil unless the node has a UDP port
	meta    idleConns     // idle connections of Cluster.TTL's lookups
	metas   chan struct{} // a token per TTL lookup under way, at most metaConns
	heads   idleConns     // with gomemcache's pool: idle connections of HEADs' mg and conditional DELETEs' md (metaLine)
	cmdIdle idleConns     // idle connections of raw commands (command), at most nodeCommands
	sem     chan struct{} // a token per operation in flight
	waiting atomic.Int64  // operations waiting for a token (busy.go)
	queued  atomic.Int64  // tokens held by queued operations, which do not count against the share (busy.go)
	share   *requestShare // the cluster's: the most operations sem and waiting may hold together
	reads   readHold      // what its reads hold of the caller's byte budget (readshare.go)
	cmds    chan struct{} // a token per raw command on a connection of its own (command)
	conns   atomic.Int64  // open data connections (dialled and not yet closed)
	m       *nodeMetrics
	log     *slog.Logger
	h       *healthPolicy

	noMeta    atomic.Bool   // it answered mg with ERROR: op.Head reads the value (headOn)
	batchGets bool          // park Gets and send them as multi-key gets when slots are busy
	keptIdle  time.Duration // how long meta, heads and cmdIdle keep a connection unused (closeKeptIdle)
	pendingGets
	// hints, on gomemcache's pool (nil on a pipelined node), are the
	// sizes its Gets with a Room last found, for keys whose values were
	// large; ahead counts the hinted sizes of such Gets admitted and not
	// yet read (poolhints.go).
	hints *mcpipe.SizeHints
	ahead atomic.Int64

	stale staleKeys // keys written to other nodes on this node's account (stale.go)
	// flushOwed: a flush_all (FlushAll) found the node down; it is
	// flushed before its re-admission, as with Health.ReadmitFlush.
	flushOwed atomic.Bool
	// unseen: the node has not been seen in service since it joined the
	// list, when the cluster was built or by a server change (no probe
	// passed while it was up, no admission). Its history before then is
	// unknown: an outage that began under a process before this one, or
	// writes of its keys to other nodes while it was out of the list,
	// left no record here, so its admission cannot delete them
	// (readmit, Prepared.Commit, Cluster.unseenHolds).
	unseen atomic.Bool

	up          atomic.Bool
	retired     atomic.Bool  // SetServers removed it: it drains and takes no health decisions
	passiveRuns atomic.Int32 // consecutive data-path timeouts

	mu           sync.Mutex    // guards the fields below; never held across I/O
	fails        int           // consecutive failed probes
	passes       int           // consecutive passed probes (counted only after holdUntil)
	since        time.Time     // last state change
	reason       string        // why the node is in its state
	flaps        int           // ejections that followed a re-admission within FlapWindow
	readmittedAt time.Time     // last re-admission; zero if never ejected
	hold         time.Duration // the flap back-off of the node's last ejection; 0: none
	holdUntil    time.Time     // no re-admission before this (flap back-off): hold from the ejection (a probe's: from its round), then from the round of each failed probe (probeResult)
	inst         instance      // the memcached process last seen at its address by a probe's stats (restart.go); zero if none yet
	restarted    time.Time     // inst's start, if a probe saw it replace the process before it; zero if none
	// restartLogged is when a restart line was last logged, and
	// restartUnlogged the restarts seen since then that were not
	// (restartLogEvery).
	restartLogged   time.Time
	restartUnlogged int
}

// addr is the net.Addr gomemcache dials. String returns the configured
// host:port, so the name is resolved on every new connection (a memcached
// pod that moves keeps its place on the ring) and gomemcache keys its pool
// by the stable name.
type addr string

func (a addr) Network() string { return "tcp" }
func (a addr) String() string  { return string(a) }

// selector gives a gomemcache client exactly one server.
type selector struct{ a addr }

func (s selector) PickServer(string) (net.Addr, error) { return s.a, nil }
func (s selector) Each(f func(net.Addr) error) error   { return f(s.a) }

func newNode(name string, o *Options, pol *healthPolicy, share *requestShare, m *nodeMetrics, log *slog.Logger) *node {
	n := &node{
		name:  name,
		tag:   NodeTag(name),
		share: share,
		sem:   make(chan struct{}, o.inFlightCap()),
		cmds:  make(chan struct{}, nodeCommands),
		metas: make(chan struct{}, metaConns),

		cmdIdle: idleConns{keep: nodeCommands},
		m:       m,
		log:     log.With("node", name),
		h:       pol,

		batchGets: o.BatchGets,
	}
	n.reads.share, n.reads.refused = share, m.shareRefused
	n.keptIdle = o.keptIdle
	if n.keptIdle <= 0 {
		n.keptIdle = defaultKeptIdle
	}
	n.stale.limit = o.staleKeyBytes
	if n.stale.limit <= 0 {
		n.stale.limit = defaultStaleKeyBytes
	}
	dialer := o.Dialer
	if dialer == nil {
		d := &net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second}
		dialer = d.DialContext
	}
	n.timeout = o.Timeout
	n.dial = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dialer(ctx, network, address)
		if err != nil {
			return nil, err
		}
		n.conns.Add(1)
		return &countedConn{Conn: c, n: &n.conns}, nil
	}
	if o.PipelineConns > 0 {
		n.pipe = mcpipe.New(mcpipe.Options{
			Conns:   o.PipelineConns,
			Timeout: o.Timeout,
			// The connection itself, not a countedConn, so that large
			// values go out with writev; mcpipe reports its closes.
			Dial: func(ctx context.Context) (net.Conn, error) {
				c, err := dialer(ctx, "tcp", name)
				if err == nil {
					n.conns.Add(1)
				}
				return c, err
			},
			Closed: func() { n.conns.Add(-1) },
			Share:  &n.reads,
			Panics: o.Panics,
		})
		n.client = n.pipe
	} else {
		mc := memcache.NewFromSelector(selector{addr(name)})
		mc.Timeout = o.Timeout
		mc.MaxIdleConns = max(o.MaxIdleConns, 1)
		// gomemcache allocates the length a VALUE line claims before
		// the value comes: claimConn bounds the claim first.
		unheld := int64(o.UnheldClaim)
		if unheld <= 0 {
			unheld = defaultUnheldClaim
		}
		mc.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
			c, err := redialLate(ctx, mc.Timeout, func(ctx context.Context) (net.Conn, error) { return n.dial(ctx, network, address) })
			if err != nil {
				return nil, err
			}
			return &claimConn{Conn: c, claims: o.Claims, share: &n.reads, unheld: unheld, timeout: mc.Timeout}, nil
		}
		n.client = pooled{mc}
		n.hints = mcpipe.NewSizeHints()
		n.heads.keep = mc.MaxIdleConns
	}
	n.probe = &probeClient{addr: name, timeout: o.Health.Timeout, dial: dialer, seen: n.sawInstance, late: m.probeLate.Inc}
	n.up.Store(true)
	n.since = time.Now()
	n.reason = "configured"
	m.up.Set(1)
	return n
}

// dataClient is what operations need from a node's data connections.
// *mcpipe.Client (pipelined connections) and pooled (gomemcache, a request
// per connection) implement it with gomemcache's items and errors, so
// classify treats both alike.
type dataClient interface {
	// Do runs o with key as the key sent: for op.Get the item
	// (memcache.ErrCacheMiss if none), for op.Incr and op.Decr the new
	// value, for the others their outcome. ctx bounds a wait before
	// anything is sent (mcpipe's room for large values), and how long
	// mcpipe keeps a slow reply or value going; gomemcache's ignores it.
	Do(ctx context.Context, o op.Op, key string) (*memcache.Item, uint64, error)
	GetMulti(keys []string) (map[string]*memcache.Item, error)
	// GetMultiLimit is GetMulti keeping at most limit bytes of values
	// (0: no limit); the keys of the values it drops are in dropped.
	// room, if not nil, holds every value kept (op.Room.Reserve); the
	// keys of those it refuses are in nofit. ctx is as for Do. probe
	// asks mcpipe's to learn the values' sizes first (mg) and read only
	// those that fit limit, so that memcached does not send the values
	// it would drop; gomemcache's has no meta commands and ignores it.
	GetMultiLimit(ctx context.Context, keys []string, limit int, room op.Room, probe bool) (items map[string]*memcache.Item, dropped, nofit []string, err error)
	Close() error
}

// pooled is gomemcache's client as a dataClient. Its GetMultiLimit reads
// every value before it drops the ones past the limit: only mcpipe's
// bounds the memory of the read itself.
type pooled struct{ *memcache.Client }

// Do maps o onto gomemcache's methods. gomemcache has no gat: op.GAT is
// a get and then a touch, two round trips instead of one, and not atomic
// (the touch may set the expiration of a value written after the get).
func (p pooled) Do(_ context.Context, o op.Op, key string) (*memcache.Item, uint64, error) {
	it := &memcache.Item{Key: key, Value: o.Item.Value, Flags: o.Item.Flags, Expiration: o.Item.Expiration, CasID: o.Item.CAS}
	var err error
	switch o.Verb {
	case op.Get:
		it, err = p.Get(key)
		return it, 0, err
	case op.Head, op.HeadTouch: // gomemcache has no meta commands: the whole value, for its size
		if it, err = p.Get(key); err != nil {
			return nil, 0, err
		}
		size := len(it.Value)
		it.Value = nil
		if o.Verb == op.HeadTouch {
			err = p.Touch(key, o.Item.Expiration)
		}
		return it, uint64(size), err
	case op.GAT:
		if it, err = p.Get(key); err != nil {
			return nil, 0, err
		}
		return it, 0, p.Touch(key, o.Item.Expiration)
	case op.Set:
		err = p.Set(it)
	case op.Add:
		err = p.Add(it)
	case op.Replace:
		err = p.Replace(it)
	case op.CAS:
		err = p.CompareAndSwap(it)
	case op.Append:
		err = p.Append(it)
	case op.Prepend:
		err = p.Prepend(it)
	case op.AppendCAS, op.PrependCAS, op.DeleteCAS: // an ms, an md: gomemcache has no meta commands (node.metaDelete sends md)
		err = mcpipe.ErrNoMeta
	case op.Incr:
		n, err := p.Increment(key, o.Delta)
		return nil, n, err
	case op.Decr:
		n, err := p.Decrement(key, o.Delta)
		return nil, n, err
	case op.Touch:
		err = p.Touch(key, o.Item.Expiration)
	case op.Delete:
		err = p.Delete(key)
	default:
		err = fmt.Errorf("upstream: no such verb %d", o.Verb)
	}
	return nil, 0, err
}

// GetMultiLimit reads every value whole first (gomemcache's GetMulti),
// then keeps those within limit that room reserves, in the order asked,
// as memcached answers; the reservations are released once the items are
// handed out, as mcpipe's are after the reply is read. It ignores probe
// (gomemcache has no meta commands): memcached sends every value found.
func (p pooled) GetMultiLimit(_ context.Context, keys []string, limit int, room op.Room, _ bool) (map[string]*memcache.Item, []string, []string, error) {
	items, err := p.GetMulti(keys)
	if err != nil || limit <= 0 && room == nil {
		return items, nil, nil, err
	}
	var dropped, nofit []string
	kept := 0
	for _, k := range keys {
		it, ok := items[k]
		if !ok {
			continue
		}
		switch n := len(it.Value); {
		case limit > 0 && kept+n > limit:
			delete(items, k)
			dropped = append(dropped, k)
		case room != nil && n > 0 && !room.Reserve(n):
			delete(items, k)
			nofit = append(nofit, k)
		default:
			kept += n
			if room != nil && n > 0 {
				defer room.Release(n)
			}
		}
	}
	return items, dropped, nofit, nil
}

// setUDP gives a new node the UDP port s names, if any.
func (n *node) setUDP(s Server) {
	if s.UDPPort > 0 {
		n.udp = newUDPPort(net.JoinHostPort(s.Host, strconv.Itoa(s.UDPPort)), n.m.udpUp)
	}
}

// closeKeptIdle closes the connections of meta lookups, HEADs and raw
// commands that have been kept unused for keptIdle at now.
func (n *node) closeKeptIdle(now time.Time) {
	before := now.Add(-n.keptIdle)
	n.meta.closeKeptBefore(before)
	n.heads.closeKeptBefore(before)
	n.cmdIdle.closeKeptBefore(before)
}

// close closes the node's connections.
func (n *node) close() error {
	err := errors.Join(n.client.Close(), n.probe.Close())
	n.meta.close()
	n.heads.close()
	n.cmdIdle.close()
	if n.udp != nil {
		n.udp.close()
	}
	return err
}

// inFlightCap is the number of operations a node runs at once.
func (o *Options) inFlightCap() int {
	if o.PipelineConns > 0 {
		return o.MaxInFlight
	}
	return o.MaxConns
}

// opFunc runs one operation on a node's client. failover is true when the
// node is not the key's owner, so writes can cap their TTL.
type opFunc func(mc dataClient, failover bool) error

// run runs o on the node, with sk as the key sent (prefixed); Gets go
// through get, which batches them when the node's slots are busy.
// failover says the node is not the key's owner: an expiration the verb
// sends is then capped (cap).
func (n *node) run(ctx context.Context, o op.Op, sk string, failover bool, cap func(int32) int32) (op.Result, error) {
	var res op.Result
	if n.hints != nil && o.Verb.Writes() {
		n.hints.Forget(sk) // its value changes: its next Get may be parked
	}
	if o.Verb == op.Get && !o.Queued && !o.Admitted { // those wait their turn past the share: not parked
		it, lent, err := n.get(ctx, sk, o)
		if err == nil {
			res.Item, res.Lent = itemOf(o.Item.Key, it), lent
		}
		return res, err
	}
	if failover && o.Verb.TakesTTL() {
		o.Item.Expiration = cap(o.Item.Expiration)
	}
	err := n.doBulk(ctx, verbOp(o.Verb), failover, admissionOf(o), o.Bulk, func(mc dataClient, _ bool) error {
		do := mc.Do
		switch {
		case o.Verb.Reply() == op.Meta:
			do = n.headOn(mc)
		case o.Verb == op.DeleteCAS && n.pipe == nil:
			do = n.metaDelete // gomemcache's pool has no meta commands
		}
		it, num, err := do(ctx, o, sk)
		if err == nil && it != nil {
			res.Item, res.Lent = itemOf(o.Item.Key, it), n.lent(&o, it)
		}
		res.N = num
		return err
	})
	return res, err
}

// headOn returns how an op.Head or op.HeadTouch runs on mc: mg, or, once
// the node has answered mg with ERROR (memcached before 1.6, or a proxy
// that passes no meta commands on), a get (a gat) of the whole value,
// whose size it answers.
func (n *node) headOn(mc dataClient) func(context.Context, op.Op, string) (*memcache.Item, uint64, error) {
	return func(ctx context.Context, o op.Op, sk string) (*memcache.Item, uint64, error) {
		if !n.noMeta.Load() {
			do := mc.Do
			if n.pipe == nil {
				do = n.metaHead // gomemcache's pool has no meta commands
			}
			it, size, err := do(ctx, o, sk)
			if !errors.Is(err, mcpipe.ErrNoMeta) {
				return it, size, err
			}
			if n.noMeta.CompareAndSwap(false, true) {
				n.log.Warn("memcached answers mg with ERROR: HEAD reads whole values from it", "node", n.name)
			}
		}
		if o.Verb == op.HeadTouch {
			o.Verb = op.GAT
		} else {
			o.Verb = op.Get
		}
		it, _, err := mc.Do(ctx, o, sk)
		if err != nil {
			return nil, 0, err
		}
		size := len(it.Value)
		it.Value = nil // a lent buffer goes to the collector
		return it, uint64(size), nil
	}
}

// countedConn decrements the node's open-connection count once on Close.
type countedConn struct {
	net.Conn
	n      *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.n.Add(-1)
	}
	return c.Conn.Close()
}

// do runs f on the node's client within the node's in-flight cap and
// share (busy.go). The wait for a slot follows ctx; gomemcache itself has
// no context, so its socket timeout bounds the call. The result is
// classified, counted, and fed to passive health checking.
func (n *node) do(ctx context.Context, o metricOp, failover bool, f opFunc) error {
	return n.doAs(ctx, o, failover, asked, f)
}

// doAs is do for an operation admitted as a says (busy.go): asked ones
// may be refused past the node's share; admitted and queued ones wait
// for a slot.
func (n *node) doAs(ctx context.Context, o metricOp, failover bool, a admission, f opFunc) error {
	return n.doBulk(ctx, o, failover, a, false, f)
}

// doBulk is doAs for an operation that may be a chunk's write or read
// (op.Op.Bulk): a timeout of one (but a dial's) is counted and timed, not
// held against the node's health. Chunks go on connections of their own,
// and their write shows progress only as far as the kernel's socket: a
// slow link, or a proxy that buffers what it relays, shared by more
// connections, left a 1 MB chunk unanswered past the timeout while
// memcached answered every small request on its connections at once
// (docs/benchmarks.md, "Small requests beside values in chunks"). A
// memcached that stalls fails those small requests too, and its probes.
func (n *node) doBulk(ctx context.Context, o metricOp, failover bool, a admission, bulk bool, f opFunc) error {
	start := time.Now()
	release := n.release
	var err error
	switch {
	case a == queued:
		err = n.takeQueued(ctx, o.String())
		release = n.releaseQueued
	case a == admitted:
		err = n.takeAdmitted(ctx, o.String())
	case !n.take():
		err = n.wait(ctx, o.String())
	}
	if err != nil {
		n.m.ops[o][resultOf(err)].Inc()
		return err
	}
	defer release() // may send parked Gets first: not part of this operation's time; deferred, so a panic in f gives the slot back
	err = classify(n.name, o.String(), f(n.client, failover))
	if bulk && bulkStall(err) {
		n.m.duration[o].Observe(time.Since(start).Seconds())
		n.m.ops[o][resultOf(err)].Inc()
		return err
	}
	n.count(o, start, err)
	return err
}

// bulkStall reports whether err, a chunk's operation's, is a timeout on
// a connection that was made.
func bulkStall(err error) bool {
	var ne *NodeError
	return errors.As(err, &ne) && ne.timeout && !ne.dial
}

// count counts and times one operation's classified result and feeds it to
// passive health checking.
func (n *node) count(o metricOp, start time.Time, err error) {
	n.m.duration[o].Observe(time.Since(start).Seconds())
	n.m.ops[o][resultOf(err)].Inc()
	n.observe(err)
}

func resultOf(err error) result {
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, ErrNotFound):
		return resMiss
	}
	return failureOf(err)
}

// failureOf is resultOf for errors; apart so that the success path does
// not pay for errors.As's escaping target.
func failureOf(err error) result {
	var ne *NodeError
	var be *BusyError
	switch {
	case errors.As(err, &be):
		return resBusy
	case errors.As(err, &ne):
		if ne.timeout {
			return resTimeout
		}
		return resError
	case errors.Is(err, ErrServer), errors.Is(err, context.Canceled):
		return resError
	}
	return resRejected
}

// NodeStatus is a snapshot of one node for the admin API.
type NodeStatus struct {
	Pool        string    `json:"pool,omitempty"`              // Options.Name
	Node        string    `json:"node"`                        // host:port as configured
	CASTag      string    `json:"cas_tag"`                     // NodeTag(Node) in 8 hex digits: the "@<node>" of the ETags it gives out
	Up          bool      `json:"up"`                          // takes traffic
	Since       time.Time `json:"since"`                       // last change of Up
	Reason      string    `json:"reason"`                      // why it is in its state
	ProbeFails  int       `json:"consecutive_probe_fails"`     // toward HealthOptions.Fall
	ProbePasses int       `json:"consecutive_probe_passes"`    // toward HealthOptions.Rise
	Timeouts    int       `json:"consecutive_timeouts"`        // data-path timeouts in a row, toward PassiveFails
	Flaps       int       `json:"flaps"`                       // ejections that followed a re-admission within FlapWindow
	HoldUntil   time.Time `json:"readmit_hold_until,omitzero"` // while down: no re-admission before this (flap back-off); zero if none
	InFlight    int       `json:"in_flight"`                   // operations holding one of its slots now
	Connections int64     `json:"connections"`                 // open data connections now
	// UDP is the state of the node's memcached UDP port; nil if it has
	// none (MEMCGATE_UDP_PORTS).
	UDP *UDPStatus `json:"udp,omitempty"`
	// WrittenElsewhere is how many keys written to other nodes on this
	// node's account (it was down, or could not be reached) it will
	// delete before its re-admission.
	WrittenElsewhere int `json:"keys_written_elsewhere"`
	// Untracked is how many more such keys were not remembered since its
	// last re-admission because the set was full: they may read stale
	// after it (unless MEMCGATE_READMIT_FLUSH is on).
	Untracked int `json:"keys_written_elsewhere_untracked,omitempty"`
	// HistoryUnknown says the node has not been seen in service since
	// it joined the list (this process's start, or a server change that
	// added it and found it down): keys written to other nodes on its
	// account before then were not recorded here. Unless it returns
	// flushed or empty, its re-admission is counted
	// (memcgate_upstream_readmit_unknown_history_total) and logged.
	HistoryUnknown bool `json:"history_unknown,omitempty"`
	// Restarted is when the node's memcached last restarted (the new
	// process's start, as its stats say: time less uptime), if a probe
	// of this process saw another process answer at its address than
	// the one before; zero if none did
	// (memcgate_upstream_restarts_total).
	Restarted time.Time `json:"restarted,omitzero"`
}

func (n *node) status() NodeStatus {
	var udp *UDPStatus
	if n.udp != nil {
		udp = n.udp.status()
	}
	n.stale.mu.Lock()
	elsewhere, untracked := len(n.stale.keys), n.stale.untracked
	n.stale.mu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	st := NodeStatus{
		Node: n.name, CASTag: fmt.Sprintf("%08x", n.tag), Up: n.up.Load(), Since: n.since, Reason: n.reason,
		ProbeFails: n.fails, ProbePasses: n.passes, Timeouts: int(n.passiveRuns.Load()),
		Flaps: n.flaps, InFlight: len(n.sem), Connections: n.conns.Load(), UDP: udp,
		WrittenElsewhere: elsewhere, Untracked: untracked, HistoryUnknown: n.unseen.Load(),
		Restarted: n.restarted,
	}
	if !st.Up && time.Now().Before(n.holdUntil) {
		st.HoldUntil = n.holdUntil
	}
	return st
}
