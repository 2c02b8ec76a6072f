package upstream

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

func TestParseMetaTTL(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		ttl     int32
		cas     uint64
		wantErr error
	}{
		{"expiring", "HD t100 c7\r\n", 100, 7, nil},
		{"never", "HD t-1 c2\r\n", 0, 2, nil},
		{"last second", "HD t0 c3\r\n", 1, 3, nil},
		{"flags in any order", "HD c9 t5\r\n", 5, 9, nil},
		{"miss", "EN\r\n", 0, 0, ErrNotFound},
		{"no meta", "ERROR\r\n", 0, 0, ErrNoMeta},
		{"client error", "CLIENT_ERROR bad command line format\r\n", 0, 0, ErrNoMeta},
		{"no ttl", "HD c1\r\n", 0, 0, ErrServer},
		{"garbage", "VALUE x 0 1\r\n", 0, 0, ErrServer},
		{"bad number", "HD tx c1\r\n", 0, 0, ErrServer},
		// memcached returns each flag asked once: two are no answer.
		{"ttl twice", "HD t100 t5 c7\r\n", 0, 0, ErrServer},
		{"cas twice", "HD t100 c7 c8\r\n", 0, 0, ErrServer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ttl, cas, err := parseMetaTTL([]byte(tt.line))
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("parseMetaTTL(%q) error = %v, want %v", tt.line, err, tt.wantErr)
			}
			if ttl != tt.ttl || cas != tt.cas {
				t.Errorf("parseMetaTTL(%q) = %d, %d, want %d, %d", tt.line, ttl, cas, tt.ttl, tt.cas)
			}
		})
	}
}

func TestTTLFromMemcached(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, nil)
	ctx := t.Context()
	if err := c.Set(ctx, Item{Key: "expiring", Value: []byte("v"), Expiration: 100}); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, Item{Key: "forever", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key     string
		min     int32
		max     int32
		wantErr error
	}{
		{"expiring", 98, 100, nil},
		{"forever", 0, 0, nil},
		{"absent", 0, 0, ErrNotFound},
		{"bad key", 0, 0, ErrBadKey},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			for range 3 { // the second and third reuse the idle connection
				ttl, cas, err := c.TTL(ctx, op.Op{Item: Item{Key: tt.key}})
				if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
					t.Fatalf("TTL(%q) error = %v, want %v", tt.key, err, tt.wantErr)
				}
				if ttl < tt.min || ttl > tt.max {
					t.Errorf("TTL(%q) = %d, want %d..%d", tt.key, ttl, tt.min, tt.max)
				}
				if err == nil && cas == 0 {
					t.Errorf("TTL(%q) cas = 0, want the item's", tt.key)
				}
			}
		})
	}
}

// TestTTLLookupsShareFewConnections: lookups at once on one node share at
// most metaConns connections, waiting for one to come back, rather than
// each dialling its own: a warm-up copying many keys at once (up to
// MEMCGATE_WARM_BACKGROUND_OPS, 1024) opened as many connections to the
// cold pool's node, kept two and closed the rest, past memcached's -c
// (1024 by default) and at 130 µs of its CPU per connection.
func TestTTLLookupsShareFewConnections(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, nil)
	ctx := t.Context()
	if err := c.Set(ctx, Item{Key: "k", Value: []byte("v"), Expiration: 100}); err != nil {
		t.Fatal(err)
	}
	before, err := mcs[0].Stats()
	if err != nil {
		t.Fatal(err)
	}
	const lookups = 200
	var wg sync.WaitGroup
	errs := make(chan error, lookups)
	for range lookups {
		wg.Go(func() {
			if _, _, err := c.TTL(ctx, op.Op{Item: Item{Key: "k"}}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after, err := mcs[0].Stats()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := strconv.Atoi(before["total_connections"])
	a, _ := strconv.Atoi(after["total_connections"])
	// The stats calls' own connections count too: one each.
	if opened := a - b - 1; opened > metaConns {
		t.Errorf("%d lookups at once opened %d connections, want at most %d", lookups, opened, metaConns)
	}
}

// TestTTLLookupWaitBounded: a TTL lookup is optional (its caller, a
// warm-up's copy, has a default TTL), so one waits for one of the node's
// metaConns connections at most Timeout, as long as a lookup of its own
// would take to answer: behind lookups stalled on a node that does not
// answer (paused), one with a request's 2 s left came back only at its
// deadline, the whole request spent in line. A lookup whose caller gave
// up (a client gone) gives its connection back at once, not at the
// socket's timeout.
func TestTTLLookupWaitBounded(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	c, _ := newTestCluster(t, mcs, faultOptions) // Timeout 500 ms
	k := op.Op{Item: Item{Key: "k"}}
	if err := c.Set(t.Context(), Item{Key: "k", Value: []byte("v"), Expiration: 100}); err != nil {
		t.Fatal(err)
	}
	mcs[0].Pause()
	defer mcs[0].Resume()
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 20 { // a warm-up's copies, each with its own 2 s
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, _, _ = c.TTL(ctx, k)
		})
	}
	time.Sleep(50 * time.Millisecond) // the copies take the connections and queue
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := c.TTL(ctx, k)
	if took, most := time.Since(start), 2*c.opts.Timeout; err == nil || took > most {
		t.Errorf("a lookup behind 20 on a node that does not answer: %v after %v, want an error within %v (2 x Timeout)", err, took, most)
	}
	wg.Wait()

	gone, leave := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _, _, _ = c.TTL(gone, k) }()
	time.Sleep(100 * time.Millisecond) // it waits for the node's answer
	start = time.Now()
	leave()
	<-done
	if took := time.Since(start); took > c.opts.Timeout/2 {
		t.Errorf("a lookup whose caller gave up came back %v later, want at once (well within Timeout %v)", took, c.opts.Timeout)
	}
}
