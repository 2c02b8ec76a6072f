package gateway

import (
	"context"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
)

// executor runs the operations of the REST API, batches and the async
// queue: the one path from an operation to the Store and back.
type executor struct {
	store Store
	codec *codec
	// ops runs each operation: store, or, when large values are
	// written in chunks, the chunk.Values that delete, touch and refuse
	// appends to their chunks too.
	ops chunk.Store
	// chunks is ops when large values are written in chunks, else nil.
	chunks *chunk.Values
	// order keeps each synchronous write behind the asynchronous writes
	// of its key accepted before it; nil orders nothing.
	order *WriteOrder
}

// exec runs one operation of the REST API or a batch: a write first
// waits, within ctx, for the asynchronous writes of its key accepted
// before it (WriteOrder), and fails with nothing sent if ctx ends first.
func (e *executor) exec(ctx context.Context, o op.Op) op.Result {
	if o.Verb.Writes() {
		if err := e.order.wait(ctx, o.Item.Key); err != nil {
			return op.Result{Err: err}
		}
	}
	return e.run(ctx, o)
}

// run is exec without the wait: the one path from an operation of the
// REST API, batch or the async queue to the Store and back. The async
// queue calls it directly, since its writes are the ones the others wait
// for. The value of a whole-value write goes through the codec first.
func (e *executor) run(ctx context.Context, o op.Op) op.Result {
	if codecWrites(o.Verb) {
		if err := e.codec.prepare(ctx, &o.Item); err != nil {
			return op.Result{Err: err}
		}
	}
	return e.ops.Do(ctx, o)
}

// mayHoldIndex reports whether key's item may be an index that a small
// write of it must retire (chunk.Values.MayHoldIndex): such a write goes
// through run, not straight to the Store. Always false when values are
// not written in chunks.
func (e *executor) mayHoldIndex(key string) bool {
	return e.chunks != nil && e.chunks.MayHoldIndex(key)
}
