package route

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/memcgate/memcgate/upstream"
)

// writeOrder keeps a pool's writes of a key in order on each replica.
// Under the first and majority policies a write is answered while some
// of its copies still run, and a caller that then writes the key again
// sends copies that can overtake them on their node: a copy whose
// goroutine has not run yet, or one held up on another of the node's
// connections. That replica applies the older value last and keeps it,
// while the others hold the newer one, until the key is written again.
// So the copies of a write that may outlive its answer are recorded, per
// node and key, until their node answers, and any later copy of the key
// to that node waits for them first. A write records all of its copies
// under one lock, so writes that record are sent to every replica in the
// same order. A write that waits for all its copies before it is
// answered (the all policy, a full background budget, a CAS check) only
// waits for those recorded: its caller cannot write again before every
// copy has landed. A copy moved on to a spare (writeOne) keeps its place
// on the node it was meant for, not on the spare. It must not be copied.
type writeOrder struct {
	n    atomic.Int64 // entries in last: while 0, a write takes no lock
	mu   sync.Mutex
	last map[copyKey]chan struct{} // guarded by mu; each node's latest recorded copy of each key, closed once answered
}

// copyKey is one key on one node.
type copyKey struct{ node, key string }

// enter returns, for each of targets (the nodes a write of key goes
// to), what its copy waits for before it is sent: nil for nothing, and
// a nil slice when no copy waits. With record, it also records the
// copies, and returns for each the channel to pass to answered once the
// copy has been answered; key must then be the write's own (ownKeys),
// as it outlives the caller's.
func (w *writeOrder) enter(key string, targets []upstream.Replica, record bool) (prev, done []chan struct{}) {
	if !record && w.n.Load() == 0 {
		return nil, nil
	}
	if record {
		done = make([]chan struct{}, len(targets))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, r := range targets {
		k := copyKey{r.Node(), key}
		if p := w.last[k]; p != nil {
			if prev == nil {
				prev = make([]chan struct{}, len(targets))
			}
			prev[i] = p
		} else if record {
			w.n.Add(1)
		}
		if record {
			if w.last == nil {
				w.last = make(map[copyKey]chan struct{})
			}
			done[i] = make(chan struct{})
			w.last[k] = done[i]
		}
	}
	return prev, done
}

// answered closes done, which enter recorded for key's copy to node, and
// forgets it unless a later copy took its place.
func (w *writeOrder) answered(node, key string, done chan struct{}) {
	close(done)
	w.mu.Lock()
	defer w.mu.Unlock()
	k := copyKey{node, key}
	if w.last[k] == done {
		delete(w.last, k)
		w.n.Add(-1)
	}
}

// await waits until prev (one of enter's, nil for none) is closed or ctx
// ends; a copy whose wait ended with ctx fails when it is sent.
func await(ctx context.Context, prev chan struct{}) {
	if prev == nil {
		return
	}
	select {
	case <-prev:
	case <-ctx.Done():
	}
}
