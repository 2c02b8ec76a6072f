package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/mcpipe"
	"github.com/memcgate/memcgate/upstream/op"
)

// ErrNoMeta means the node answered a meta command with an error line:
// it is older than memcached 1.6, which speaks the meta protocol, or a
// proxy in front of it does not pass meta commands on. An op.AppendCAS
// or op.PrependCAS gets it, unsent, from a node that has not shown it
// speaks memcached 1.6.10's (an op.Head answered by mg), and always from
// gomemcache's pool (PipelineConns 0), which has no meta commands. An
// op.DeleteCAS gets it from a node that answers md with an error line.
var ErrNoMeta = errors.New("upstream: memcached does not answer meta commands")

// TTL returns the remaining lifetime of the item o names (its Item.Key,
// placed by its HashKey if set; the verb is ignored), in seconds (0: it
// never expires), and the item's CAS value, from the node a Get of it
// would read now (the owner, or the node it fails over to). It asks with
// the meta protocol (mg <key> t c), which neither gomemcache nor the
// pipelined client speaks, on a connection of its own per request kept
// idle for the next (at most metaIdle per node). It is not counted in the
// operation metrics nor fed to health checking: it is an optional
// lookup, and the callers (warm-up) have a default when it fails. Errors:
// ErrNotFound, ErrNoMeta, ErrBadKey, ErrNoNodes, or a *NodeError.
func (c *Cluster) TTL(ctx context.Context, o op.Op) (ttl int32, cas uint64, err error) {
	sk, hk := c.keysOf(&o)
	if !mcpipe.LegalKey(sk) {
		return 0, 0, ErrBadKey
	}
	err = c.routeAfter(ctx, hk, sk, "", nil, nil, func(n *node, _ bool) error {
		var e error
		ttl, cas, e = n.metaTTL(ctx, sk)
		return e
	})
	return ttl, cas, err
}

// metaIdle is the number of idle meta connections a node keeps.
const metaIdle = 2

// metaConns is the most connections a node's TTL lookups hold at once;
// more lookups wait for one of them. Each lookup dialled its own when
// none was idle: a warm-up copying many keys at once (up to
// MEMCGATE_WARM_BACKGROUND_OPS) opened as many connections to the node,
// past memcached's -c, and closed all but metaIdle.
const metaConns = metaIdle

// defaultKeptIdle is how long a node keeps an idle connection of its
// meta lookups, raw commands or HEADs unused: past it, the node's next
// health round closes it (closeKeptIdle). A connection kept for good
// would be held for the node's life by a one-off command, such as the
// stats at the admission of a node a reload adds, and one whose memcached
// restarted would stay open in CLOSE_WAIT, counted in
// memcgate_upstream_connections, until a command came to find it dead.
// A minute spares the connections of commands that come more often
// (a /memc?cmd=stats every 10 s of monitoring).
const defaultKeptIdle = time.Minute

// idleConns are a node's idle connections for one kind of request that
// runs outside its data client (meta lookups, raw commands), each in step:
// its last reply read whole, nothing more buffered. The zero value keeps
// metaIdle; it must not be copied.
type idleConns struct {
	keep   int        // the most kept; 0: metaIdle
	mu     sync.Mutex // guards idle, closed
	idle   []*idleConn
	closed bool
}

// idleConn is a connection with the reader its replies are read through.
type idleConn struct {
	net.Conn
	br    *bufio.Reader
	since time.Time // when it was last kept (put)
}

// get takes an idle connection, or nil if there is none.
func (m *idleConns) get() *idleConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.idle) == 0 {
		return nil
	}
	mc := m.idle[len(m.idle)-1]
	m.idle = m.idle[:len(m.idle)-1]
	return mc
}

// put keeps mc for the next request, or closes it when as many are kept
// already or the node is closed. A connection with reply bytes still
// buffered is out of step and closed.
func (m *idleConns) put(mc *idleConn) {
	keep := m.keep
	if keep == 0 {
		keep = metaIdle
	}
	m.mu.Lock()
	if !m.closed && len(m.idle) < keep && mc.br.Buffered() == 0 {
		mc.since = time.Now()
		m.idle = append(m.idle, mc)
		mc = nil
	}
	m.mu.Unlock()
	if mc != nil {
		mc.Close()
	}
}

// closeKeptBefore closes the idle connections kept since before t. get
// takes the newest, so those are the first ones.
func (m *idleConns) closeKeptBefore(t time.Time) {
	m.mu.Lock()
	k := 0
	for k < len(m.idle) && m.idle[k].since.Before(t) {
		k++
	}
	old := slices.Clone(m.idle[:k])
	m.idle = slices.Delete(m.idle, 0, k)
	m.mu.Unlock()
	for _, mc := range old {
		mc.Close()
	}
}

// close closes the idle connections, and those put from now on.
func (m *idleConns) close() {
	m.mu.Lock()
	idle := m.idle
	m.idle, m.closed = nil, true
	m.mu.Unlock()
	for _, mc := range idle {
		mc.Close()
	}
}

// metaTTL asks the node for sk's TTL and CAS within its in-flight cap and
// socket timeout. It waits for one of the node's metaConns connections
// at most the timeout too: a lookup is optional, and one that queued
// behind others on a node that does not answer would spend its caller's
// whole deadline in line (a request's copy from the warm pool) where the
// caller's default TTL serves; it is not sent to another node, which
// does not hold the key. A ctx that ends wakes the lookup at once,
// and its connection is given back (closed: its state is unknown).
func (n *node) metaTTL(ctx context.Context, sk string) (int32, uint64, error) {
	wait := time.NewTimer(n.timeout)
	select {
	case n.metas <- struct{}{}:
		wait.Stop()
		defer func() { <-n.metas }()
	case <-ctx.Done():
		wait.Stop()
		return 0, 0, ctxError(n.name, "mg", ctx.Err())
	case <-wait.C:
		// Not a *NodeError: the wait is the gateway's own, and the
		// lookup goes to no other node (where the key is not): its
		// caller takes its default.
		return 0, 0, fmt.Errorf("%s: mg: no connection for TTL lookups free within %s: %w", n.name, n.timeout, context.DeadlineExceeded)
	}
	if !n.take() {
		if err := n.wait(ctx, "mg"); err != nil {
			return 0, 0, err
		}
	}
	defer func() { <-n.sem }()
	mc := n.meta.get()
	if mc == nil {
		dctx, cancel := context.WithTimeout(ctx, n.timeout)
		conn, err := n.dial(dctx, "tcp", n.name)
		cancel()
		if err != nil {
			return 0, 0, classify(n.name, "mg", err)
		}
		mc = &idleConn{Conn: conn, br: bufio.NewReaderSize(conn, 256)}
	}
	deadline := time.Now().Add(n.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = mc.SetDeadline(deadline)
	cut := context.AfterFunc(ctx, func() { _ = mc.SetDeadline(time.Unix(1, 0)) })
	if _, err := mc.Write([]byte("mg " + sk + " t c\r\n")); err != nil {
		cut()
		mc.Close()
		return 0, 0, classify(n.name, "mg", err)
	}
	line, err := mc.br.ReadSlice('\n')
	if !cut() {
		// ctx ended: the connection's deadline was moved, or is about
		// to be, so it is not kept. A caller that gave up is told so,
		// not that the node timed out.
		mc.Close()
		if err == nil || errors.Is(ctx.Err(), context.Canceled) {
			return 0, 0, fmt.Errorf("%s: mg: %w", n.name, ctx.Err())
		}
		return 0, 0, classify(n.name, "mg", err)
	}
	if err != nil {
		mc.Close()
		if errors.Is(err, bufio.ErrBufferFull) {
			return 0, 0, fmt.Errorf("%w: %s: meta reply line too long", ErrServer, n.name)
		}
		return 0, 0, classify(n.name, "mg", err)
	}
	ttl, cas, err := parseMetaTTL(line)
	if errors.Is(err, ErrNoMeta) || errors.Is(err, ErrServer) {
		mc.Close() // after an error line the connection's state is not worth trusting
	} else {
		n.meta.put(mc)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", n.name, err)
	}
	return ttl, cas, nil
}

// metaHead runs o, an op.Head or op.HeadTouch, as mcpipe does, on a
// connection of the node's heads, for gomemcache's pool, which has no
// meta commands: "mg <key> s f c" costs memcached one line, where a get
// made it send the whole value. An error line is mcpipe.ErrNoMeta (headOn
// reads the value instead); socket errors are the node's, as gomemcache's
// are.
func (n *node) metaHead(ctx context.Context, o op.Op, sk string) (it *memcache.Item, size uint64, err error) {
	err = n.metaLine(ctx, o, sk, func(line []byte) error {
		it, size, err = mcpipe.ParseHead(line)
		return err
	})
	return it, size, err
}

// metaDelete runs o, an op.DeleteCAS, as mcpipe does (md), on a
// connection of the node's heads, for gomemcache's pool, which has no
// meta commands and whose delete takes no CAS. Its errors are those of
// mcpipe.ParseMetaDeleted, or the socket's.
func (n *node) metaDelete(ctx context.Context, o op.Op, sk string) (*memcache.Item, uint64, error) {
	return nil, 0, n.metaLine(ctx, o, sk, mcpipe.ParseMetaDeleted)
}

// metaLine sends o, a meta command answered in one line, on a connection
// of the node's heads, and reads the line with read. The caller holds one
// of the node's slots, which bounds the connections (at most
// Options.MaxConns; up to MaxIdleConns kept). A connection is kept for
// the next command after one of memcached's answers (a hit, a miss, a
// CAS that differs) and after a bare ERROR, a memcached before 1.6 that
// does not know the command: a meta command sent here has no data block,
// so the connection is in step; closed, each conditional DELETE to such
// a node would dial it anew. After any other error line its state is
// not worth trusting.
func (n *node) metaLine(ctx context.Context, o op.Op, sk string, read func(line []byte) error) error {
	mc := n.heads.get()
	if mc == nil {
		dctx, cancel := context.WithTimeout(ctx, n.timeout)
		conn, err := n.dial(dctx, "tcp", n.name)
		cancel()
		if err != nil {
			return err
		}
		mc = &idleConn{Conn: conn, br: bufio.NewReaderSize(&onTimeConn{Conn: conn, ctx: context.Background(), timeout: n.timeout}, 256)}
	}
	_ = mc.SetDeadline(time.Now().Add(n.timeout))
	if _, err := mc.Write(op.EncodeHead(make([]byte, 0, 64+len(sk)), &o, sk)); err != nil {
		mc.Close()
		return err
	}
	line, err := mc.br.ReadSlice('\n')
	if err != nil {
		mc.Close()
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("memcache: unexpected response line from %s: longer than %d bytes", o.Verb.Command(), mc.br.Size())
		}
		return err
	}
	err = read(line)
	if err == nil || errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, memcache.ErrCASConflict) || string(line) == "ERROR\r\n" {
		n.heads.put(mc)
	} else {
		mc.Close()
	}
	return err
}

// parseMetaTTL reads the reply to "mg <key> t c": "HD t<ttl> c<cas>"
// (t-1: no expiry) or "EN" (a miss). A flag given twice is ErrServer,
// as mcpipe's metaResult refuses one: memcached returns each flag asked
// once (it refuses a request that repeats one, "CLIENT_ERROR duplicate
// flag"), so a reply with two TTLs is no answer to the lookup, and
// neither of them is taken.
func parseMetaTTL(line []byte) (int32, uint64, error) {
	line = bytes.TrimRight(line, "\r\n")
	fields := bytes.Fields(line)
	switch {
	case len(fields) == 0:
		return 0, 0, fmt.Errorf("%w: empty meta reply", ErrServer)
	case string(fields[0]) == "EN":
		return 0, 0, ErrNotFound
	case isErrorLine(line):
		return 0, 0, fmt.Errorf("%w: %q", ErrNoMeta, line)
	case string(fields[0]) != "HD":
		return 0, 0, fmt.Errorf("%w: unexpected meta reply %q", ErrServer, line)
	}
	var ttl int64
	var cas uint64
	var haveTTL, haveCAS bool
	for _, f := range fields[1:] {
		if len(f) < 2 {
			continue
		}
		var err error
		switch f[0] {
		case 't':
			if haveTTL {
				return 0, 0, fmt.Errorf("%w: meta reply %q has the flag t twice", ErrServer, line)
			}
			ttl, err = strconv.ParseInt(string(f[1:]), 10, 32)
			haveTTL = true
		case 'c':
			if haveCAS {
				return 0, 0, fmt.Errorf("%w: meta reply %q has the flag c twice", ErrServer, line)
			}
			cas, err = strconv.ParseUint(string(f[1:]), 10, 64)
			haveCAS = true
		}
		if err != nil {
			return 0, 0, fmt.Errorf("%w: meta reply %q: %w", ErrServer, line, err)
		}
	}
	if !haveTTL {
		return 0, 0, fmt.Errorf("%w: meta reply %q has no TTL", ErrServer, line)
	}
	if ttl < 0 { // -1: the item never expires
		return 0, cas, nil
	}
	return int32(max(ttl, 1)), cas, nil // 0 would mean "never" to the caller; the item is at its last second
}
