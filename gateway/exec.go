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
}

// exec runs one operation: the one path from an operation of the REST
// API, batch or the async queue to the Store and back. The value of a
// whole-value write goes through the codec first.
func (e *executor) exec(ctx context.Context, o op.Op) op.Result {
	if codecWrites(o.Verb) {
		if err := e.codec.prepare(&o.Item); err != nil {
			return op.Result{Err: err}
		}
	}
	return e.ops.Do(ctx, o)
}
