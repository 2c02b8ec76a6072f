package upstream

import (
	"context"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// Asynchronous operations. A caller that must not keep a goroutine
// waiting for each request (the gateway, which lets the reply finish the
// HTTP response) starts an operation with DoAsync and is called back. It
// takes only the common path: the key's owner is up, served by pipelined
// connections, and has a free slot of its in-flight cap. Anything else (a
// node down, failover, a full cap, gomemcache's pool, a connection that
// cannot be had) makes it return false having done nothing, and the
// caller uses Do, which waits, retries and fails over. (So a write never
// leaves here for a node other than its key's owner, and has no key to
// record for the owner's re-admission, stale.go: Do records it.) Each
// operation is counted, timed and fed to passive health checking as Do's
// are.
//
// done is called exactly once, as mcpipe's callbacks are: usually from the
// goroutine that reads the node's replies, never with a lock held. It
// must not block and must not wait for another memcached request; a read
// retried on the next node after a transport failure runs, with its done,
// on a goroutine of its own.

// DoAsync starts o and reports whether it did; done then gets what Do
// would have returned. ctx must stay valid until done is called. o's
// Value is not kept after DoAsync returns. A write that reached a
// connection is not retried elsewhere, as Do does not retry it: the node
// may have applied it.
func (c *Cluster) DoAsync(ctx context.Context, o op.Op, done func(op.Result)) bool {
	if !o.Verb.Valid() || o.Item.CASNode != 0 && o.Verb.Checked() {
		// A CAS value that names a node is checked on that node alone
		// (casHere), which Do finds; the owner, where this one goes,
		// gave out those that name none.
		return false
	}
	sk, hk := c.keysOf(&o)
	n := c.asyncNode(hk)
	if n == nil {
		return false
	}
	a := c.newAsyncOp(ctx, n)
	a.o, a.done = o, done
	a.o.Item.Value = nil // encoded before DoAsync returns; not kept
	if err := n.pipe.DoAsync(ctx, o, sk, a.doneFn); err != nil {
		c.putAsyncOp(a)
		<-n.sem
		return false
	}
	return true
}

// asyncOp is one DoAsync in flight. It is pooled, with the callback mcpipe
// calls made once per asyncOp, so that an operation allocates no closure.
type asyncOp struct {
	c     *Cluster
	ctx   context.Context
	n     *node
	start time.Time
	o     op.Op // without its value
	done  func(op.Result)
	// Made once: a.complete as a value.
	doneFn func(*memcache.Item, uint64, error)
}

func (c *Cluster) newAsyncOp(ctx context.Context, n *node) *asyncOp {
	a, _ := c.asyncOps.Get().(*asyncOp)
	if a == nil {
		a = &asyncOp{c: c}
		a.doneFn = a.complete
	}
	a.ctx, a.n, a.start = ctx, n, time.Now()
	return a
}

func (c *Cluster) putAsyncOp(a *asyncOp) {
	*a = asyncOp{c: a.c, doneFn: a.doneFn}
	c.asyncOps.Put(a)
}

// complete ends a DoAsync: mcpipe's callback. mi is mcpipe's until
// complete returns: itemOf copies it.
func (a *asyncOp) complete(mi *memcache.Item, num uint64, err error) {
	c, ctx, n, start, o, done := a.c, a.ctx, a.n, a.start, a.o, a.done
	c.putAsyncOp(a)
	res := op.Result{N: num}
	if res.Err = n.account(verbOp(o.Verb), start, err); res.Err == nil {
		if mi != nil {
			res.Item, res.Lent = itemOf(o.Item.Key, mi), n.lent(&o, mi)
		}
		done(res)
		return
	}
	if _, failed := nodeFailure(res.Err); failed && !o.Verb.Writes() && c.opts.Failover != FailFast && c.opts.MaxAttempts > 1 && ctx.Err() == nil {
		go c.retryAsync(ctx, o, n, res.Err, done)
		return
	}
	done(res)
}

// retryAsync runs a failed asynchronous read again on the next nodes, on
// a goroutine of its own, and hands done the outcome. A method rather
// than a closure in complete: a closure would capture complete's
// variables, which then escape to the heap on every call, failed or not.
//
// A panic on the way (a bug) is stopped: done still gets an answer,
// panicguard.ErrPanicked (500), which ends its request.
func (c *Cluster) retryAsync(ctx context.Context, o op.Op, n *node, err error, done func(op.Result)) {
	defer c.retryPanics.Recover()
	res := op.Result{Err: panicguard.ErrPanicked}
	defer func() { done(res) }()
	res = c.doAfter(ctx, o, n, err)
}

// asyncNode returns the key's owner, holding a slot of its in-flight cap,
// if the owner is up, is served by pipelined connections and has a slot
// free now within its share (busy.go); else nil.
func (c *Cluster) asyncNode(hashKey string) *node {
	t := c.topo.Load()
	for i := range t.ring.Owners(hashKey) {
		n := t.nodes[i]
		if n.pipe == nil || !n.available() {
			return nil
		}
		if n.take() {
			return n
		}
		return nil
	}
	return nil
}

// account classifies, counts and times an asynchronous operation's result
// and feeds it to passive health checking, as do does, and gives back its
// slot. Unlike release it never sends the node's parked Gets: that is a
// blocking request, and account runs where replies are read. A parked Get
// takes the freed slot itself.
func (n *node) account(o metricOp, start time.Time, err error) error {
	err = classify(n.name, o.String(), err)
	n.count(o, start, err)
	<-n.sem
	return err
}
