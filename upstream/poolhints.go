package upstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
)

// Large Gets on gomemcache's pool. The pool reads a value of up to
// Options.UnheldClaim (the gateway's MAX_VALUE_BYTES) before its caller
// holds it, one per connection, so that a node has at most its MaxConns
// such values being read at once. Gets parked while every connection is
// busy (coalesce.go) are sent as one multi-key get of up to
// maxKeysPerGet keys, read whole: clients asking for large values and
// resetting at once kept each of a node's 64 connections reading
// several megabytes nobody read. So a Get with a Room whose key's value
// was large when last read (the node's hints, as mcpipe's) is never
// parked: it waits for a connection of its own, and is counted, from
// before it waits until it is read, in the node's bytes ahead; past
// the same bound as mcpipe's (four times the byte budget,
// readHold.Ahead), or while its Room could not take the value now, it
// is refused unsent (ErrNoFit), as on the pipelined pool
// (decisions/0058). And once it has its connection, just before it is
// sent, it asks whether its client is still there (op.Op.Client): a
// client that asked and reset at once is gone by then, and memcached is
// not asked for a value nobody would read (decisions/0060, 0062). Gets
// of keys with no hint are parked as before, but a batch's reply reads
// at most UnheldClaim of values unheld in all, the rest held in the
// budget (claimConn), its keys read again alone if refused (alone).

// getHinted is get for a Get with a Room on gomemcache's pool: one of a
// key known large goes alone (getLarge), counted ahead from before it
// waits until it ends, or is refused unsent (admitLarge); others may be
// parked (getBatching). Either way what it found is learnt.
func (n *node) getHinted(ctx context.Context, key string, o op.Op) (it *memcache.Item, lent bool, err error) {
	size := n.hints.Size(key)
	switch {
	case size == 0:
		it, lent, err = n.getBatching(ctx, key, o)
	case !n.admitLarge(o.Room, key, size):
		n.m.ops[verbOp(op.Get)][resultOf(ErrNoFit)].Inc()
		return nil, false, ErrNoFit
	default:
		defer n.ahead.Add(-int64(size)) // deferred: a panic gives it back too, as its slot
		it, err = n.getLarge(ctx, key, o)
	}
	n.learn(key, it, err)
	return it, lent, err
}

// admitLarge reports whether a Get with room of key, whose value was size
// bytes when last read, may be sent, and if so counts size in n.ahead;
// the caller gives it back once the Get ends. It may when the node's
// large Gets ahead, with this one, stay within readHold.Ahead (any one
// alone may), and then if room could take size bytes now, or else if it
// is the one read per hint interval sent anyway to correct a hint that
// may be stale (mcpipe.SizeHints.Retry).
func (n *node) admitLarge(room op.Room, key string, size int) (ok bool) {
	after := n.ahead.Add(int64(size))
	defer func() { // also when Fits panics: nothing else gives it back then
		if !ok {
			n.ahead.Add(-int64(size))
		}
	}()
	if after != int64(size) && !n.reads.Ahead(after) {
		return false
	}
	return room.Fits(size) || n.hints.Retry(key)
}

// learn notes what a Get with a Room of key found on gomemcache's pool:
// its value's size, or that it has none.
func (n *node) learn(key string, it *memcache.Item, err error) {
	switch {
	case err == nil && it != nil:
		n.hints.Saw(key, len(it.Value))
	case errors.Is(err, ErrNotFound):
		n.hints.Forget(key)
	}
}

// errGone: the client of a Get of a key known large left while the Get
// waited for a connection, and it was not sent. It wraps
// context.Canceled: the gateway answers nothing and logs 499.
var errGone = fmt.Errorf("upstream: the client left before its read of a large value was sent: %w", context.Canceled)

// getLarge runs a Get of a key known large on gomemcache's pool: on a
// connection of its own, never parked, and only if its client is still
// there once it has the connection (gone).
func (n *node) getLarge(ctx context.Context, key string, o op.Op) (*memcache.Item, error) {
	if !n.take() {
		if err := n.wait(ctx, "get"); err != nil {
			n.m.ops[verbOp(op.Get)][resultOf(err)].Inc()
			return nil, err
		}
	}
	if err := n.gone(ctx, o.Client); err != nil {
		n.release() // nothing sent: not the node's success or failure
		n.m.ops[verbOp(op.Get)][resultOf(err)].Inc()
		return nil, err
	}
	return n.getHolding(key, o)
}

// gone returns errGone if client (the Get's op.Op.Client, if any) has
// left, or ctx's error if it has one (a server that offers no Client
// cancels the request's context when its client goes), else nil.
func (n *node) gone(ctx context.Context, client op.Client) error {
	if client != nil && client.Gone() {
		return errGone
	}
	if err := ctx.Err(); err != nil {
		return ctxError(n.name, "get", err) // a deadline: a timeout waiting for a connection
	}
	return nil
}
