package upstream

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// node is one memcached server: its own gomemcache client (so its own
// keepalive pool and timeout), a semaphore that caps operations in flight
// (and so open connections), a separate one-connection probe client, and
// its health state.
//
// node holds atomics and a mutex: it must not be copied.
type node struct {
	name   string // host:port as configured; what the ring hashes and what metrics show
	client *memcache.Client
	probe  *memcache.Client
	sem    chan struct{} // a token per operation in flight
	conns  atomic.Int64  // open data connections (dialled and not yet closed)
	m      *nodeMetrics
	log    *slog.Logger
	h      healthPolicy

	up          atomic.Bool
	passiveRuns atomic.Int32 // consecutive data-path timeouts

	mu     sync.Mutex // guards the fields below; never held across I/O
	fails  int        // consecutive failed probes
	passes int        // consecutive passed probes
	since  time.Time  // last state change
	reason string     // why the node is in its state
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

func newNode(name string, o *Options, pol healthPolicy, m *nodeMetrics, log *slog.Logger) *node {
	n := &node{
		name: name,
		sem:  make(chan struct{}, o.MaxConns),
		m:    m,
		log:  log.With("node", name),
		h:    pol,
	}
	dialer := o.Dialer
	if dialer == nil {
		d := &net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second}
		dialer = d.DialContext
	}
	n.client = memcache.NewFromSelector(selector{addr(name)})
	n.client.Timeout = o.Timeout
	n.client.MaxIdleConns = max(o.MaxIdleConns, 1)
	n.client.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dialer(ctx, network, address)
		if err != nil {
			return nil, err
		}
		n.conns.Add(1)
		return &countedConn{Conn: c, n: &n.conns}, nil
	}
	n.probe = memcache.NewFromSelector(selector{addr(name)})
	n.probe.Timeout = o.Health.Timeout
	n.probe.MaxIdleConns = 1
	n.probe.DialContext = dialer
	n.up.Store(true)
	n.since = time.Now()
	n.reason = "configured"
	m.up.Set(1)
	return n
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

// do runs f on the node's client within the node's in-flight cap. The wait
// for a slot follows ctx; gomemcache itself has no context, so its socket
// timeout bounds the call. The result is classified, counted, and fed to
// passive health checking.
func (n *node) do(ctx context.Context, o op, f func(*memcache.Client) error) error {
	start := time.Now()
	select {
	case n.sem <- struct{}{}:
	default:
		select {
		case n.sem <- struct{}{}:
		case <-ctx.Done():
			err := ctxError(n.name, o.String(), ctx.Err())
			n.m.ops[o][resultOf(err)].Inc()
			return err
		}
	}
	err := classify(n.name, o.String(), f(n.client))
	<-n.sem
	n.m.duration[o].Observe(time.Since(start).Seconds())
	n.m.ops[o][resultOf(err)].Inc()
	n.observe(err)
	return err
}

func resultOf(err error) result {
	var ne *NodeError
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, ErrNotFound):
		return resMiss
	case errors.As(err, &ne):
		if ne.timeout {
			return resTimeout
		}
		return resError
	case errors.Is(err, ErrServer):
		return resError
	case errors.Is(err, context.Canceled):
		return resError
	}
	return resRejected
}

// available reports whether the node takes traffic.
func (n *node) available() bool { return n.up.Load() }

// observe is passive health checking: a refused or reset connection ejects
// the node at once; timeouts eject after PassiveFails in a row; anything
// else memcached answered resets the count. Only probes re-admit.
func (n *node) observe(err error) {
	var ne *NodeError
	if !errors.As(err, &ne) {
		if n.passiveRuns.Load() != 0 {
			n.passiveRuns.Store(0)
		}
		return
	}
	if n.h.PassiveFails <= 0 || errors.Is(err, context.DeadlineExceeded) {
		return // waiting for our own semaphore says nothing about the node
	}
	if hardFailure(err) {
		n.eject("refused", err)
		return
	}
	if ne.timeout && int(n.passiveRuns.Add(1)) >= n.h.PassiveFails {
		n.eject("timeouts", err)
	}
}

// eject takes the node out of service; it logs and counts only when the
// state actually changes.
func (n *node) eject(reason string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.passes = 0
	if !n.up.CompareAndSwap(true, false) {
		return
	}
	n.passiveRuns.Store(0)
	n.since, n.reason = time.Now(), reason+": "+err.Error()
	n.m.up.Set(0)
	n.h.ejected(n.name, reason)
	n.log.Warn("node down", "reason", reason, "err", err.Error())
}

// probeResult applies one active probe's result with hysteresis: Fall
// failures in a row take the node down, Rise passes bring it back.
func (n *node) probeResult(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.passes = 0
		n.fails++
		if n.fails >= n.h.Fall && n.up.CompareAndSwap(true, false) {
			n.passiveRuns.Store(0)
			n.since, n.reason = time.Now(), "probe: "+err.Error()
			n.m.up.Set(0)
			n.h.ejected(n.name, "probe")
			n.log.Warn("node down", "reason", "probe", "fails", n.fails, "err", err.Error())
		}
		return
	}
	n.fails = 0
	n.passes++
	if n.passes >= n.h.Rise && n.up.CompareAndSwap(false, true) {
		n.since, n.reason = time.Now(), "probes passed"
		n.m.up.Set(1)
		n.log.Info("node up", "passes", n.passes)
	}
}

// NodeStatus is a snapshot of one node for the admin API.
type NodeStatus struct {
	Node        string    `json:"node"`
	Up          bool      `json:"up"`
	Since       time.Time `json:"since"`
	Reason      string    `json:"reason"`
	ProbeFails  int       `json:"consecutive_probe_fails"`
	ProbePasses int       `json:"consecutive_probe_passes"`
	PassiveRuns int       `json:"consecutive_timeouts"`
	InFlight    int       `json:"in_flight"`
	Connections int64     `json:"connections"`
}

func (n *node) status() NodeStatus {
	n.mu.Lock()
	defer n.mu.Unlock()
	return NodeStatus{
		Node: n.name, Up: n.up.Load(), Since: n.since, Reason: n.reason,
		ProbeFails: n.fails, ProbePasses: n.passes, PassiveRuns: int(n.passiveRuns.Load()),
		InFlight: len(n.sem), Connections: n.conns.Load(),
	}
}
