package route

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/memcgate/memcgate/upstream"
)

// writeOrder keeps a pool's writes of a key in order on each node.
// Under the first and majority policies a write is answered while some
// of its copies still run, and a caller that then writes the key again
// sends copies that can overtake them on their node: a copy whose
// goroutine has not run yet, or one held up on another of the node's
// connections. That node applies the older value last and keeps it,
// while the others hold the newer one, until the key is written again.
// So the copies of a write that may outlive its answer are recorded, per
// node and key, until their node is done with them, and any later copy
// of the key to that node waits for them first. A copy that fails on its
// replica may move on to a spare (writeOne), which may be one of the
// key's replicas for the next write (once that replica is ejected): so a
// write that records also records a place on each spare its copies may
// move to, reserved with the rest before any copy is sent, and a copy
// that moves takes the spare's place, which orders it there behind the
// key's earlier writes and before its later ones. A place left unused
// is given up once the write's last copy is done. A write records all of
// its places under one lock, so writes that record are sent to every
// node in the same order, and a copy waits only for places recorded
// before its own: no copy waits for itself or for a later write. Only a
// write that the background budget took records, at most 1+maxSpares
// places per target, so the budget bounds the places kept. A write that
// waits for all its copies before it is answered (the all policy, a full
// background budget, a CAS check) records nothing and only waits for
// those recorded: its caller cannot write again before every copy has
// landed. It must not be copied.
type writeOrder struct {
	n    atomic.Int64 // entries in last: while 0, a write takes no lock
	mu   sync.Mutex
	last map[copyKey]chan struct{} // guarded by mu; each node's latest recorded place of each key, closed once given up
}

// copyKey is one key on one node.
type copyKey struct{ node, key string }

// enter returns, for each node a write of key may send a copy to (its
// targets, then the spares reserved for it, all distinct), what a copy
// there waits for before it is sent: nil for nothing, and a nil slice
// when no copy waits. With record, it also records a place for each, and
// returns for each the channel to pass to answered once the node is done
// with the write; key must then be the write's own (ownKeys), as it
// outlives the caller's.
func (w *writeOrder) enter(key string, targets, spares []upstream.Replica, record bool) (prev, done []chan struct{}) {
	if !record && w.n.Load() == 0 {
		return nil, nil
	}
	n := len(targets) + len(spares)
	if record {
		done = make([]chan struct{}, n)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range n {
		r := nth(targets, spares, i)
		k := copyKey{r.Node(), key}
		if p := w.last[k]; p != nil {
			if prev == nil {
				prev = make([]chan struct{}, n)
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

// nth is the i-th of a followed by b.
func nth(a, b []upstream.Replica, i int) upstream.Replica {
	if i < len(a) {
		return a[i]
	}
	return b[i-len(a)]
}

// latest is what a copy of key to node that enter gave no place waits
// for (one of a write that records nothing, moved on to a spare): the
// latest place recorded there, nil for none.
func (w *writeOrder) latest(node, key string) chan struct{} {
	if w.n.Load() == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last[copyKey{node, key}]
}

// answered closes done, the place enter recorded for key's write on
// node, and forgets it unless a later write's took its place. The place
// must be given up only once the one before it (enter's prev) is, so
// that waiting for the latest place is waiting for every earlier one.
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
