package chunk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/gateway/storetest"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// raceChunk is the chunk size of the tests against memcached: values of a
// few chunks, each well under memcached's item size.
const raceChunk = 64 << 10

// realValues returns Values working through a cluster of one real
// memcached, with the store wrapped by wrap (if not nil), and the
// memcached's address.
func realValues(t *testing.T, wrap func(Store) Store) (*Values, Store, string) {
	t.Helper()
	mc := memcachedtest.Start(t)
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 2, Timeout: 5 * time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var s Store = c
	if wrap != nil {
		s = wrap(c)
	}
	return New(s, Options{ChunkSize: raceChunk, Grace: time.Hour, Timeout: 5 * time.Second}, prometheus.NewRegistry()), c, mc.Addr
}

// bigValue is n chunks and a half of bytes that tell seed's value apart.
func bigValue(n int, seed byte) []byte {
	b := make([]byte, n*raceChunk+raceChunk/2)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

// put stores b under key with an unconditional Set.
func put(ctx context.Context, v *Values, key string, b []byte) error {
	return v.Put(ctx, Put{Verb: op.Set, Key: key}, &sliceSource{b: b, size: raceChunk})
}

// holdIndex is a Store that, once armed, holds the next write of an
// index (a write of a key that is not a chunk's) until release closes,
// closing held when it is there.
type holdIndex struct {
	Store
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (s *holdIndex) Do(ctx context.Context, o op.Op) op.Result {
	if o.Verb.Writes() && !Reserved(o.Item.Key) && s.armed.CompareAndSwap(true, false) {
		close(s.held)
		<-s.release
	}
	return s.Store.Do(ctx, o)
}

// TestConcurrentPutsRetireWhatTheyReplace: two Sets of one chunked key
// read the same index before either writes its own; the first to write
// its index is replaced by the second, and its chunks must be retired
// like the first value's, not left in memcached without an expiration
// (before, both retired the index they had read, and the chunks of the
// index replaced in between stayed until evicted).
func TestConcurrentPutsRetireWhatTheyReplace(t *testing.T) {
	var hold *holdIndex
	v, s, addr := realValues(t, func(s Store) Store {
		hold = &holdIndex{Store: s, held: make(chan struct{}), release: make(chan struct{})}
		return hold
	})
	ctx := t.Context()
	const key = "big"
	if err := put(ctx, v, key, bigValue(3, 0)); err != nil {
		t.Fatal(err)
	}
	hold.armed.Store(true) // the next index written, A's, waits
	a, b := bigValue(3, 1), bigValue(2, 2)
	doneA := make(chan error, 1)
	go func() { doneA <- put(ctx, v, key, a) }()
	<-hold.held // A has read the first index and written its chunks
	if err := put(ctx, v, key, b); err != nil {
		t.Fatalf("B: %v", err)
	}
	close(hold.release)
	if err := <-doneA; err != nil {
		t.Fatalf("A: %v", err)
	}
	checkOneLive(t, ctx, v, s, addr, key, [][]byte{a})
}

// TestConcurrentPuts: however many Sets of one chunked key run at once,
// the key ends with one of their values, whole, and the chunks of every
// other version (and of the value before) retired.
func TestConcurrentPuts(t *testing.T) {
	for _, writers := range []int{2, 8} {
		t.Run(strconv.Itoa(writers), func(t *testing.T) {
			v, s, addr := realValues(t, nil)
			ctx := t.Context()
			const key = "big"
			if err := put(ctx, v, key, bigValue(2, 0)); err != nil {
				t.Fatal(err)
			}
			values := make([][]byte, writers)
			for i := range values {
				values[i] = bigValue(1+i%3, byte(i+1))
			}
			for round := range 3 {
				var wg sync.WaitGroup
				start := make(chan struct{})
				errs := make([]error, writers)
				for i := range writers {
					wg.Go(func() {
						<-start
						errs[i] = put(ctx, v, key, values[i])
					})
				}
				close(start)
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("round %d, writer %d: %v", round, i, err)
					}
				}
				checkOneLive(t, ctx, v, s, addr, key, values)
			}
		})
	}
}

// checkOneLive checks that key holds an index whose value, read whole, is
// one of want; that all of its chunks are in memcached without an
// expiration; and that every other chunk memcached holds has one (it was
// retired).
func checkOneLive(t *testing.T, ctx context.Context, v *Values, s Store, addr, key string, want [][]byte) {
	t.Helper()
	res := s.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}})
	x, ok, err := Parse(res.Item)
	if res.Err != nil || !ok || err != nil {
		t.Fatalf("index of %q: %v, ok %v, %v", key, res.Err, ok, err)
	}
	got, err := readToEnd(v.NewReader(ctx, key, x, time.Now(), 0, x.Size))
	if err != io.EOF {
		t.Fatalf("reading %q: %v", key, err)
	}
	found := false
	for _, w := range want {
		found = found || bytes.Equal(got, w)
	}
	if !found {
		t.Fatalf("%q holds %d bytes that are none of the values written", key, len(got))
	}
	live := keyBase(key, x.Version)
	exps, err := chunkExpirations(addr)
	if err != nil {
		t.Fatal(err)
	}
	liveChunks := 0
	for k, exp := range exps {
		switch {
		case strings.HasPrefix(k, live):
			liveChunks++
			if exp != -1 {
				t.Errorf("chunk %q of the live value expires at %d, want never", k, exp)
			}
		case exp == -1:
			t.Errorf("chunk %q of a value replaced never expires: orphaned", k)
		}
	}
	if liveChunks != x.Count() {
		t.Errorf("%d chunks of the live value in memcached, want %d", liveChunks, x.Count())
	}
}

// chunkExpirations lists the chunks memcached at addr holds, with their
// expiration (-1: never), as lru_crawler metadump reports them.
func chunkExpirations(addr string) (map[string]int64, error) {
	for {
		exps, busy, err := metadump(addr)
		if !busy {
			return exps, err
		}
		time.Sleep(10 * time.Millisecond) // the crawler is still on a dump before
	}
}

func metadump(addr string) (exps map[string]int64, busy bool, err error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("lru_crawler metadump all\r\n")); err != nil {
		return nil, false, err
	}
	exps = map[string]int64{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		switch {
		case line == "END":
			return exps, false, nil
		case strings.HasPrefix(line, "BUSY"):
			return nil, true, nil
		}
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			k, val, _ := strings.Cut(kv, "=")
			f[k] = val
		}
		key, err := url.QueryUnescape(f["key"])
		if err != nil {
			return nil, false, fmt.Errorf("metadump line %q: %w", line, err)
		}
		if !Reserved(key) {
			continue
		}
		exp, err := strconv.ParseInt(f["exp"], 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("metadump line %q: %w", line, err)
		}
		exps[key] = exp
	}
	return nil, false, fmt.Errorf("metadump from %s: %v", addr, sc.Err())
}

// interloper is a Store in memory that, before each of the first n
// writes of an index (of a small value, if small), writes the key itself
// (as another gateway would): a value in chunks of its own version (one
// chunk), or, if deletes, a delete of the key every other time. It
// records the verbs of the writes it watches.
type interloper struct {
	*storetest.Store
	n       int
	deletes bool
	small   bool // the writes watched are those of small values, not of indexes
	writes  int
	verbs   []op.Verb
	last    uint64 // the version of the last index it wrote
}

func (s *interloper) Do(ctx context.Context, o op.Op) op.Result {
	if o.Verb.Writes() && (o.Item.Flags == IndexFlags) != s.small && !Reserved(o.Item.Key) {
		s.verbs = append(s.verbs, o.Verb)
		if s.writes < s.n {
			s.writes++
			if s.deletes && s.writes%2 == 0 {
				s.Store.Do(ctx, op.Op{Verb: op.Delete, Item: op.Item{Key: o.Item.Key}})
			} else {
				s.last = uint64(1000 + s.writes)
				x := Index{Version: s.last, Size: 10, ChunkSize: raceChunk}
				s.Store.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: Key(o.Item.Key, s.last, 0), Value: make([]byte, 10)}})
				s.Store.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: o.Item.Key, Value: x.Encode(), Flags: IndexFlags}})
			}
		}
	}
	return s.Store.Do(ctx, o)
}

// TestPutIndexTries: the index of a plain Set goes in checked against the
// item read (cas, or add where there was none); each time another write
// of the key came between, the item is read again and the index written
// against it, and the chunks retired are those of the index it replaced.
// After maxIndexTries refusals the index is written unchecked, as the
// client's unconditional PUT asks. Conditional Puts are checked once, by
// the verb asked for. The refusals tried again, and the unchecked
// writes, are counted.
func TestPutIndexTries(t *testing.T) {
	const key = "k"
	tries := func(n int, last op.Verb) []op.Verb {
		v := make([]op.Verb, n)
		for i := range v {
			v[i] = op.CAS
		}
		v[n-1] = last
		return v
	}
	tests := []struct {
		name        string
		verb        op.Verb
		before      bool // a value in chunks is there before the Put
		interlopers int
		deletes     bool
		want        []op.Verb
		wantErr     error
	}{
		{name: "set over nothing", verb: op.Set, want: []op.Verb{op.Add}},
		{name: "set over a value", verb: op.Set, before: true, want: []op.Verb{op.CAS}},
		{name: "add refused, then cas", verb: op.Set, interlopers: 1, want: []op.Verb{op.Add, op.CAS}},
		{name: "cas refused once", verb: op.Set, before: true, interlopers: 1, want: []op.Verb{op.CAS, op.CAS}},
		{name: "deleted between", verb: op.Set, before: true, interlopers: 2, deletes: true, want: []op.Verb{op.CAS, op.CAS, op.Add}},
		{name: "refused 7 times", verb: op.Set, before: true, interlopers: 7, want: tries(8, op.CAS)},
		{name: "refused 8 times: unchecked", verb: op.Set, before: true, interlopers: 8, want: tries(9, op.Set)},
		{name: "if-match", verb: op.CAS, before: true, interlopers: 1, want: []op.Verb{op.CAS}, wantErr: upstream.ErrCASConflict},
		{name: "if-none-match", verb: op.Add, interlopers: 1, want: []op.Verb{op.Add}, wantErr: upstream.ErrExists},
		{name: "replace, deleted between", verb: op.Replace, before: true, interlopers: 2, deletes: true, want: []op.Verb{op.Replace}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &interloper{Store: storetest.New(), deletes: tt.deletes}
			v := New(s, Options{ChunkSize: raceChunk, Timeout: time.Second}, prometheus.NewRegistry())
			ctx := t.Context()
			if tt.before {
				if err := put(ctx, v, key, bigValue(1, 0)); err != nil {
					t.Fatal(err)
				}
			}
			s.verbs, s.n = nil, tt.interlopers
			p := Put{Verb: tt.verb, Key: key}
			if tt.verb == op.CAS {
				p.CAS = s.Items[key].CAS
			}
			value := bigValue(2, 1)
			err := v.Put(ctx, p, &sliceSource{b: value, size: raceChunk})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Put = %v, want %v", err, tt.wantErr)
			}
			if !slices.Equal(s.verbs, tt.want) {
				t.Errorf("index written with %v, want %v", s.verbs, tt.want)
			}
			wantRetries, wantUnchecked := 0, 0
			if tt.wantErr == nil {
				wantRetries = len(tt.want) - 1
				if len(tt.want) > maxIndexTries {
					wantUnchecked = 1
				}
			}
			if got := testutil.ToFloat64(v.m.indexRetries); got != float64(wantRetries) {
				t.Errorf("memcgate_chunked_index_retries_total = %v, want %d", got, wantRetries)
			}
			if got := testutil.ToFloat64(v.m.indexUnchecked); got != float64(wantUnchecked) {
				t.Errorf("memcgate_chunked_index_unchecked_total = %v, want %d", got, wantUnchecked)
			}
			if err != nil {
				return
			}
			x, ok, perr := Parse(s.Items[key])
			if !ok || perr != nil || x.Size != int64(len(value)) {
				t.Fatalf("index after the Put: %+v, %v, %v", x, ok, perr)
			}
			if s.last != 0 && !tt.deletes {
				// The index replaced was the last interloper's: its chunk is retired.
				if got := s.Items[Key(key, s.last, 0)].Expiration; got != v.grace() {
					t.Errorf("chunk of the index replaced expires at %d, want %d (retired)", got, v.grace())
				}
			}
		})
	}
}

// TestPutReadsNoReplacedValue: a big PUT over a key holding a plain
// value of up to MAX_VALUE_BYTES asks memcached only for the item's head
// (its flags, size and CAS) to tell it is no index, not for the value:
// it was read whole, outside the byte budget, once for every such PUT.
// memcached's bytes_written (what it sent) grows by the replies' lines,
// not by the megabyte, and the index still replaces the value checked
// against its CAS.
func TestPutReadsNoReplacedValue(t *testing.T) {
	v, s, addr := realValues(t, nil)
	ctx := t.Context()
	plain := bytes.Repeat([]byte("p"), 1000000)
	if res := s.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "k", Value: plain}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	sent := func() int {
		st, err := memcachedtest.Stats(addr)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(st["bytes_written"])
		return n
	}
	before := sent()
	b := bigValue(3, 7)
	if err := put(ctx, v, "k", b); err != nil {
		t.Fatal(err)
	}
	if d := sent() - before; d > 16<<10 {
		t.Errorf("memcached sent %d bytes for a big PUT over a 1 MB plain value: the value was read", d)
	}
	got := v.peekIndex(ctx, op.Op{Item: op.Item{Key: "k"}})
	if got.Err != nil || !IsIndex(got.Item.Flags, got.Item.Value) {
		t.Fatalf("after the PUT the key holds %v (flags %d): want an index", got.Err, got.Item.Flags)
	}
}

// TestSmallWritesRetireWhatTheyReplace: a small value written over a
// value in chunks (Set, Replace, or CAS with the index's CAS), by these
// Values or by Values that only read the index, retires the chunks of the
// index it replaced: memcached's set says nothing of what it replaced,
// and with the default expiration the chunks stayed until evicted. A CAS
// that does not name the index's CAS changes nothing. A small write of a
// key never seen holding an index costs no read (memcached's cmd_get and
// cmd_touch do not move).
func TestSmallWritesRetireWhatTheyReplace(t *testing.T) {
	tests := []struct {
		name    string
		verb    op.Verb
		badCAS  bool // a CAS other than the index's
		reader  bool // written by Values that only read the index
		retired bool
	}{
		{name: "set", verb: op.Set, retired: true},
		{name: "replace", verb: op.Replace, retired: true},
		{name: "cas", verb: op.CAS, retired: true},
		{name: "cas of another item", verb: op.CAS, badCAS: true},
		{name: "set by a reader", verb: op.Set, reader: true, retired: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, s, addr := realValues(t, nil)
			ctx := t.Context()
			const key = "big"
			if err := put(ctx, v, key, bigValue(3, 0)); err != nil {
				t.Fatal(err)
			}
			if tt.reader {
				v = New(s, Options{ChunkSize: raceChunk, Grace: time.Hour, Timeout: 5 * time.Second}, prometheus.NewRegistry())
				if v.MayHoldIndex(key) {
					t.Fatal("Values that never saw the key take it for an index")
				}
				v.Saw(key)
			}
			cur := s.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}})
			o := op.Op{Verb: tt.verb, Item: op.Item{Key: key, Value: []byte("small")}}
			if tt.verb == op.CAS {
				o.Item.CAS = cur.Item.CAS
				if tt.badCAS {
					o.Item.CAS++
				}
			}
			res := v.Do(ctx, o)
			if tt.badCAS {
				if !errors.Is(res.Err, upstream.ErrCASConflict) {
					t.Fatalf("CAS with another item's CAS = %v, want a conflict", res.Err)
				}
			} else if res.Err != nil {
				t.Fatalf("%v over a value in chunks: %v", tt.verb, res.Err)
			}
			exps, err := chunkExpirations(addr)
			if err != nil {
				t.Fatal(err)
			}
			if len(exps) != 4 {
				t.Fatalf("memcached holds %d chunks, want the value's 4", len(exps))
			}
			for k, exp := range exps {
				if retired := exp != -1; retired != tt.retired {
					t.Errorf("chunk %q expires at %d: retired %v, want %v", k, exp, retired, tt.retired)
				}
			}
			if v.MayHoldIndex(key) != !tt.retired {
				t.Errorf("MayHoldIndex after the write = %v, want %v", !tt.retired, tt.retired)
			}
			gets := func() string {
				st, err := memcachedtest.Stats(addr)
				if err != nil {
					t.Fatal(err)
				}
				return st["cmd_get"]
			}
			before := gets()
			if res := v.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "other", Value: []byte("small")}}); res.Err != nil {
				t.Fatal(res.Err)
			}
			if after := gets(); after != before {
				t.Errorf("a small set of a key never seen holding an index read memcached: cmd_get %s, then %s", before, after)
			}
		})
	}
}

// TestSmallWriteTries: a small Set over a key seen holding an index goes
// as a CAS against the index read; each time another write of the key
// came between, the item is read again and the write checked against
// it, and the chunks retired are those of the index it replaced. After
// maxIndexTries refusals it goes unchecked. Both are counted.
func TestSmallWriteTries(t *testing.T) {
	const key = "k"
	for _, tt := range []struct {
		interlopers int
		last        op.Verb
	}{{1, op.CAS}, {maxIndexTries, op.Set}} {
		t.Run(strconv.Itoa(tt.interlopers), func(t *testing.T) {
			s := &interloper{Store: storetest.New(), small: true}
			v := New(s, Options{ChunkSize: raceChunk, Timeout: time.Second}, prometheus.NewRegistry())
			ctx := t.Context()
			if err := put(ctx, v, key, bigValue(1, 0)); err != nil {
				t.Fatal(err)
			}
			s.n = tt.interlopers
			if res := v.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: key, Value: []byte("small")}}); res.Err != nil {
				t.Fatal(res.Err)
			}
			want := make([]op.Verb, tt.interlopers+1)
			for i := range want {
				want[i] = op.CAS
			}
			want[tt.interlopers] = tt.last
			if !slices.Equal(s.verbs, want) {
				t.Errorf("written with %v, want %v", s.verbs, want)
			}
			if got := string(s.Items[key].Value); got != "small" {
				t.Errorf("the key holds %q, want the small value", got)
			}
			if got := s.Items[Key(key, s.last, 0)].Expiration; got != v.grace() {
				t.Errorf("chunk of the index replaced expires at %d, want %d (retired)", got, v.grace())
			}
			wantUnchecked := 0.0
			if tt.last == op.Set {
				wantUnchecked = 1
			}
			if got := testutil.ToFloat64(v.m.indexRetries); got != float64(tt.interlopers) {
				t.Errorf("memcgate_chunked_index_retries_total = %v, want %d", got, tt.interlopers)
			}
			if got := testutil.ToFloat64(v.m.indexUnchecked); got != wantUnchecked {
				t.Errorf("memcgate_chunked_index_unchecked_total = %v, want %v", got, wantUnchecked)
			}
		})
	}
}
