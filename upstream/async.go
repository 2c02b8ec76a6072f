package upstream

import (
	"context"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/mcpipe"
)

// Asynchronous Get and Set. A caller that must not keep a goroutine
// waiting for each request (the gateway, which lets the reply finish the
// HTTP response) sends with GetAsync or SetAsync and is called back.
// They take only the common path: the key's owner is up, served by
// pipelined connections, and has a free slot of its in-flight cap.
// Anything else (a node down, failover, a full cap, gomemcache's pool, a
// connection that cannot be had) makes them return false having done
// nothing, and the caller uses Get or Set, which wait, retry and fail
// over. Each call is counted, timed and fed to passive health checking as
// Get and Set's are.
//
// done is called exactly once, as mcpipe's callbacks are: usually from the
// goroutine that reads the node's replies, never with a lock held. It
// must not block and must not wait for another memcached request; a Get
// retried on the next node after a transport failure runs, with its done,
// on a goroutine of its own.

// GetAsync starts Get and reports whether it did; done then gets Get's
// result. ctx must stay valid until done is called.
func (c *Cluster) GetAsync(ctx context.Context, key string, done func(Item, error)) bool {
	sk, hk := c.keysFor(ctx, key)
	n, idx, mc := c.asyncNode(hk)
	if n == nil {
		return false
	}
	a := c.newAsyncOp(ctx, n, idx)
	a.key, a.gotItem = key, done
	if err := mc.GetAsync(sk, a.gotFn); err != nil {
		c.putAsyncOp(a)
		<-n.sem
		return false
	}
	return true
}

// SetAsync starts Set and reports whether it did; done then gets Set's
// result. it.Value is not kept after SetAsync returns. A set that reached
// a connection is not retried elsewhere, as Set does not retry it: the
// node may have applied it.
func (c *Cluster) SetAsync(ctx context.Context, it Item, done func(error)) bool {
	sk, hk := c.keysFor(ctx, it.Key)
	n, idx, mc := c.asyncNode(hk)
	if n == nil {
		return false
	}
	a := c.newAsyncOp(ctx, n, idx)
	a.stored = done
	mi := memcache.Item{Key: sk, Value: it.Value, Flags: it.Flags, Expiration: it.Expiration}
	if err := mc.SetAsync(&mi, a.storedFn); err != nil {
		c.putAsyncOp(a)
		<-n.sem
		return false
	}
	return true
}

// asyncOp is one GetAsync or SetAsync in flight. It is pooled, with the
// callbacks mcpipe calls made once per asyncOp, so that an operation
// allocates no closure.
type asyncOp struct {
	c       *Cluster
	ctx     context.Context
	n       *node
	idx     int
	start   time.Time
	key     string
	gotItem func(Item, error) // GetAsync's done
	stored  func(error)       // SetAsync's done
	// Made once: a.got and a.set as values.
	gotFn    func(*memcache.Item, error)
	storedFn func(error)
}

func (c *Cluster) newAsyncOp(ctx context.Context, n *node, idx int) *asyncOp {
	a, _ := c.asyncOps.Get().(*asyncOp)
	if a == nil {
		a = &asyncOp{c: c}
		a.gotFn, a.storedFn = a.got, a.set
	}
	a.ctx, a.n, a.idx, a.start = ctx, n, idx, time.Now()
	return a
}

func (c *Cluster) putAsyncOp(a *asyncOp) {
	*a = asyncOp{c: a.c, gotFn: a.gotFn, storedFn: a.storedFn}
	c.asyncOps.Put(a)
}

// got completes a GetAsync: mcpipe's callback.
func (a *asyncOp) got(mi *memcache.Item, err error) {
	c, ctx, n, idx, start, key, done := a.c, a.ctx, a.n, a.idx, a.start, a.key, a.gotItem
	c.putAsyncOp(a)
	if err = n.account(opGet, start, err); err == nil {
		done(itemOf(key, mi), nil)
		return
	}
	if _, failed := nodeFailure(err); failed && c.opts.Failover != FailFast && c.opts.MaxAttempts > 1 && ctx.Err() == nil {
		go func() { done(c.get(ctx, key, idx, err)) }()
		return
	}
	done(Item{}, err)
}

// set completes a SetAsync: mcpipe's callback.
func (a *asyncOp) set(err error) {
	c, n, start, done := a.c, a.n, a.start, a.stored
	c.putAsyncOp(a)
	done(n.account(opSet, start, err))
}

// asyncNode returns the key's owner and its pipelined client, holding a
// slot of the node's in-flight cap, if the owner is up and has a slot free
// now; else nil.
func (c *Cluster) asyncNode(hashKey string) (*node, int, *mcpipe.Client) {
	for i := range c.ring.Owners(hashKey) {
		n := c.nodes[i]
		mc, ok := n.client.(*mcpipe.Client)
		if !ok || !n.available() {
			return nil, 0, nil
		}
		select {
		case n.sem <- struct{}{}:
			return n, i, mc
		default:
			return nil, 0, nil
		}
	}
	return nil, 0, nil
}

// account classifies, counts and times an asynchronous operation's result
// and feeds it to passive health checking, as do does, and gives back its
// slot. Unlike release it never sends the node's parked Gets: that is a
// blocking request, and account runs where replies are read. A parked Get
// takes the freed slot itself.
func (n *node) account(o op, start time.Time, err error) error {
	err = classify(n.name, o.String(), err)
	n.count(o, start, err)
	<-n.sem
	return err
}
