package chunk

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// gateStore is a Store in memory whose writes of chunks wait for gate to
// close (or their context to end), counting how many wait at once.
type gateStore struct {
	gate     chan struct{}
	mu       sync.Mutex // guards items, inflight, peak
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
		s.mu.Lock()
		defer s.mu.Unlock()
		it, ok := s.items[o.Item.Key]
		if !ok {
			return op.Result{Err: upstream.ErrNotFound}
		}
		return op.Result{Item: it}
	case op.Delete:
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.items, o.Item.Key)
		return op.Result{}
	}
	if Reserved(o.Item.Key) {
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
		case <-s.gate:
		case <-ctx.Done():
			return op.Result{Err: ctx.Err()}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.items[o.Item.Key] = o.Item
	return op.Result{}
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
