package mcpipe

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestSizeHints: a hint is the size of the last large value seen for its
// key, in whole KiB, and nothing for a key whose last value was small or
// that another key took the slot of; a key never forgets another's hint.
func TestSizeHints(t *testing.T) {
	h := NewSizeHints()
	if n := h.Size("k"); n != 0 {
		t.Fatalf("empty table: size %d", n)
	}
	// Two keys on one slot.
	a, b := "a", ""
	for i := 0; b == ""; i++ {
		k := "b" + strconv.Itoa(i)
		if func() bool { i, _ := h.slot(k); j, _ := h.slot(a); return i == j }() {
			b = k
		}
	}
	tests := []struct {
		do    func()
		key   string
		want  int
		about string
	}{
		{func() { h.Saw(a, op.LentValue-1) }, a, 0, "small value"},
		{func() { h.Saw(a, 1<<20+1023) }, a, 1 << 20, "large value, KiB rounded down"},
		{func() {}, b, 0, "another key on the slot"},
		{func() { h.Forget(b) }, a, 1 << 20, "forgetting another key on the slot"},
		{func() { h.Saw(b, 64<<10) }, a, 0, "another key took the slot"},
		{func() {}, b, 64 << 10, "the key that took it"},
		{func() { h.Saw(b, 100) }, b, 0, "a small value since"},
		{func() { h.Saw(a, math.MaxInt32) }, a, hintSizeMask << 10, "past the size bits"},
		{func() { h.Forget(a) }, a, 0, "forgotten"},
	}
	for _, tt := range tests {
		tt.do()
		if n := h.Size(tt.key); n != tt.want {
			t.Errorf("%s: size(%q) = %d, want %d", tt.about, tt.key, n, tt.want)
		}
	}
}

// TestRefusedUnsent: a read whose Room refuses a large value costs
// memcached's sending of it once; after that, while the Room would not
// take the size last seen, the read is refused before it is sent, by Do
// and DoAsync alike. A Room with space reads it again, and a write of
// the key through the Client, or a small value found by a read, drops
// the hint.
func TestRefusedUnsent(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "2m")
	c := newClient(srv.Addr, 1, nil)
	t.Cleanup(func() { c.Close() })
	mc := memcache.New(srv.Addr) // another client of the same memcached
	big := bytes.Repeat([]byte("v"), 256<<10)
	if err := mc.Set(&memcache.Item{Key: "big", Value: big}); err != nil {
		t.Fatal(err)
	}
	full := &testRoom{limit: 64 << 10} // never takes big
	free := &testRoom{}
	get := func(rm op.Room) error {
		_, _, err := c.Do(context.Background(), op.Op{Verb: op.Get, Room: rm}, "big")
		return err
	}
	gat := func(rm op.Room) error {
		_, _, err := c.Do(context.Background(), op.Op{Verb: op.GAT, Room: rm, Item: op.Item{Expiration: 60}}, "big")
		return err
	}
	asyncGet := func(rm op.Room) error {
		done := make(chan error, 1)
		err := c.DoAsync(context.Background(), op.Op{Verb: op.Get, Room: rm}, "big", func(_ *memcache.Item, _ uint64, err error) { done <- err })
		if err != nil {
			return err
		}
		return <-done
	}
	tests := []struct {
		about string
		do    func() error
		want  error
		sent  bool
	}{
		{"first refusal: read and dropped", func() error { return get(full) }, ErrNoFit, true},
		{"again: refused unsent", func() error { return get(full) }, ErrNoFit, false},
		{"async: refused unsent", func() error { return asyncGet(full) }, ErrNoFit, false},
		{"a room with space", func() error { return get(free) }, nil, true},
		{"still hinted", func() error { return get(full) }, ErrNoFit, false},
		{"set small through the Client", func() error { return c.Set(&memcache.Item{Key: "big", Value: []byte("s")}) }, nil, false},
		{"no hint: sent, small", func() error { return get(full) }, nil, true},
		{"large again, set elsewhere", func() error { return mc.Set(&memcache.Item{Key: "big", Value: big}) }, nil, false},
		{"no hint: read and dropped", func() error { return asyncGet(full) }, ErrNoFit, true},
		{"hinted again", func() error { return get(full) }, ErrNoFit, false},
		{"a GAT, which touches the item, is sent", func() error { return gat(full) }, ErrNoFit, true},
		{"small again, set elsewhere", func() error { return mc.Set(&memcache.Item{Key: "big", Value: []byte("s")}) }, nil, false},
		{"a stale hint refuses while the room is full", func() error { return get(full) }, ErrNoFit, false},
		{"a room with space finds it small", func() error { return get(free) }, nil, true},
		{"no hint", func() error { return get(full) }, nil, true},
		{"large again, set elsewhere", func() error { return mc.Set(&memcache.Item{Key: "big", Value: big}) }, nil, false},
		{"learnt", func() error { return get(free) }, nil, true},
		{"deleted elsewhere", func() error { return mc.Delete("big") }, nil, false},
		{"a stale hint refuses", func() error { return get(full) }, ErrNoFit, false},
		{"a room with space finds it missing", func() error { return get(free) }, memcache.ErrCacheMiss, true},
		{"a miss dropped the hint", func() error { return get(full) }, memcache.ErrCacheMiss, true},
	}
	for _, tt := range tests {
		before := cmdGets(t, srv)
		if err := tt.do(); !errors.Is(err, tt.want) {
			t.Fatalf("%s: %v, want %v", tt.about, err, tt.want)
		}
		if sent := cmdGets(t, srv) > before; sent != tt.sent {
			t.Errorf("%s: sent %v, want %v", tt.about, sent, tt.sent)
		}
	}
	if n := full.held.Load() + free.held.Load(); n != 0 {
		t.Errorf("rooms hold %d bytes after every read", n)
	}
}

// TestLargeReadsOwnLane: reads of a value known to be large go on
// connections of their own, so a small read is answered at once however
// many seconds of large replies are queued; unhinted, it would wait for
// them all on the one connection.
func TestLargeReadsOwnLane(t *testing.T) {
	srv := memcachedtest.Start(t)
	const rate = 512 << 10
	addr := relay(t, srv.Addr, rate, true) // memcached's replies at rate
	// A timeout no starved relay reaches: what is measured is the wait
	// behind the large replies, not a stall.
	c := New(Options{Conns: 1, Timeout: 5 * time.Second, Dial: func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}})
	t.Cleanup(func() { c.Close() })
	mc := memcache.New(srv.Addr)
	for _, it := range []*memcache.Item{{Key: "big", Value: bytes.Repeat([]byte("v"), 64<<10)}, {Key: "small", Value: []byte("s")}} {
		if err := mc.Set(it); err != nil {
			t.Fatal(err)
		}
	}
	room := &testRoom{}
	get := func(key string) error {
		_, _, err := c.Do(context.Background(), op.Op{Verb: op.Get, Room: room}, key)
		return err
	}
	if err := get("big"); err != nil { // learns its size
		t.Fatal(err)
	}
	const queued = 32 // 4 s of replies at rate
	errs := make(chan error, queued)
	for range queued {
		go func() { errs <- get("big") }()
	}
	waitFor(t, "the large reads to queue", func() bool {
		cn := c.large.slots[0].c.Load()
		if cn == nil {
			return false
		}
		cn.mu.Lock()
		defer cn.mu.Unlock()
		n := 0
		for _, cl := range cn.queue {
			n += len(cl.members())
		}
		return n == queued
	})
	start := time.Now()
	if err := get("small"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second { // half the large ones' 4 s
		t.Errorf("the small read took %v behind %d large ones", d, queued)
	}
	c.Close()
	for range queued {
		if err := <-errs; err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("a large read: %v", err)
		}
	}
}

// TestStaleHintRetried: while the Room stays full, a read refused on a
// hint that went stale behind the Client's back (the value is small now)
// is still sent once per retry interval, which corrects the hint; reads
// in between are refused unsent.
func TestStaleHintRetried(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	t.Cleanup(func() { c.Close() })
	c.hints.every = 200 * time.Millisecond
	mc := memcache.New(srv.Addr)
	if err := mc.Set(&memcache.Item{Key: "k", Value: bytes.Repeat([]byte("v"), 64<<10)}); err != nil {
		t.Fatal(err)
	}
	get := func(rm op.Room) ([]byte, error) {
		it, _, err := c.Do(context.Background(), op.Op{Verb: op.Get, Room: rm}, "k")
		if err != nil {
			return nil, err
		}
		return it.Value, nil
	}
	if _, err := get(&testRoom{}); err != nil { // learns its size
		t.Fatal(err)
	}
	if err := mc.Set(&memcache.Item{Key: "k", Value: []byte("small")}); err != nil {
		t.Fatal(err)
	}
	full := &testRoom{limit: 1}
	before := cmdGets(t, srv)
	refused := 0
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		v, err := get(full)
		if err == nil {
			if string(v) != "small" {
				t.Fatalf("read %q", v)
			}
			break
		}
		if !errors.Is(err, ErrNoFit) || time.Now().After(end) {
			t.Fatalf("after %d refusals: %v", refused, err)
		}
		refused++
	}
	if n := cmdGets(t, srv) - before; n != 1 {
		t.Errorf("%d reads sent while the hint was stale, want 1 (the retry); %d refused unsent", n, refused)
	}
	if _, err := get(full); err != nil {
		t.Errorf("a read once the hint is corrected: %v", err)
	}
}

// cmdGets is memcached's count of reads served: get commands and
// get-and-touch ones.
func cmdGets(t *testing.T, srv *memcachedtest.Server) int {
	t.Helper()
	st, err := srv.Stats()
	if err != nil {
		t.Fatal(err)
	}
	gets, _ := strconv.Atoi(st["cmd_get"])
	touches, _ := strconv.Atoi(st["cmd_touch"])
	return gets + touches
}
