package mcpipe

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// testShare is a Share of limit bytes that counts what it holds, the
// most it held at once and its refusals, and lets its server have ahead
// bytes of large values on their way (0: any).
type testShare struct {
	limit   int64
	ahead   int64
	held    atomic.Int64
	most    atomic.Int64
	refused atomic.Int64
}

func (s *testShare) Take(n int) bool {
	h := s.held.Add(int64(n))
	if h > s.limit {
		s.held.Add(-int64(n))
		s.refused.Add(1)
		return false
	}
	for m := s.most.Load(); h > m && !s.most.CompareAndSwap(m, h); m = s.most.Load() {
	}
	return true
}

func (s *testShare) Give(n int) { s.held.Add(-int64(n)) }

func (s *testShare) Ahead(n int64) bool {
	if s.ahead > 0 && n > s.ahead {
		s.refused.Add(1)
		return false
	}
	return true
}

// doubleRoom is a testRoom that holds two bytes of its budget per byte
// of value, as the gateway's room for a JSON answer does.
type doubleRoom struct{ testRoom }

func (r *doubleRoom) Reserve(n int) bool { return r.testRoom.Reserve(2 * n) }
func (r *doubleRoom) Release(n int)      { r.testRoom.Release(2 * n) }
func (r *doubleRoom) Holds(n int) int    { return 2 * n }

// TestShareBoundsWhatRepliesHold: a value whose server's Share will not
// take what its Room would hold for it is refused as one the Room
// refused (ErrNoFit, the key in the multi-key get's nofit), without
// asking the Room; a value it takes counts at the Room's cost (twice
// its size for a room that holds it twice) until the reply is handed
// out, and nothing stays counted afterwards. Small values of single
// reads never reach the Share.
func TestShareBoundsWhatRepliesHold(t *testing.T) {
	srv := memcachedtest.Start(t)
	const size = 40 << 10
	share := &testShare{limit: 5 * size / 2} // room for two values, or one held twice
	c := New(Options{Conns: 1, Timeout: 5 * time.Second, Share: share, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Addr)
	}})
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	for _, k := range []string{"a", "b", "c"} {
		if err := set(ctx, c, k, bytes.Repeat([]byte(k), size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := set(ctx, c, "small", []byte("s")); err != nil {
		t.Fatal(err)
	}
	settled := func(t *testing.T) {
		t.Helper()
		waitFor(t, "the reply's holds to be given back", func() bool { return share.held.Load() == 0 })
	}

	t.Run("single reads", func(t *testing.T) {
		room := &testRoom{}
		for _, k := range []string{"a", "small"} {
			if it, _, err := c.Do(ctx, op.Op{Verb: op.Get, Room: room}, k); err != nil || it == nil {
				t.Fatalf("get %s: %v", k, err)
			}
		}
		settled(t)
		if got := share.most.Load(); got != size {
			t.Errorf("the share held at most %d bytes, want %d (the large value only)", got, size)
		}
		share.held.Add(2 * size) // another reply holds most of the share
		asked := room.asked.Load()
		_, _, err := c.Do(ctx, op.Op{Verb: op.Get, Room: room}, "b")
		share.held.Add(-2 * size)
		if !errors.Is(err, ErrNoFit) || room.asked.Load() != asked {
			t.Errorf("get past the share = %v with the room asked %d more times, want ErrNoFit and the room not asked", err, room.asked.Load()-asked)
		}
		if it, _, err := c.Do(ctx, op.Op{Verb: op.Get, Room: room}, "b"); err != nil || it == nil {
			t.Errorf("get within the share again: %v", err)
		}
		settled(t)
		if room.held.Load() != 0 {
			t.Errorf("the room holds %d bytes after the replies", room.held.Load())
		}
	})

	t.Run("a multi-key get at its room's cost", func(t *testing.T) {
		room := &doubleRoom{}
		refused := share.refused.Load()
		items, _, nofit, err := c.GetMultiLimit(ctx, []string{"a", "b", "c"}, 0, room, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(items) != 1 || items["a"] == nil || strings.Join(nofit, ",") != "b,c" {
			t.Errorf("kept %d values (a: %v), refused %v; want a kept, b and c refused", len(items), items["a"] != nil, nofit)
		}
		if share.refused.Load()-refused != 2 {
			t.Errorf("the share refused %d values, want 2", share.refused.Load()-refused)
		}
		settled(t)
		if got := share.most.Load(); got != 2*size {
			t.Errorf("the share held at most %d bytes, want %d: the value kept, at its room's cost", got, 2*size)
		}
		if room.held.Load() != 0 {
			t.Errorf("the room holds %d bytes after the reply", room.held.Load())
		}
	})
}

// TestLargeReadsAheadBounded: a read sent on its key's hint counts the
// size last seen until its reply is read; one that would have more of
// them on their way than the Share lets the server have ahead is refused
// unsent (ErrNoFit), by Do and DoAsync alike, and counted as the
// Share's refusal; one with nothing else ahead always goes, and reads of
// keys with no hint never count. Once the replies come nothing stays
// counted, and the refused read goes.
func TestLargeReadsAheadBounded(t *testing.T) {
	srv := memcachedtest.Start(t)
	const size = 64 << 10
	tests := []struct {
		about   string
		ahead   int64    // the Share's bound
		sent    []string // read in turn while memcached is stopped: each goes
		refused string   // read next: refused unsent
	}{
		{"two on their way, not three", 2*size + size/2, []string{"a", "b", "small"}, "c"},
		{"one alone past the bound", size / 2, []string{"a", "small"}, "b"},
	}
	for _, tt := range tests {
		t.Run(tt.about, func(t *testing.T) {
			share := &testShare{limit: 1 << 30, ahead: tt.ahead}
			room := &testRoom{}
			c := aheadClient(t, srv, share, op.Op{Verb: op.Get, Room: room}, []stored{
				{"a", bytes.Repeat([]byte("a"), size), true}, {"b", bytes.Repeat([]byte("b"), size), true},
				{"c", bytes.Repeat([]byte("c"), size), true}, {"small", []byte("s"), true},
			})
			ctx := t.Context()
			async := func(k string) chan error {
				done := make(chan error, 1)
				if err := c.DoAsync(ctx, op.Op{Verb: op.Get, Room: room}, k, func(_ *memcache.Item, _ uint64, err error) { done <- err }); err != nil {
					done <- err
				}
				return done
			}
			srv.Pause()
			var replies []chan error
			for _, k := range tt.sent {
				replies = append(replies, async(k))
			}
			select {
			case err := <-async(tt.refused):
				if !errors.Is(err, ErrNoFit) {
					t.Errorf("DoAsync %s past the bound: %v, want ErrNoFit", tt.refused, err)
				}
			default:
				t.Errorf("DoAsync %s past the bound was sent", tt.refused)
			}
			if _, _, err := c.Do(ctx, op.Op{Verb: op.Get, Room: room}, tt.refused); !errors.Is(err, ErrNoFit) {
				t.Errorf("Do %s past the bound: %v, want ErrNoFit", tt.refused, err)
			}
			if n := share.refused.Load(); n != 2 {
				t.Errorf("the share counted %d refusals, want 2", n)
			}
			if got, want := c.ahead.Load(), int64(size*(len(tt.sent)-1)); got != want {
				t.Errorf("%d bytes counted ahead, want %d (the large reads sent)", got, want)
			}
			srv.Resume()
			for i, done := range replies {
				if err := <-done; err != nil {
					t.Errorf("read of %s: %v", tt.sent[i], err)
				}
			}
			if n := c.ahead.Load(); n != 0 {
				t.Errorf("%d bytes counted ahead after every reply", n)
			}
			if _, _, err := c.Do(ctx, op.Op{Verb: op.Get, Room: room}, tt.refused); err != nil {
				t.Errorf("%s with nothing ahead: %v", tt.refused, err)
			}
		})
	}
}

// TestMultiGetsAheadBounded: a multi-key get with a room counts the
// sizes last seen of its keys' large values on their way until its reply
// is read, as single reads do; a key that would have more of them on
// their way than the Share lets the server have ahead is refused unsent
// (in nofit). Probed, it counts the sizes the probe found, hint or no
// hint. Without it, clients that send multi-gets of large values and
// reset at once queued thousands of them on the node.
func TestMultiGetsAheadBounded(t *testing.T) {
	srv := memcachedtest.Start(t)
	const size = 64 << 10
	share := &testShare{limit: 1 << 30, ahead: 2*size + size/2}
	room := &testRoom{}
	big := func(k string) []byte { return bytes.Repeat([]byte(k), size) }
	c := aheadClient(t, srv, share, op.Op{Verb: op.Get, Room: room}, []stored{
		{"a", big("a"), true}, {"b", big("b"), true}, {"c", big("c"), true},
		{"unread", big("unread"), false}, // no hint
		{"small", []byte("s"), true},
	})
	ctx := t.Context()
	type got struct {
		items map[string]*memcache.Item
		nofit []string
		err   error
	}
	multi := func(keys []string, limit int, probe bool) chan got {
		done := make(chan got, 1)
		go func() {
			items, _, nofit, err := c.GetMultiLimit(ctx, keys, limit, room, probe)
			done <- got{items, nofit, err}
		}()
		return done
	}
	check := func(t *testing.T, g got, kept, nofit string) {
		t.Helper()
		var names []string
		for _, k := range []string{"a", "b", "c", "unread", "small"} {
			if g.items[k] != nil {
				names = append(names, k)
			}
		}
		if g.err != nil || strings.Join(names, ",") != kept || strings.Join(g.nofit, ",") != nofit {
			t.Errorf("kept %v, refused %v, %v; want %s kept, %q refused", names, g.nofit, g.err, kept, nofit)
		}
	}

	t.Run("counted while on its way", func(t *testing.T) {
		srv.Pause()
		done := multi([]string{"a", "b", "small"}, 0, false)
		waitFor(t, "the multi-get's values to be counted ahead", func() bool { return c.ahead.Load() == 2*size })
		refused := make(chan error, 1)
		if err := c.DoAsync(ctx, op.Op{Verb: op.Get, Room: room}, "c", func(_ *memcache.Item, _ uint64, err error) { refused <- err }); err != nil {
			refused <- err
		}
		if err := <-refused; !errors.Is(err, ErrNoFit) {
			t.Errorf("get of c behind the multi-get: %v, want ErrNoFit", err)
		}
		srv.Resume()
		check(t, <-done, "a,b,small", "")
		if n := c.ahead.Load(); n != 0 {
			t.Errorf("%d bytes counted ahead after the reply", n)
		}
	})

	t.Run("refused past reads on their way", func(t *testing.T) {
		srv.Pause()
		var replies []chan error
		for _, k := range []string{"a", "b"} {
			done := make(chan error, 1)
			if err := c.DoAsync(ctx, op.Op{Verb: op.Get, Room: room}, k, func(_ *memcache.Item, _ uint64, err error) { done <- err }); err != nil {
				done <- err
			}
			replies = append(replies, done)
		}
		// Decided before memcached answers a and b: refused unsent, so
		// it returns at once; sent, it would wait for the deadline.
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		items, _, nofit, err := c.GetMultiLimit(short, []string{"c"}, 0, room, false)
		cancel()
		srv.Resume()
		check(t, got{items, nofit, err}, "", "c")
		for _, r := range replies {
			if err := <-r; err != nil {
				t.Error(err)
			}
		}
		if n := c.ahead.Load(); n != 0 {
			t.Errorf("%d bytes counted ahead after the replies", n)
		}
	})

	t.Run("probed, at the sizes found", func(t *testing.T) {
		c.ahead.Add(2 * size) // reads on their way, as above
		check(t, <-multi([]string{"unread", "small"}, 1<<30, true), "small", "unread")
		c.ahead.Add(-2 * size)
		check(t, <-multi([]string{"unread", "small"}, 1<<30, true), "unread,small", "")
		if n := c.ahead.Load(); n != 0 {
			t.Errorf("%d bytes counted ahead after the replies", n)
		}
	})
}

// TestGATsAheadBounded: a GAT of a key known large counts its size on
// its way as a Get does, and past the Share's bound it is refused unsent
// (ErrNoFit), by Do and DoAsync alike, the item not touched either.
// Without it, GETs with ?touch= of large values whose clients reset at
// once queued on the node unbounded.
func TestGATsAheadBounded(t *testing.T) {
	srv := memcachedtest.Start(t)
	const size = 64 << 10
	share := &testShare{limit: 1 << 30, ahead: 2*size + size/2}
	room := &testRoom{}
	gat := op.Op{Verb: op.GAT, Room: room, Item: op.Item{Expiration: 3600}}
	c := aheadClient(t, srv, share, gat, []stored{
		{"a", bytes.Repeat([]byte("a"), size), true}, {"b", bytes.Repeat([]byte("b"), size), true},
		{"c", bytes.Repeat([]byte("c"), size), true},
	})
	ctx := t.Context()
	srv.Pause()
	var replies []chan error
	for _, k := range []string{"a", "b"} {
		done := make(chan error, 1)
		if err := c.DoAsync(ctx, gat, k, func(_ *memcache.Item, _ uint64, err error) { done <- err }); err != nil {
			t.Fatalf("DoAsync gat %s: %v", k, err)
		}
		replies = append(replies, done)
	}
	if got := c.ahead.Load(); got != 2*size {
		t.Errorf("%d bytes counted ahead, want %d (the two GATs on their way)", got, 2*size)
	}
	expire := gat
	expire.Item.Expiration = -1 // sent, it would expire c
	refused := make(chan error, 1)
	if err := c.DoAsync(ctx, expire, "c", func(_ *memcache.Item, _ uint64, err error) { refused <- err }); err != nil {
		refused <- err
	}
	select {
	case err := <-refused:
		if !errors.Is(err, ErrNoFit) {
			t.Errorf("DoAsync gat c past the bound: %v, want ErrNoFit", err)
		}
	default:
		t.Error("DoAsync gat c past the bound was sent")
	}
	if it, _, err := c.Do(ctx, expire, "c"); it != nil || !errors.Is(err, ErrNoFit) {
		t.Errorf("Do gat c past the bound: value read %v, %v; want ErrNoFit", it != nil, err)
	}
	srv.Resume()
	for _, r := range replies {
		if err := <-r; err != nil {
			t.Error(err)
		}
	}
	if n := c.ahead.Load(); n != 0 {
		t.Errorf("%d bytes counted ahead after the replies", n)
	}
	if it, _, err := c.Do(ctx, op.Op{Verb: op.Get}, "c"); err != nil || it == nil {
		t.Errorf("get of c after the refused GATs: %v, want its value (not touched)", err)
	}
}

// stored is a value aheadClient stores, and whether it reads it.
type stored struct {
	key   string
	value []byte
	learn bool // read twice with the learning op
}

// aheadClient returns a Client of srv with one connection a lane and
// share for its Share, each value of items stored through it and, if
// learn, read twice with read: the first read learns a large value's
// size, the second goes on the large lane and dials it (DoAsync never
// dials).
func aheadClient(t *testing.T, srv *memcachedtest.Server, share Share, read op.Op, items []stored) *Client {
	t.Helper()
	c := New(Options{Conns: 1, Timeout: 10 * time.Second, Share: share, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Addr)
	}})
	t.Cleanup(func() { c.Close() })
	for _, it := range items {
		if err := set(t.Context(), c, it.key, it.value); err != nil {
			t.Fatal(err)
		}
		if !it.learn {
			continue
		}
		for range 2 {
			if _, _, err := c.Do(t.Context(), read, it.key); err != nil {
				t.Fatal(err)
			}
		}
	}
	return c
}
