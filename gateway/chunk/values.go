package chunk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// Store runs one memcached operation (the gateway's Store, whose Do
// *route.Router and *upstream.Cluster implement).
type Store interface {
	Do(ctx context.Context, o op.Op) op.Result
}

// Options configures Values. Zero values take the defaults named on each
// field.
type Options struct {
	// ChunkSize is the length of the chunks Put writes: at most what one
	// memcached item holds with a key of MaxKeyLen (and the store's key
	// prefix). Required.
	ChunkSize int
	// Grace is how long chunks outlive the index that names them, after
	// it expires, is replaced or is deleted; a Reader fetches no chunk
	// later than Grace after its index was read. If zero, 60s.
	Grace time.Duration
	// Timeout bounds each memcached operation of Put, a Reader and the
	// clean-up of chunks (the gateway's request timeout, per chunk); if
	// zero, 2s.
	Timeout time.Duration
	// MaxWrites caps the chunks on their way to memcached at once, of
	// all Puts together: each is copied into a connection's write
	// buffer, which no byte budget counts, so that however many large
	// values arrive at once that copy stays a few chunks. A Put waits
	// for its turn within Timeout. If zero, 4.
	MaxWrites int
	// MaxReads caps the chunks being fetched from memcached at once, of
	// all Readers together: each reply is a whole chunk, queued on a
	// node's shared connection ahead of every operation sent after it,
	// so that however many large values are read at once the other
	// clients' operations wait behind a few chunks, not behind enough of
	// them to pass the socket timeout and get the node ejected. A Reader
	// waits for its turn within Timeout. If zero, 4.
	MaxReads int
	// Layout, if not nil, says where a key is placed, as a number that
	// changes when its placement may have (route.Router.Layout: reloads
	// of the servers or routes, and in a pool of one copy its nodes'
	// ejections and re-admissions). A Put whose key's number changed
	// between its first look at the key and its index stores no value
	// (ErrMoved): its chunks may have gone where its index does not,
	// and reads would find them missing. If nil, placement never
	// changes.
	Layout func(key string) uint64
	// Panics, if not nil, stops a panic of a Reader's prefetcher, which
	// fetches chunks on a goroutine of its own (where="chunk_read"): the
	// read fails. If nil, such a panic ends the process.
	Panics *panicguard.Guard
}

// Values reads and writes values in chunks through a Store. It is safe
// for concurrent use, and must not be copied.
type Values struct {
	store   Store
	opts    Options
	timeout atomic.Int64  // Options.Timeout, in nanoseconds (SetTimeout)
	writes  chan struct{} // a token per chunk on its way to memcached (MaxWrites)
	reads   chan struct{} // a token per chunk being fetched (MaxReads)
	adding  keyTurns      // appends and prepends of a key, one at a time (addTo)
	known   known         // keys last seen holding an index (overIndex)
	m       metrics
	panics  *panicguard.Site // Options.Panics's; nil: none
}

// New returns Values that work through s, with its metrics registered on
// reg.
func New(s Store, opts Options, reg prometheus.Registerer) *Values {
	if opts.Grace <= 0 {
		opts.Grace = 60 * time.Second
	}
	if opts.MaxWrites <= 0 {
		opts.MaxWrites = 4
	}
	if opts.MaxReads <= 0 {
		opts.MaxReads = 4
	}
	v := &Values{store: s, opts: opts, writes: make(chan struct{}, opts.MaxWrites), reads: make(chan struct{}, opts.MaxReads), m: newMetrics(reg)}
	v.known.seed = maphash.MakeSeed()
	v.panics = opts.Panics.Site("chunk_read")
	v.SetTimeout(opts.Timeout)
	return v
}

// SetTimeout changes Options.Timeout for the operations that follow.
func (v *Values) SetTimeout(d time.Duration) {
	if d <= 0 {
		d = 2 * time.Second
	}
	v.timeout.Store(int64(d))
}

// ChunkSize is Options.ChunkSize.
func (v *Values) ChunkSize() int { return v.opts.ChunkSize }

// grace is Grace in memcached's whole seconds, rounded up.
func (v *Values) grace() int32 {
	return int32((v.opts.Grace + time.Second - 1) / time.Second)
}

// do runs o with its own deadline (Options.Timeout) under ctx.
func (v *Values) do(ctx context.Context, o op.Op) op.Result {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(v.timeout.Load()))
	defer cancel()
	return v.store.Do(ctx, o)
}

// write stores a chunk, waiting for one of MaxWrites turns within the
// chunk's deadline.
func (v *Values) write(ctx context.Context, o op.Op) op.Result {
	return v.inTurn(ctx, v.writes, "write", o)
}

// read fetches a chunk, waiting for one of MaxReads turns within the
// chunk's deadline.
func (v *Values) read(ctx context.Context, o op.Op) op.Result {
	return v.inTurn(ctx, v.reads, "read", o)
}

// inTurn runs o once it holds a token of turns, all within one
// Options.Timeout.
func (v *Values) inTurn(ctx context.Context, turns chan struct{}, what string, o op.Op) op.Result {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(v.timeout.Load()))
	defer cancel()
	select {
	case turns <- struct{}{}:
	case <-ctx.Done():
		return op.Result{Err: fmt.Errorf("chunk: waiting to %s: %w", what, ctx.Err())}
	}
	defer func() { <-turns }()
	return v.store.Do(ctx, o)
}

// Do runs o as Store.Do does, but for the verbs that must see a value's
// chunks: Delete removes the index and retires its chunks (they expire
// Grace later), and DeleteCAS too once memcached deleted it (delete),
// Touch and GAT set the chunks' expiration too (Grace after the index's;
// a Touch to a time past retires them, as Delete does), and Append and
// Prepend refuse a chunked value with ErrChunked and are sent only to
// the item they found not to be one (addTo), or fail with ErrChanging. Each of these reads the item first (Touch as a
// GAT), since only the item says whether it is an index; such a read
// keeps no value that could not be one (peek). Set, Replace and CAS of a
// key these Values last saw holding an index retire the chunks of the
// index they replace (overIndex); of any other key they go as they are.
// Reads return an index as they find it: the caller streams it (Reader)
// or refuses it (ErrChunked).
func (v *Values) Do(ctx context.Context, o op.Op) op.Result {
	switch o.Verb {
	case op.Delete, op.DeleteCAS:
		return v.delete(ctx, o)
	case op.Touch:
		if past(o.Item.Expiration, time.Now().Unix()) {
			// The item goes at once, and a gat could not read it after:
			// touched as delete deletes, its chunks retired.
			return v.expireNow(ctx, o)
		}
		// Touched with mg … T, which answers the item's flags and size,
		// not its value; only an item whose flags and size are an
		// index's is read, with a gat, to touch its chunks too.
		h := o
		h.Verb, h.Room = op.HeadTouch, peek{}
		res := v.store.Do(ctx, h)
		switch {
		case errors.Is(res.Err, upstream.ErrNoFit):
			// A server without meta commands: read with a gat that
			// took no large value (peek), too large to be an index, a
			// plain value; touched as such (a read refused unsent
			// touched nothing).
			return v.store.Do(ctx, o)
		case res.Err == nil && res.Item.Flags == IndexFlags && res.N == uint64(indexLen):
			g := o
			g.Verb, g.Room = op.GAT, peek{}
			res = v.Do(ctx, g)
		}
		res.Item, res.N = op.Item{}, 0
		return res
	case op.GAT:
		res := v.store.Do(ctx, o)
		if x, ok, err := Parse(res.Item); res.Err == nil && ok && err == nil {
			v.known.add(o.Item.Key)
			exp, now := o.Item.Expiration, time.Now().Unix()
			if past(exp, now) { // the index expired at once: readers under way, this one too, keep theirs
				exp = v.grace()
			} else {
				exp = expiration(exp, v.grace(), now)
			}
			v.touchChunks(ctx, hashKey(o), x, exp, false, nil)
		}
		return res
	case op.Append, op.Prepend:
		return v.addTo(ctx, o)
	case op.Set, op.Replace, op.CAS:
		if v.known.has(o.Item.Key) {
			return v.overIndex(ctx, o)
		}
	}
	return v.store.Do(ctx, o)
}

// MayHoldIndex reports whether key's item was an index when these Values
// last wrote or read it: a small write of it must go through Do, which
// retires the chunks it replaces, rather than straight to the Store (or
// as a UDP datagram, which says nothing of what it replaced).
func (v *Values) MayHoldIndex(key string) bool { return v.known.has(key) }

// Saw records that key's item, just read, is an index.
func (v *Values) Saw(key string) { v.known.add(key) }

// overIndex runs o, a Set, Replace or CAS of a key last seen holding an
// index, and retires the chunks of the index it replaces: memcached's
// set says nothing of what it replaced, and with the default expiration
// (never) those chunks would stay until evicted. It reads the item's
// head first (peekIndex: the index itself only if the head is an
// index's), then writes o checked against it, as Put writes an index
// (0054): a Set or Replace goes as a CAS with the CAS read, and a refusal
// (another write landed between) reads the item again; after
// maxIndexTries refusals, or with no CAS to check, o goes unchecked and
// retires the index read last. A client's CAS is its own check: it
// replaces the index read only if it names that index's CAS. An item
// that is not an index, or none, is forgotten and o sent as it is.
func (v *Values) overIndex(ctx context.Context, o op.Op) op.Result {
	for try := 1; ; try++ {
		got := v.peekIndex(ctx, o)
		x, ok, perr := Parse(got.Item)
		switch {
		case errors.Is(got.Err, upstream.ErrNotFound), errors.Is(got.Err, upstream.ErrNoFit):
			// None, or (a node without meta commands) too large to be one.
			v.known.forget(o.Item.Key)
			return v.store.Do(ctx, o)
		case got.Err != nil:
			return op.Result{Err: got.Err}
		case !ok || perr != nil:
			v.known.forget(o.Item.Key)
			return v.store.Do(ctx, o)
		}
		w := o
		if o.Verb != op.CAS && try <= maxIndexTries && got.Item.CAS != 0 {
			w.Verb, w.Item.CAS, w.Item.CASNode = op.CAS, got.Item.CAS, got.Item.CASNode
		}
		res := v.store.Do(ctx, w)
		if w.Verb != o.Verb && replaced(res.Err) {
			v.m.indexRetries.Inc()
			continue
		}
		if res.Err == nil && (o.Verb != op.CAS || sameCAS(o.Item, got.Item)) {
			if o.Verb != op.CAS && try > maxIndexTries {
				v.m.indexUnchecked.Inc()
			}
			v.known.forget(o.Item.Key)
			v.retire(ctx, hashKey(o), x)
		}
		return res
	}
}

// addTo runs o, an Append or Prepend, unless its item is an index
// (ErrChunked). It reads the item (peekIndex) and sends o as
// op.AppendCAS or op.PrependCAS with the CAS read, which memcached
// refuses if the item changed since: a PUT in between may have written
// an index, which the bytes would corrupt (reads would answer it as
// ErrCorrupt until the key is written again). On a refusal it reads the
// item again and tries again, for as long as Options.Timeout from the
// first try allows, then fails with ErrChanging. Each refusal means
// another write of the key landed, so concurrent appends to one key all
// get through, one per round, as plain appends would: a fixed number of
// tries answered most of 50 concurrent appends to one small key 409. A
// missing item is ErrNotFound, as an append to it answers, with nothing
// sent: the append is taken as coming before whatever writes the key
// next.
//
// The appends of one key through these Values go one at a time
// (keyTurns): among themselves they would only refuse each other, one
// getting through per round, n(n+1)/2 reads and checked appends for n at
// once. So only writes from elsewhere (other gateways, PUTs, clients of
// memcached itself) make a check fail, and waiting for the turn counts
// against the same Options.Timeout.
//
// o goes unchecked, with the race it leaves, where the check cannot be
// made: a node that does not speak memcached 1.6.10's meta set or
// gomemcache's pool (upstream.ErrNoMeta twice in a row: a connection
// dialled since the check refuses it once, until the next mg), a node without mg whose value
// was read as too large to be an index (upstream.ErrNoFit: no CAS), and
// bytes of more than a chunk, which may not fit an item (an ms whose
// bytes memcached cannot allocate deletes the item; an append leaves it).
func (v *Values) addTo(ctx context.Context, o op.Op) op.Result {
	if len(o.Item.Value) > v.opts.ChunkSize {
		return v.store.Do(ctx, o)
	}
	checked := o
	checked.Verb = op.AppendCAS
	if o.Verb == op.Prepend {
		checked.Verb = op.PrependCAS
	}
	until := time.Now().Add(time.Duration(v.timeout.Load()))
	tctx, cancel := context.WithDeadline(ctx, until)
	err := v.adding.take(tctx, o.Item.Key)
	cancel()
	if err != nil {
		return op.Result{Err: fmt.Errorf("chunk: %s waited for the appends of the key before it: %w", o.Verb, ErrChanging)}
	}
	defer v.adding.give(o.Item.Key)
	recheck := false // the checked append was refused unsent once: check again
	for try := 0; try == 0 || recheck || time.Now().Before(until); try++ {
		if err := ctx.Err(); err != nil {
			return op.Result{Err: fmt.Errorf("chunk: %s refused %d times: %w", o.Verb, try, err)}
		}
		got := v.peekIndex(ctx, o)
		switch {
		case errors.Is(got.Err, upstream.ErrNoFit):
			return v.store.Do(ctx, o)
		case got.Err != nil:
			return op.Result{Err: got.Err}
		case IsIndex(got.Item.Flags, got.Item.Value):
			return op.Result{Err: ErrChunked}
		}
		checked.Item.CAS, checked.Item.CASNode = got.Item.CAS, got.Item.CASNode
		res := v.store.Do(ctx, checked)
		switch {
		case errors.Is(res.Err, upstream.ErrNoMeta) && !recheck:
			// A connection dialled since the check (a chunk's, a large
			// read's) makes the node's client forget that the server
			// speaks meta sets until its next mg: the check again
			// teaches it, unless the server cannot.
			recheck = true
			continue
		case errors.Is(res.Err, upstream.ErrNoMeta):
			return v.store.Do(ctx, o)
		case !errors.Is(res.Err, upstream.ErrCASConflict):
			return res
		}
		recheck = false
	}
	return op.Result{Err: ErrChanging}
}

// keyTurns lets one holder at a time have each key: a queue per key
// with holders or waiters, nothing kept for the others. The zero value
// is ready to use.
type keyTurns struct {
	mu sync.Mutex
	m  map[string]*keyTurn
}

// keyTurn is one key's turn: a token its holder keeps, and how many hold
// or wait for it.
type keyTurn struct {
	token chan struct{}
	users int
}

// take waits for key's turn, or returns ctx's error if ctx ends first
// (a free turn is taken even then). A successful take must be followed
// by give.
func (k *keyTurns) take(ctx context.Context, key string) error {
	k.mu.Lock()
	t := k.m[key]
	if t == nil {
		if k.m == nil {
			k.m = make(map[string]*keyTurn)
		}
		t = &keyTurn{token: make(chan struct{}, 1)}
		k.m[key] = t
	}
	t.users++
	k.mu.Unlock()
	select {
	case t.token <- struct{}{}: // free: taken whatever ctx says
		return nil
	default:
	}
	select {
	case t.token <- struct{}{}:
		return nil
	case <-ctx.Done():
		k.leave(key, t)
		return ctx.Err()
	}
}

// give ends the turn take gave for key.
func (k *keyTurns) give(key string) {
	k.mu.Lock()
	t := k.m[key]
	k.mu.Unlock()
	<-t.token
	k.leave(key, t)
}

// leave counts out one user of t, forgetting the key when none is left.
func (k *keyTurns) leave(key string, t *keyTurn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if t.users--; t.users == 0 {
		delete(k.m, key)
	}
}

// peek is the Room of a read that only asks whether an item is an index
// (indexLen bytes): it takes no value of op.LentValue bytes or more,
// which memcached's connection then reads and drops (upstream.ErrNoFit).
// Without it, with values in chunks on, every DELETE, touch, append and
// prepend of a 1 MB value read all of it outside the byte budget: a flood
// of 70-byte touches of one key kept the gateway's CPU busy reading it.
type peek struct{}

func (peek) Reserve(int) bool { return false }
func (peek) Fits(int) bool    { return false }
func (peek) Holds(int) int    { return 0 } // Reserve holds nothing
func (peek) Release(int)      {}
func (peek) Lend(n int) []byte {
	return make([]byte, 0, n) // never called: Reserve takes nothing
}

// peekIndex reads o's item only as far as it takes to tell whether it is
// an index: its flags and size (op.Head: memcached sends no value), and
// the item itself, an index's few dozen bytes, only when those are an
// index's. A value that is not one is never sent: a flood of 70-byte
// deletes or appends of a 1 MB value costs memcached a line each. The
// result's Err is the read's (upstream.ErrNotFound: no item); its Item
// has a Value only for an item that may be an index. Both reads are
// op.Op.Peek: a key only a warm-up pool holds is read from there but not
// copied into the cold pool, where the delete or write that follows
// would race the copy.
func (v *Values) peekIndex(ctx context.Context, o op.Op) op.Result {
	h := op.Op{Verb: op.Head, Item: op.Item{Key: o.Item.Key}, HashKey: o.HashKey, Room: peek{}, Queued: o.Queued, Peek: true}
	res := v.store.Do(ctx, h)
	if res.Err != nil || res.Item.Flags != IndexFlags || res.N != uint64(indexLen) {
		return res
	}
	h.Verb = op.Get
	res = v.store.Do(ctx, h)
	if res.Err == nil && IsIndex(res.Item.Flags, res.Item.Value) {
		v.known.add(o.Item.Key)
	}
	return res
}

// hashKey is the key o's value is placed by, and so its chunks.
func hashKey(o op.Op) string {
	if o.HashKey != "" {
		return o.HashKey
	}
	return o.Item.Key
}

// delete removes o's item and, if it is an index, retires its chunks.
// A delete_cas retires them only when memcached deleted the item (its
// CAS matched), and, when it names a CAS, only if the item read is the
// one it deleted (the same CAS): an index written in between, or read on
// another replica, keeps its chunks until they expire, rather than lose
// them under a reader of it.
// The delete is sent even when the read found no item: that miss may be
// the key's successor's, read while its owner is down, and only a write
// that passes over the owner has it record the key, to be deleted on the
// owner before its re-admission (upstream/stale.go); otherwise the owner
// would serve the deleted value again once back.
func (v *Values) delete(ctx context.Context, o op.Op) op.Result {
	got := v.peekIndex(ctx, o)
	res := v.store.Do(ctx, o)
	if res.Err == nil {
		v.known.forget(o.Item.Key)
	}
	same := o.Verb != op.DeleteCAS || o.Item.CAS == 0 || sameCAS(got.Item, o.Item)
	if x, ok, err := Parse(got.Item); res.Err == nil && same && ok && err == nil {
		v.retire(ctx, hashKey(o), x)
	}
	return res
}

// sameCAS reports whether a and b name one CAS value of one node: each
// node counts CAS values of its own (op.Item.CASNode: a replica, or the
// node a pool of one copy failed the key over to), and equal numbers from
// two nodes name two versions.
func sameCAS(a, b op.Item) bool { return a.CAS == b.CAS && a.CASNode == b.CASNode }

// past reports whether exp, memcached's expiration, is a time already
// past at now (Unix time): negative, or a Unix time not after now.
func past(exp int32, now int64) bool {
	return exp < 0 || exp > relativeMax && int64(exp) <= now
}

// expireNow touches o's item with o's expiration, one in the past, and,
// if it is an index, retires its chunks, as delete does: a touch that
// reads the item as it touches it would find nothing to read.
func (v *Values) expireNow(ctx context.Context, o op.Op) op.Result {
	got := v.peekIndex(ctx, o)
	// Sent on a miss too, as delete's delete is.
	res := v.store.Do(ctx, o)
	if res.Err == nil {
		v.known.forget(o.Item.Key)
	}
	if x, ok, err := Parse(got.Item); res.Err == nil && ok && err == nil {
		v.retire(ctx, hashKey(o), x)
	}
	return res
}

// retire lets the chunks of x, an index just replaced or deleted, expire
// Grace from now: readers that read x before may still be streaming it.
func (v *Values) retire(ctx context.Context, key string, x Index) {
	v.touchChunks(ctx, key, x, v.grace(), true, v.m.retired)
}

// touchChunks sets the expiration of x's chunks, counting them in
// counted if not nil; retire marks touches that let them go (Grace after
// their index was replaced or deleted: op.Op.Retire). It stops at the first chunk that is gone and at
// the first failure to reach memcached: the chunks after it keep the
// expiration they had (or LRU takes them). A value with a chunk gone is
// lost anyway, and an index that names chunks never written (corrupt,
// or written to memcached by hand with a count of up to MaxChunks) then
// costs one operation, not one per chunk it claims.
func (v *Values) touchChunks(ctx context.Context, key string, x Index, exp int32, retire bool, counted prometheus.Counter) {
	ctx = context.WithoutCancel(ctx) // also when the client has gone
	base := keyBase(key, x.Version)
	for i := range x.Count() {
		res := v.do(ctx, op.Op{Verb: op.Touch, Item: op.Item{Key: base + strconv.Itoa(i), Expiration: exp}, HashKey: key, Admitted: true, Retire: retire}) // as the index's operation was
		if res.Err != nil {
			return
		}
		if counted != nil {
			counted.Inc()
		}
	}
}

// Put is a value for Values.Put to store.
type Put struct {
	// Verb writes the index, and so says when the value is stored: Set
	// always; Add, Replace and CAS (with CAS) under memcached's
	// conditions on the key's item, whatever it holds.
	Verb       op.Verb
	Key        string
	Flags      uint32 // the value's flags (Index.Flags)
	Expiration int32  // the index's; its chunks expire Grace later
	CAS        uint64 // for CAS
	CASNode    uint32 // for CAS: the node that gave CAS out (op.Item.CASNode)
}

// Source yields a value one chunk at a time: each Next returns the next
// chunk, ChunkSize bytes but for the last, which may be shorter, and
// io.EOF (with or after the last bytes) at the end. A chunk's bytes need
// to stay valid only until the next call.
type Source interface {
	Next() ([]byte, error)
}

// Put stores the value src yields under p.Key: first its chunks, under
// keys of a new version, then its index, written with p.Verb. Until the
// index is written the key's previous item, chunked or not, stays
// whole; if anything fails before, the chunks written are deleted (those
// that cannot be stay until they expire or memcached evicts them; so do
// those of an index whose write got no reply, which may be in) and the
// error is returned: src's own, a memcached outcome (ErrExists,
// ErrNotFound or ErrCASConflict for a condition that failed, before any
// chunk is written if it fails then already), or a failure to reach
// memcached. A previous chunked value's chunks are retired once the new
// index is in: for a Set, those of the index it replaced, whatever was
// written in between (the index goes in checked against the item read,
// which is read again on a refusal: item.replacing).
func (v *Values) Put(ctx context.Context, p Put, src Source) (err error) {
	layout := v.layout(p.Key)
	cur, err := v.current(ctx, p)
	if err != nil {
		v.m.writeFailed.Inc()
		return err
	}
	x := Index{Version: rand.Uint64(), ChunkSize: v.opts.ChunkSize, Flags: p.Flags}
	for cur.index != nil && x.Version == cur.index.Version {
		x.Version = rand.Uint64()
	}
	base := keyBase(p.Key, x.Version)
	exp := expiration(p.Expiration, v.grace(), time.Now().Unix())
	written := 0
	var first time.Time // when the first chunk was written
	defer func() {
		if err != nil {
			v.m.writeFailed.Inc()
			v.cleanup(ctx, p.Key, base, written)
		}
	}()
	for {
		b, rerr := src.Next()
		if len(b) > 0 {
			switch {
			case written == MaxChunks:
				return fmt.Errorf("chunk: %q: more than %d chunks", p.Key, MaxChunks)
			case len(b) > x.ChunkSize || x.Size%int64(x.ChunkSize) != 0:
				return fmt.Errorf("chunk: %q: chunk %d of %d bytes after %d bytes in chunks of %d", p.Key, written, len(b), x.Size, x.ChunkSize)
			}
			c := op.Op{Verb: op.Set, Item: op.Item{Key: base + strconv.Itoa(written), Value: b, Flags: checksum(b), Expiration: exp}, HashKey: p.Key, Admitted: true, Bulk: true} // admitted as current's read was
			if res := v.write(ctx, c); res.Err != nil {
				return fmt.Errorf("chunk: writing chunk %d of %q: %w", written, p.Key, res.Err)
			}
			if written == 0 {
				first = time.Now()
			}
			written++
			x.Size += int64(len(b))
			v.m.chunksWritten.Inc()
			v.m.bytesWritten.Add(float64(len(b)))
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if err := v.refresh(ctx, p, base, written, first); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// Ended before the index went out: it is certainly not in, and
		// the chunks can go (below, an error of ctx may come after).
		return fmt.Errorf("chunk: before writing the index of %q: %w", p.Key, err)
	}
	if v.layout(p.Key) != layout {
		// Some chunks may be where the key was placed before a reload
		// or a node's ejection, and the index would go where it is
		// placed now: a value no read could find whole. Nothing is
		// stored; the chunks go (those placed before expire).
		return fmt.Errorf("chunk: before writing the index of %q: %w", p.Key, ErrMoved)
	}
	idx := op.Op{Verb: p.Verb, Item: op.Item{Key: p.Key, Value: x.Encode(), Flags: IndexFlags, Expiration: p.Expiration, CAS: p.CAS, CASNode: p.CASNode}, Admitted: true}
	try := 1
	for ; ; try++ {
		if p.Verb == op.Set {
			idx.Verb, idx.Item.CAS, idx.Item.CASNode = cur.replacing(try)
		}
		res := v.do(ctx, idx)
		if res.Err == nil {
			break
		}
		if p.Verb == op.Set && idx.Verb != op.Set && replaced(res.Err) {
			// Another write of the key came between: its item, not the
			// one read, is what this index replaces.
			v.m.indexRetries.Inc()
			if cur, err = v.current(ctx, p); err != nil {
				return err
			}
			continue
		}
		if mayBeStored(res.Err) {
			// The index may be in and name the chunks: they are left
			// to expire with it, not deleted under it.
			written = 0
		}
		return res.Err
	}
	if v.layout(p.Key) != layout {
		// The placement changed while the index was on its way: it may
		// be in, under either placement, and name chunks under the other. The
		// chunks are left to expire with it, and the client told that
		// the value may not be stored.
		written = 0
		return fmt.Errorf("chunk: writing the index of %q: %w", p.Key, ErrMoved)
	}
	v.m.writeStored.Inc()
	v.known.add(p.Key)
	if p.Verb == op.Set && try > maxIndexTries {
		v.m.indexUnchecked.Inc()
	}
	if cur.index != nil && cur.index.Version != x.Version {
		v.retire(ctx, p.Key, *cur.index)
	}
	return nil
}

// layout is Options.Layout's number for key now (0 without one).
func (v *Values) layout(key string) uint64 {
	if v.opts.Layout == nil {
		return 0
	}
	return v.opts.Layout(key)
}

// maxIndexTries is how many times Put writes the index of a plain Set
// checked against the item it read (cas, or add where there was none)
// before it writes it unchecked: each refusal means another write of the
// key landed in between, and the Set must win all the same.
const maxIndexTries = 8

// item is what current read of a key's item before a Put.
type item struct {
	found bool
	cas   uint64 // the item's CAS value, if found (0: none was given)
	node  uint32 // the node that gave cas out (op.Item.CASNode)
	index *Index // the item, if it is an index
}

// replacing is how the index of a plain Set goes in on its try'th try
// (from 1) over it: checked against it, so that the index it replaces,
// whose chunks the Put retires, is the one read (cas; add if there was
// none), or, after maxIndexTries refusals or without a CAS value to
// check, unchecked (set).
func (it item) replacing(try int) (op.Verb, uint64, uint32) {
	switch {
	case try > maxIndexTries:
		return op.Set, 0, 0
	case !it.found:
		return op.Add, 0, 0
	case it.cas != 0:
		return op.CAS, it.cas, it.node
	}
	return op.Set, 0, 0
}

// replaced reports whether err, the answer to an index written checked
// (replacing), says the key's item is no longer the one read: changed
// (cas), gone (cas) or written (add).
func replaced(err error) bool {
	return errors.Is(err, upstream.ErrCASConflict) || errors.Is(err, upstream.ErrNotFound) || errors.Is(err, upstream.ErrExists)
}

// refresh sets the expiration of the n chunks under base, written since
// first, to p's as of now, when a relative expiration counted from when
// they were written would end a second or more before the index's (plus
// Grace), which counts from when it is written: a body that took longer
// than Grace to arrive would otherwise lose its first chunks while its
// index still names them. It runs before the index is written, so no
// reader or touch can see the chunks yet. A chunk that cannot be touched
// (gone, or memcached failing) fails the Put.
func (v *Values) refresh(ctx context.Context, p Put, base string, n int, first time.Time) error {
	if n == 0 || p.Expiration <= 0 || p.Expiration > relativeMax || time.Since(first) < time.Second {
		return nil // never, at once, or a Unix time: the same for chunks and index
	}
	exp := expiration(p.Expiration, v.grace(), time.Now().Unix())
	for i := range n {
		res := v.do(ctx, op.Op{Verb: op.Touch, Item: op.Item{Key: base + strconv.Itoa(i), Expiration: exp}, HashKey: p.Key, Admitted: true})
		if res.Err != nil {
			return fmt.Errorf("chunk: touching chunk %d of %q: %w", i, p.Key, res.Err)
		}
	}
	return nil
}

// mayBeStored reports whether a write that failed with err may have been
// applied all the same: memcached's reply did not come (a timeout, a
// connection broken after the request went out), rather than an answer
// (a condition that failed, an error line) or a failure before anything
// was sent.
func mayBeStored(err error) bool {
	var ne *upstream.NodeError
	if errors.As(err, &ne) {
		return !ne.Dial()
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// current reads p.Key's item before a Put: whether p's condition
// already fails (then nothing is written), and what its index replaces.
func (v *Values) current(ctx context.Context, p Put) (item, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(v.timeout.Load()))
	defer cancel()
	// Only as far as it takes to tell an index (its CAS comes with the
	// head): the value a big PUT replaces, up to MAX_VALUE_BYTES, was read
	// whole outside the byte budget, once for every PUT.
	res := v.peekIndex(ctx, op.Op{Item: op.Item{Key: p.Key}})
	if errors.Is(res.Err, upstream.ErrNoFit) {
		// A node without meta commands sends a large value whole or not
		// at all: read it, as such a node can only be read.
		res = v.store.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: p.Key}})
	}
	found := res.Err == nil
	switch {
	case errors.Is(res.Err, upstream.ErrNotFound):
	case res.Err != nil:
		return item{}, res.Err
	case p.Verb == op.Add:
		return item{}, upstream.ErrExists
	case p.Verb == op.CAS && res.Item.CASNode == p.CASNode && res.Item.CAS != p.CAS:
		// A CAS value another replica gave out is checked there, by
		// the index's write.
		return item{}, upstream.ErrCASConflict
	}
	if !found && (p.Verb == op.Replace || p.Verb == op.CAS) {
		return item{}, upstream.ErrNotFound
	}
	it := item{found: found, cas: res.Item.CAS, node: res.Item.CASNode}
	if x, ok, err := Parse(res.Item); found && ok && err == nil {
		it.index = &x
	}
	return it, nil
}

// cleanup deletes the n chunks under base of a value whose index was not
// written. It stops at the first failure to reach memcached: the rest
// expire with the value's expiration, or memcached evicts them.
func (v *Values) cleanup(ctx context.Context, key, base string, n int) {
	ctx = context.WithoutCancel(ctx)
	for i := range n {
		res := v.do(ctx, op.Op{Verb: op.Delete, Item: op.Item{Key: base + strconv.Itoa(i)}, HashKey: key, Admitted: true})
		if res.Err != nil && !errors.Is(res.Err, upstream.ErrNotFound) {
			return
		}
		v.m.cleaned.Inc()
	}
}

// Drop deletes it, key's index, if it is still the item read (the same
// index, and its CAS): the value is lost (ErrMissing), and the next
// reader gets a miss at once. It writes the index back with a CAS and an
// expiration in the past, memcached's conditional delete; its chunks are
// retired. The item there now is read first (peekIndex) and must be the
// same index, byte for byte (its version is drawn at random): a CAS value
// is one node's count, and once the key is placed on another node (a
// reload, a failover), where its chunks are missing, a newer item there
// can have the very CAS read on the first; the CAS alone would delete
// that value.
// On a replicated pool the other replicas are let go of the index only
// where each still holds it, checked there (op.Op.CopiesIfSame): a
// newer version a write put on one of them after the read stays.
func (v *Values) Drop(ctx context.Context, key string, it op.Item) {
	ctx = context.WithoutCancel(ctx)
	pctx, cancel := context.WithTimeout(ctx, time.Duration(v.timeout.Load()))
	now := v.peekIndex(pctx, op.Op{Item: op.Item{Key: key}})
	cancel()
	if now.Err != nil || !bytes.Equal(now.Item.Value, it.Value) {
		return
	}
	it.Key, it.Expiration = key, -1
	if res := v.do(ctx, op.Op{Verb: op.CAS, Item: it, CopiesIfSame: true}); res.Err != nil {
		return
	}
	v.known.forget(key)
	if x, ok, err := Parse(it); ok && err == nil {
		v.retire(ctx, key, x)
	}
}

// metrics count what Values does; see newMetrics for their meaning.
type metrics struct {
	writeStored, writeFailed                 prometheus.Counter
	readComplete, readMissing, readAborted   prometheus.Counter
	chunksWritten, chunksRead, chunksMissing prometheus.Counter
	retired, cleaned                         prometheus.Counter
	bytesWritten, bytesRead                  prometheus.Counter
	indexRetries, indexUnchecked             prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_chunked_writes_total",
		Help: "Values written in chunks (MEMCGATE_BIG_VALUE_MAX_BYTES), by result: stored (the index is in), failed (nothing changed; the chunks written were deleted).",
	}, []string{"result"})
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_chunked_reads_total",
		Help: "Reads of values stored in chunks (whole or a range) that fetched chunks, by result: complete, missing (a chunk was gone: the value was lost and its index dropped), aborted (the client went away, memcached failed, or the read passed its grace period).",
	}, []string{"result"})
	chunks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_chunks_total",
		Help: "Chunks by event: written, read, missing (gone or damaged when read), retired (set to expire after the grace period when their index was replaced or deleted), cleaned (deleted after a write that failed).",
	}, []string{"event"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_chunked_bytes_total",
		Help: "Bytes of values stored in chunks, by direction: written (to memcached), read (from memcached).",
	}, []string{"direction"})
	retries := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_chunked_index_retries_total",
		Help: "Writes checked against the index they replace (the index of an unconditional PUT in chunks, or a small value written over a value in chunks) that memcached refused because another write of the key landed since it was read: the item was read again and the write tried again.",
	})
	unchecked := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_chunked_index_unchecked_total",
		Help: "Writes checked against the index they replace (as in memcgate_chunked_index_retries_total) written with a plain set after 8 refusals in a row (more writers of one key at once than that): the chunks of an index replaced in between are left to their expiration and memcached's LRU.",
	})
	reg.MustRegister(writes, reads, chunks, bytes, retries, unchecked)
	return metrics{
		indexRetries: retries, indexUnchecked: unchecked,
		writeStored: writes.WithLabelValues("stored"), writeFailed: writes.WithLabelValues("failed"),
		readComplete: reads.WithLabelValues("complete"), readMissing: reads.WithLabelValues("missing"), readAborted: reads.WithLabelValues("aborted"),
		chunksWritten: chunks.WithLabelValues("written"), chunksRead: chunks.WithLabelValues("read"), chunksMissing: chunks.WithLabelValues("missing"),
		retired: chunks.WithLabelValues("retired"), cleaned: chunks.WithLabelValues("cleaned"),
		bytesWritten: bytes.WithLabelValues("written"), bytesRead: bytes.WithLabelValues("read"),
	}
}
