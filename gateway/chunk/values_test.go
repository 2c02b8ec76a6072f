package chunk

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/storetest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// gateStore is a Store in memory whose writes of chunks wait for gate to
// close (or their context to end), counting how many wait at once.
type gateStore struct {
	gate     chan struct{}
	readGate chan struct{} // if not nil, reads of chunks wait for it too
	mu       sync.Mutex    // guards items, inflight, peak
	items    map[string]op.Item
	inflight int
	peak     int
}

func newGateStore() *gateStore {
	return &gateStore{gate: make(chan struct{}), items: map[string]op.Item{}}
}

func (s *gateStore) Do(ctx context.Context, o op.Op) op.Result {
	switch o.Verb {
	case op.Get:
		if s.readGate != nil && Reserved(o.Item.Key) {
			if err := s.wait(ctx, s.readGate); err != nil {
				return op.Result{Err: err}
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		it, ok := s.items[o.Item.Key]
		if !ok {
			return op.Result{Err: upstream.ErrNotFound}
		}
		return op.Result{Item: it}
	case op.Head:
		s.mu.Lock()
		defer s.mu.Unlock()
		it, ok := s.items[o.Item.Key]
		if !ok {
			return op.Result{Err: upstream.ErrNotFound}
		}
		n := len(it.Value)
		it.Value = nil
		return op.Result{Item: it, N: uint64(n)}
	case op.Delete:
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.items, o.Item.Key)
		return op.Result{}
	}
	if Reserved(o.Item.Key) {
		if err := s.wait(ctx, s.gate); err != nil {
			return op.Result{Err: err}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.items[o.Item.Key] = o.Item
	return op.Result{}
}

// wait counts an operation in flight until gate closes or ctx ends.
func (s *gateStore) wait(ctx context.Context, gate chan struct{}) error {
	s.mu.Lock()
	s.inflight++
	s.peak = max(s.peak, s.inflight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *gateStore) counts() (inflight, peak int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight, s.peak
}

// sliceSource yields b in chunks of size.
type sliceSource struct {
	b    []byte
	size int
}

func (s *sliceSource) Next() ([]byte, error) {
	n := min(s.size, len(s.b))
	c := s.b[:n]
	s.b = s.b[n:]
	if len(s.b) == 0 {
		return c, io.EOF
	}
	return c, nil
}

// TestPutMaxWrites: however many Puts run at once, at most MaxWrites
// chunks are on their way to memcached (each is copied into a
// connection's write buffer that no budget counts); a Put that cannot
// get a turn within Timeout fails, and stores nothing.
func TestPutMaxWrites(t *testing.T) {
	const chunkSize = 10
	tests := []struct {
		name      string
		maxWrites int
		puts      int
		release   bool // open the gate once all wait; else let Timeout pass
		want      int  // chunks in flight at most
	}{
		{name: "one at a time", maxWrites: 1, puts: 3, release: true, want: 1},
		{name: "four of eight", maxWrites: 4, puts: 8, release: true, want: 4},
		{name: "fewer Puts than turns", maxWrites: 4, puts: 2, release: true, want: 2},
		{name: "default", puts: 8, release: true, want: 4},
		{name: "no turn within Timeout", maxWrites: 1, puts: 2, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newGateStore()
				v := New(s, Options{ChunkSize: chunkSize, MaxWrites: tt.maxWrites, Timeout: time.Second}, prometheus.NewRegistry())
				errs := make([]error, tt.puts)
				var wg sync.WaitGroup
				for i := range tt.puts {
					wg.Go(func() {
						src := &sliceSource{b: []byte(strings.Repeat("v", 3*chunkSize)), size: chunkSize}
						errs[i] = v.Put(t.Context(), Put{Verb: op.Set, Key: "k" + strconv.Itoa(i)}, src)
					})
				}
				synctest.Wait() // every Put writes a chunk or waits for its turn
				if inflight, _ := s.counts(); inflight != tt.want {
					t.Errorf("%d chunks in flight with every Put started, want %d", inflight, tt.want)
				}
				if tt.release {
					close(s.gate)
				} else {
					time.Sleep(time.Second) // fake time: every chunk's Timeout passes
				}
				wg.Wait()
				if _, peak := s.counts(); peak != tt.want {
					t.Errorf("at most %d chunks in flight, want %d", peak, tt.want)
				}
				for i, err := range errs {
					switch {
					case tt.release && err != nil:
						t.Errorf("Put %d = %v, want stored", i, err)
					case !tt.release && !errors.Is(err, context.DeadlineExceeded):
						t.Errorf("Put %d = %v, want a deadline exceeded", i, err)
					}
				}
				if n := len(s.items); !tt.release && n != 0 {
					t.Errorf("%d items left after Puts that failed, want none (their chunks deleted, no index)", n)
				}
			})
		})
	}
}

// TestReaderMaxReads: however many Readers run at once, at most MaxReads
// chunks are being fetched (each reply is a whole chunk queued on a
// node's shared connection ahead of other clients' operations).
func TestReaderMaxReads(t *testing.T) {
	const chunkSize = 10
	tests := []struct {
		name     string
		maxReads int
		readers  int
		want     int // chunks being fetched at most
	}{
		{name: "one at a time", maxReads: 1, readers: 3, want: 1},
		{name: "four of eight", maxReads: 4, readers: 8, want: 4},
		{name: "fewer Readers than turns", maxReads: 4, readers: 2, want: 2},
		{name: "default", readers: 8, want: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newGateStore()
				close(s.gate)
				v := New(s, Options{ChunkSize: chunkSize, MaxReads: tt.maxReads, Timeout: time.Second}, prometheus.NewRegistry())
				value := strings.Repeat("v", 3*chunkSize)
				if err := v.Put(t.Context(), Put{Verb: op.Set, Key: "k"}, &sliceSource{b: []byte(value), size: chunkSize}); err != nil {
					t.Fatalf("Put: %v", err)
				}
				x, ok, err := Parse(s.items["k"])
				if !ok || err != nil {
					t.Fatalf("Parse(index) = %v, %v", ok, err)
				}
				s.readGate = make(chan struct{})
				got := make([]string, tt.readers)
				var wg sync.WaitGroup
				for i := range tt.readers {
					wg.Go(func() {
						b, err := readToEnd(v.NewReader(t.Context(), "k", x, time.Now(), 0, x.Size))
						if err != io.EOF {
							t.Errorf("reader %d: %v", i, err)
						}
						got[i] = string(b)
					})
				}
				synctest.Wait() // every Reader fetches a chunk or waits for its turn
				if inflight, _ := s.counts(); inflight != tt.want {
					t.Errorf("%d chunks being fetched with every Reader started, want %d", inflight, tt.want)
				}
				close(s.readGate)
				wg.Wait()
				if _, peak := s.counts(); peak != tt.want {
					t.Errorf("at most %d chunks fetched at once, want %d", peak, tt.want)
				}
				for i, b := range got {
					if b != value {
						t.Errorf("reader %d read %q, want %q", i, b, value)
					}
				}
			})
		})
	}
}

// roomStore answers reads as upstream's pipelined connections do: a value
// of op.LentValue bytes or more that the read's Room does not take is
// read and dropped (upstream.ErrNoFit), after memcached ran the command.
// It counts the value bytes it handed out.
type roomStore struct {
	*storetest.Store
	handed int
}

func (s *roomStore) Do(ctx context.Context, o op.Op) op.Result {
	res := s.Store.Do(ctx, o)
	if n := len(res.Item.Value); res.Err == nil && n >= op.LentValue && o.Room != nil && !o.Room.Reserve(n) {
		return op.Result{Err: upstream.ErrNoFit}
	}
	s.handed += len(res.Item.Value)
	return res
}

// TestLookKeepsNoPlainValue: a DELETE, touch, append or prepend of a
// plain 1 MB value reads the item only to learn whether it is an index,
// so it keeps none of the value, and still does what it was asked.
func TestLookKeepsNoPlainValue(t *testing.T) {
	big := strings.Repeat("v", 1<<20)
	tests := []struct {
		verb  op.Verb
		check func(it op.Item, found bool) bool
	}{
		{op.Delete, func(_ op.Item, found bool) bool { return !found }},
		{op.Touch, func(it op.Item, found bool) bool { return found && it.Expiration == 300 }},
		{op.Append, func(it op.Item, found bool) bool { return found && string(it.Value) == big+"!" }},
		{op.Prepend, func(it op.Item, found bool) bool { return found && string(it.Value) == "!"+big }},
	}
	for _, tt := range tests {
		t.Run(tt.verb.String(), func(t *testing.T) {
			s := &roomStore{Store: storetest.New()}
			s.Put(op.Item{Key: "k", Value: []byte(big)})
			v := New(s, Options{ChunkSize: 1 << 20}, prometheus.NewRegistry())
			o := op.Op{Verb: tt.verb, Item: op.Item{Key: "k", Expiration: 300}}
			if tt.verb.TakesValue() {
				o.Item.Value = []byte("!")
			}
			if res := v.Do(t.Context(), o); res.Err != nil {
				t.Fatalf("%v: %v", tt.verb, res.Err)
			}
			if s.handed != 0 {
				t.Errorf("%v read %d bytes of a plain value to learn it is not an index", tt.verb, s.handed)
			}
			s.Mu.Lock()
			it, found := s.Items["k"]
			s.Mu.Unlock()
			if !tt.check(it, found) {
				t.Errorf("after %v: %d bytes, expiration %d, found %v", tt.verb, len(it.Value), it.Expiration, found)
			}
		})
	}
}

// faultStore is a Store in memory that answers the verbs in fail with
// their error, unsent (only the first times of each, if times is not
// zero), and records every verb asked of it.
type faultStore struct {
	*storetest.Store
	fail   map[op.Verb]error
	times  int
	failed map[op.Verb]int
	verbs  []op.Verb
}

func (s *faultStore) Do(ctx context.Context, o op.Op) op.Result {
	s.verbs = append(s.verbs, o.Verb)
	if err := s.fail[o.Verb]; err != nil && (s.times == 0 || s.failed[o.Verb] < s.times) {
		if s.failed == nil {
			s.failed = make(map[op.Verb]int)
		}
		s.failed[o.Verb]++
		return op.Result{Err: err}
	}
	return s.Store.Do(ctx, o)
}

// TestAddTo: an append or prepend reads its item and is sent checked
// against the CAS read, again after each change for as long as
// Options.Timeout allows (more than three times: appenders of one key
// refuse each other), then fails with ErrChanging; it goes unchecked
// where no check can be sent (refused unsent twice, after a second
// check), and not at all when its item could not be read.
func TestAddTo(t *testing.T) {
	nodeDown := &upstream.NodeError{Node: "n", Op: "mg", Err: io.EOF}
	tests := []struct {
		name    string
		verb    op.Verb
		value   string
		fail    map[op.Verb]error
		times   int           // faultStore.times
		timeout time.Duration // Options.Timeout
		err     error
		verbs   []op.Verb // sent, in order
		want    string    // the value after
	}{
		{name: "append", verb: op.Append, value: "+", verbs: []op.Verb{op.Head, op.AppendCAS}, want: "abc+"},
		{name: "prepend", verb: op.Prepend, value: "+", verbs: []op.Verb{op.Head, op.PrependCAS}, want: "+abc"},
		{
			name: "changed before every try", verb: op.Append, value: "+", fail: map[op.Verb]error{op.AppendCAS: upstream.ErrCASConflict},
			timeout: time.Nanosecond, err: ErrChanging, verbs: []op.Verb{op.Head, op.AppendCAS}, want: "abc",
		},
		{
			name: "changed before the first five tries", verb: op.Append, value: "+", fail: map[op.Verb]error{op.AppendCAS: upstream.ErrCASConflict}, times: 5,
			verbs: slices.Repeat([]op.Verb{op.Head, op.AppendCAS}, 6), want: "abc+",
		},
		{
			name: "no meta set", verb: op.Append, value: "+", fail: map[op.Verb]error{op.AppendCAS: upstream.ErrNoMeta},
			verbs: []op.Verb{op.Head, op.AppendCAS, op.Head, op.AppendCAS, op.Append}, want: "abc+",
		},
		{
			// A connection dialled between the check and the append
			// (a chunk's) had the client forget the server's meta sets.
			name: "meta set refused once", verb: op.Append, value: "+", fail: map[op.Verb]error{op.AppendCAS: upstream.ErrNoMeta}, times: 1,
			verbs: []op.Verb{op.Head, op.AppendCAS, op.Head, op.AppendCAS}, want: "abc+",
		},
		{
			name: "read as too large to be an index", verb: op.Prepend, value: "+", fail: map[op.Verb]error{op.Head: upstream.ErrNoFit},
			verbs: []op.Verb{op.Head, op.Prepend}, want: "+abc",
		},
		{name: "more than a chunk", verb: op.Append, value: "0123456789+", verbs: []op.Verb{op.Append}, want: "abc0123456789+"},
		{
			name: "missing", verb: op.Append, value: "+", fail: map[op.Verb]error{op.Head: upstream.ErrNotFound}, err: upstream.ErrNotFound,
			verbs: []op.Verb{op.Head}, want: "abc",
		},
		{
			name: "not read", verb: op.Append, value: "+", fail: map[op.Verb]error{op.Head: nodeDown}, err: nodeDown,
			verbs: []op.Verb{op.Head}, want: "abc",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &faultStore{Store: storetest.New(), fail: tt.fail, times: tt.times}
			s.Put(op.Item{Key: "k", Value: []byte("abc")})
			v := New(s, Options{ChunkSize: 10, Timeout: tt.timeout}, prometheus.NewRegistry())
			res := v.Do(t.Context(), op.Op{Verb: tt.verb, Item: op.Item{Key: "k", Value: []byte(tt.value)}})
			if !errors.Is(res.Err, tt.err) || tt.err == nil && res.Err != nil {
				t.Errorf("Do(%v) = %v, want %v", tt.verb, res.Err, tt.err)
			}
			if !slices.Equal(s.verbs, tt.verbs) {
				t.Errorf("sent %v, want %v", s.verbs, tt.verbs)
			}
			if got := string(s.Items["k"].Value); got != tt.want {
				t.Errorf("value after = %q, want %q", got, tt.want)
			}
		})
	}
}

// admissionStore records, for every operation, its key and whether it
// was op.Op.Admitted.
type admissionStore struct {
	*storetest.Store
	mu  sync.Mutex
	ops []op.Op
}

func (s *admissionStore) Do(ctx context.Context, o op.Op) op.Result {
	s.mu.Lock()
	s.ops = append(s.ops, op.Op{Verb: o.Verb, Item: op.Item{Key: o.Item.Key}, Admitted: o.Admitted})
	s.mu.Unlock()
	return s.Store.Do(ctx, o)
}

// TestChunksAdmitted: a value in chunks is written, read, touched and
// deleted whole once its first operation on the node passed its share of
// request slots: every chunk operation after it, and the index written
// after the chunks, are op.Op.Admitted (they wait rather than be refused,
// which would cut a response short or leave chunks behind); the first
// is not.
func TestChunksAdmitted(t *testing.T) {
	const chunkSize = 1024
	s := &admissionStore{Store: storetest.New()}
	v := New(s, Options{ChunkSize: chunkSize, Timeout: time.Second}, prometheus.NewRegistry())
	if err := v.Put(t.Context(), Put{Verb: op.Set, Key: "k"}, &sliceSource{b: []byte(strings.Repeat("v", 3*chunkSize)), size: chunkSize}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	s.Mu.Lock()
	x, ok, err := Parse(s.Items["k"])
	s.Mu.Unlock()
	if !ok || err != nil {
		t.Fatalf("Parse(index) = %v, %v", ok, err)
	}
	rd := v.NewReader(t.Context(), "k", x, time.Now(), 0, x.Size)
	for {
		if _, err := rd.Next(); err != nil {
			break
		}
	}
	rd.Close()
	v.Do(t.Context(), op.Op{Verb: op.Touch, Item: op.Item{Key: "k", Expiration: 60}})
	v.Do(t.Context(), op.Op{Verb: op.Delete, Item: op.Item{Key: "k"}})
	chunkOps, firsts := 0, 0
	for i, o := range s.ops {
		switch {
		case Reserved(o.Item.Key):
			chunkOps++
			if !o.Admitted {
				t.Errorf("op %d, %v of chunk %s: not admitted", i, o.Verb, o.Item.Key)
			}
		case i == 0 && o.Admitted:
			t.Errorf("the put's first operation, %v of the index, is admitted: it must meet the share", o.Verb)
		case !o.Admitted:
			firsts++
		}
	}
	if chunkOps < 9 { // 3 written, 3 read, 3 touched, and the delete's
		t.Errorf("%d chunk operations, want 9 or more", chunkOps)
	}
	if firsts == 0 {
		t.Error("no operation met the share")
	}
}

// lostReplyStore applies every operation, but answers a write of an index
// (a write of an item with IndexFlags: set, cas or add) with err, as memcached does when its
// reply is lost: a timeout, or the connection broken after the request
// went out.
type lostReplyStore struct {
	*storetest.Store
	err error
}

func (s *lostReplyStore) Do(ctx context.Context, o op.Op) op.Result {
	res := s.Store.Do(ctx, o)
	if o.Verb.Writes() && o.Item.Flags == IndexFlags {
		return op.Result{Err: s.err}
	}
	return res
}

// TestPutIndexReplyLost: a Put whose index write fails in a way that
// does not say whether memcached stored it leaves its chunks: the index
// may name them, and deleting them would turn the key into a miss,
// neither the value it held nor the one written. A Put whose index
// memcached refused, or that never went out, deletes them.
func TestPutIndexReplyLost(t *testing.T) {
	const chunkSize = 1024
	tests := []struct {
		name string
		err  error
		kept bool
	}{
		{name: "timeout", err: &upstream.NodeError{Node: "n", Op: "set", Err: context.DeadlineExceeded}, kept: true},
		{name: "deadline", err: context.DeadlineExceeded, kept: true},
		{name: "server error", err: upstream.ErrServer},
		{name: "no nodes", err: upstream.ErrNoNodes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &lostReplyStore{Store: storetest.New(), err: tt.err}
			v := New(s, Options{ChunkSize: chunkSize, Timeout: time.Second}, prometheus.NewRegistry())
			value := []byte(strings.Repeat("v", 3*chunkSize+7))
			if err := v.Put(t.Context(), Put{Verb: op.Set, Key: "k"}, &sliceSource{b: value, size: chunkSize}); !errors.Is(err, tt.err) {
				t.Fatalf("Put = %v, want %v", err, tt.err)
			}
			s.Mu.Lock()
			x, _, err := Parse(s.Items["k"]) // stored although its write failed
			s.Mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			got, err := readToEnd(v.NewReader(t.Context(), "k", x, time.Now(), 0, x.Size))
			if kept := err == io.EOF && string(got) == string(value); kept != tt.kept {
				t.Errorf("read %d bytes (%v): chunks kept %v, want %v", len(got), err, kept, tt.kept)
			}
		})
	}
}

// TestPutEndedBeforeIndex: a Put whose context ends once its chunks are
// written sends no index and deletes the chunks.
func TestPutEndedBeforeIndex(t *testing.T) {
	const chunkSize = 1024
	s := storetest.New()
	v := New(s, Options{ChunkSize: chunkSize, Timeout: time.Second}, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(t.Context())
	src := &endingSource{sliceSource: sliceSource{b: []byte(strings.Repeat("v", 2*chunkSize)), size: chunkSize}, end: cancel}
	if err := v.Put(ctx, Put{Verb: op.Set, Key: "k"}, src); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put = %v, want context.Canceled", err)
	}
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if len(s.Items) != 0 {
		t.Errorf("%d items left, want none", len(s.Items))
	}
}

// endingSource is a sliceSource that calls end once it yields its last
// bytes.
type endingSource struct {
	sliceSource
	end func()
}

func (s *endingSource) Next() ([]byte, error) {
	b, err := s.sliceSource.Next()
	if err == io.EOF {
		s.end()
	}
	return b, err
}

// readToEnd reads r to its end and closes it: the bytes read, and the
// error that ended it (io.EOF for the whole value).
func readToEnd(r *Reader) ([]byte, error) {
	defer r.Close()
	var b []byte
	for {
		c, err := r.Next()
		b = append(b, c...)
		if err != nil {
			return b, err
		}
	}
}

// countingStore counts the checked appends its Store refused.
type countingStore struct {
	*storetest.Store
	sent, refused atomic.Int64
}

func (s *countingStore) Do(ctx context.Context, o op.Op) op.Result {
	res := s.Store.Do(ctx, o)
	if o.Verb == op.AppendCAS {
		s.sent.Add(1)
		if errors.Is(res.Err, upstream.ErrCASConflict) {
			s.refused.Add(1)
		}
	}
	return res
}

// TestAppendsOfAKeyTakeTurns: appends of one key through the same Values
// go one at a time, so none is refused for another's sake: n appends at
// once send n checked appends, not up to n(n+1)/2.
func TestAppendsOfAKeyTakeTurns(t *testing.T) {
	const n = 30
	s := &countingStore{Store: storetest.New()}
	s.Put(op.Item{Key: "k", Value: []byte("abc")})
	v := New(s, Options{ChunkSize: 10}, prometheus.NewRegistry())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			errs <- v.Do(t.Context(), op.Op{Verb: op.Append, Item: op.Item{Key: "k", Value: []byte("+")}}).Err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("append: %v", err)
		}
	}
	if got := len(s.Items["k"].Value); got != 3+n {
		t.Errorf("value of %d bytes after %d appends to 3, want %d", got, n, 3+n)
	}
	if sent, refused := s.sent.Load(), s.refused.Load(); sent != n || refused != 0 {
		t.Errorf("%d checked appends sent, %d refused; want %d and none", sent, refused, n)
	}
	if len(v.adding.m) != 0 {
		t.Errorf("%d keys' turns kept after the appends, want none", len(v.adding.m))
	}
}

// TestKeyTurns: a key's second taker waits for the first to give; one
// whose context ends stops waiting and leaves nothing behind.
func TestKeyTurns(t *testing.T) {
	var k keyTurns
	if err := k.take(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := k.take(t.Context(), "b"); err != nil {
		t.Fatalf("another key waited: %v", err)
	}
	k.give("b")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := k.take(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second take of a held key = %v, want it to wait until its context ends", err)
	}
	got := make(chan error, 1)
	go func() { got <- k.take(t.Context(), "a") }()
	select {
	case err := <-got:
		t.Fatalf("took a held key: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	k.give("a")
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	k.give("a")
	if len(k.m) != 0 {
		t.Errorf("%d keys kept with no taker, want none", len(k.m))
	}
}
