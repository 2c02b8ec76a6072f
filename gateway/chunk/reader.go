package chunk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// errLate is a read that would fetch a chunk more than Grace after its
// index was read: the chunk may have been retired since.
var errLate = errors.New("chunk: the read took longer than the grace period of its chunks")

// Reader streams bytes [off, end) of a value stored in chunks, a chunk at
// a time: while its caller writes out one chunk's bytes it fetches the
// next, so it holds at most two chunks. Each chunk is checked against
// its index (length) and its checksum; one that is gone or does not
// match fails the read with ErrMissing, and none of its bytes is
// returned. Only the chunks the range covers are fetched. A Reader is
// used by one goroutine; Close must be called.
type Reader struct {
	v        *Values
	ctx      context.Context
	cancel   context.CancelFunc
	key      string
	base     string
	x        Index
	off, end int64
	next     int       // the chunk Next returns next
	last     int       // the range's last chunk
	deadline time.Time // no chunk is fetched after it
	ahead    chan fetched
	stop     chan struct{}
	done     chan struct{} // closed when the prefetcher has returned; nil if none started
	started  bool          // a chunk was asked for
	err      error         // what Next returns from now on
}

// fetched is a chunk the prefetcher fetched, or why it could not.
type fetched struct {
	b   []byte
	err error
}

// NewReader returns a Reader of bytes [off, end) of key's value, whose
// index x was read at read. 0 <= off < end <= x.Size, or the range is
// empty. It starts nothing until Next.
func (v *Values) NewReader(ctx context.Context, key string, x Index, read time.Time, off, end int64) *Reader {
	ctx, cancel := context.WithCancel(ctx)
	r := &Reader{
		v: v, ctx: ctx, cancel: cancel, key: key, base: keyBase(key, x.Version), x: x,
		off: off, end: end, next: -1, last: -1,
		// memcached counts expirations in whole seconds: a second less.
		deadline: read.Add(v.opts.Grace - time.Second),
	}
	if off < end {
		r.next, r.last = int(off/int64(x.ChunkSize)), int((end-1)/int64(x.ChunkSize))
	}
	return r
}

// Next returns the range's next bytes, the part of one chunk it covers,
// valid until the next call; io.EOF after the last. Any other error
// ends the read: ErrMissing, a failure to reach memcached, or the read
// passing the chunks' grace period.
func (r *Reader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.next < 0 || r.next > r.last {
		r.err = io.EOF
		return nil, r.err
	}
	r.started = true
	var f fetched
	switch {
	case r.done == nil:
		// The first chunk is fetched here: the caller decides what to
		// answer once it has it. The others come from the prefetcher.
		f.b, f.err = r.fetch(r.next)
		if f.err == nil && r.next < r.last {
			r.prefetch(r.next + 1)
		}
	default:
		f = <-r.ahead
	}
	if f.err != nil {
		r.err = f.err
		return nil, r.err
	}
	i := r.next
	r.next++
	start := int64(i) * int64(r.x.ChunkSize)
	lo, hi := max(r.off-start, 0), min(r.end-start, int64(len(f.b)))
	return f.b[lo:hi], nil
}

// prefetch fetches chunks from..last on a goroutine of its own, one
// ahead of Next: it waits to hand each over before fetching the next.
func (r *Reader) prefetch(from int) {
	r.ahead, r.stop, r.done = make(chan fetched), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.done)
		// A fetch that panicked fails the read, as a failed fetch does:
		// Next would otherwise wait for a chunk that never comes.
		panicked := false
		defer func() {
			if panicked {
				select {
				case r.ahead <- fetched{nil, fmt.Errorf("chunk: reading %q: %w", r.key, panicguard.ErrPanicked)}:
				case <-r.stop:
				}
			}
		}()
		defer r.v.panics.RecoverNoting(&panicked)
		for i := from; i <= r.last; i++ {
			b, err := r.fetch(i)
			select {
			case r.ahead <- fetched{b, err}:
			case <-r.stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
}

// fetch reads chunk i and checks it.
func (r *Reader) fetch(i int) ([]byte, error) {
	if time.Now().After(r.deadline) {
		return nil, errLate
	}
	// Admitted: the index's read was, on the same node; a chunk refused
	// at the node's share would cut the answer short after its headers.
	res := r.v.read(r.ctx, op.Op{Verb: op.Get, Item: op.Item{Key: r.base + strconv.Itoa(i)}, HashKey: r.key, Admitted: true, Bulk: true})
	switch {
	case errors.Is(res.Err, upstream.ErrNotFound):
		r.v.m.chunksMissing.Inc()
		return nil, fmt.Errorf("%w: chunk %d of %d of %q is gone", ErrMissing, i, r.x.Count(), r.key)
	case res.Err != nil:
		return nil, fmt.Errorf("chunk: reading chunk %d of %q: %w", i, r.key, res.Err)
	}
	b := res.Item.Value
	if len(b) != r.x.ChunkLen(i) || res.Item.Flags != checksum(b) {
		r.v.m.chunksMissing.Inc()
		return nil, fmt.Errorf("%w: chunk %d of %d of %q does not match its index", ErrMissing, i, r.x.Count(), r.key)
	}
	r.v.m.chunksRead.Inc()
	r.v.m.bytesRead.Add(float64(len(b)))
	return b, nil
}

// Close stops the read, waits for the prefetcher, and counts the read's
// outcome (memcgate_chunked_reads_total) if it fetched anything.
func (r *Reader) Close() {
	r.cancel()
	if r.done != nil {
		close(r.stop)
		<-r.done
	}
	switch {
	case !r.started:
	case r.err == io.EOF || r.err == nil && r.next > r.last:
		r.v.m.readComplete.Inc()
	case errors.Is(r.err, ErrMissing):
		r.v.m.readMissing.Inc()
	default:
		r.v.m.readAborted.Inc()
	}
}
