package upstream

import (
	"context"

	"github.com/memcgate/memcgate/upstream/op"
)

// Item is op.Item, as the tests name it.
type Item = op.Item

// The verbs as methods, for tests that read better with them; each is one
// Cluster.Do or DoAsync.

func (c *Cluster) Get(ctx context.Context, key string) (op.Item, error) {
	r := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}})
	return r.Item, r.Err
}

func (c *Cluster) store(ctx context.Context, v op.Verb, it op.Item) error {
	return c.Do(ctx, op.Op{Verb: v, Item: it}).Err
}

func (c *Cluster) Set(ctx context.Context, it op.Item) error     { return c.store(ctx, op.Set, it) }
func (c *Cluster) Add(ctx context.Context, it op.Item) error     { return c.store(ctx, op.Add, it) }
func (c *Cluster) Replace(ctx context.Context, it op.Item) error { return c.store(ctx, op.Replace, it) }
func (c *Cluster) Append(ctx context.Context, it op.Item) error  { return c.store(ctx, op.Append, it) }
func (c *Cluster) Prepend(ctx context.Context, it op.Item) error { return c.store(ctx, op.Prepend, it) }
func (c *Cluster) CompareAndSwap(ctx context.Context, it op.Item) error {
	return c.store(ctx, op.CAS, it)
}

func (c *Cluster) Delete(ctx context.Context, key string) error {
	return c.store(ctx, op.Delete, op.Item{Key: key})
}

func (c *Cluster) Touch(ctx context.Context, key string, exp int32) error {
	return c.store(ctx, op.Touch, op.Item{Key: key, Expiration: exp})
}

func (c *Cluster) Incr(ctx context.Context, key string, delta uint64) (uint64, error) {
	r := c.Do(ctx, op.Op{Verb: op.Incr, Item: op.Item{Key: key}, Delta: delta})
	return r.N, r.Err
}

func (c *Cluster) Decr(ctx context.Context, key string, delta uint64) (uint64, error) {
	r := c.Do(ctx, op.Op{Verb: op.Decr, Item: op.Item{Key: key}, Delta: delta})
	return r.N, r.Err
}

func (c *Cluster) GetAsync(ctx context.Context, key string, done func(op.Item, error)) bool {
	return c.DoAsync(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}}, func(r op.Result) { done(r.Item, r.Err) })
}

func (c *Cluster) SetAsync(ctx context.Context, it op.Item, done func(error)) bool {
	return c.DoAsync(ctx, op.Op{Verb: op.Set, Item: it}, func(r op.Result) { done(r.Err) })
}
