package chunk

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// chunkPanics is a gateStore whose read of one chunk panics, as a bug on
// the way to memcached would.
type chunkPanics struct {
	*gateStore
	key string // the chunk's
}

func (s chunkPanics) Do(ctx context.Context, o op.Op) op.Result {
	if o.Verb == op.Get && o.Item.Key == s.key {
		panic("planted: chunk read")
	}
	return s.gateStore.Do(ctx, o)
}

// TestPanicInPrefetcher: a Reader's prefetcher fetches chunks on a
// goroutine of its own; a fetch that panics fails the read where it
// stands, as a failed fetch does (the chunks before it are read, then
// Next fails with panicguard.ErrPanicked), gives back its turn
// (MaxReads), and is counted in memcgate_panics_total{where="chunk_read"}.
// Without the stop, the panic ended the process.
func TestPanicInPrefetcher(t *testing.T) {
	const chunkSize = 10
	s := newGateStore()
	close(s.gate)
	g := panicguard.New(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	v := New(s, Options{ChunkSize: chunkSize, Timeout: time.Second, Panics: g}, prometheus.NewRegistry())
	value := strings.Repeat("v", 4*chunkSize)
	if err := v.Put(t.Context(), Put{Verb: op.Set, Key: "k"}, &sliceSource{b: []byte(value), size: chunkSize}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	x, ok, err := Parse(s.items["k"])
	if !ok || err != nil {
		t.Fatalf("Parse(index) = %v, %v", ok, err)
	}
	r := v.NewReader(t.Context(), "k", x, time.Now(), 0, x.Size)
	v.store = chunkPanics{gateStore: s, key: r.base + "2"}
	b, err := readToEnd(r)
	if !errors.Is(err, panicguard.ErrPanicked) || string(b) != value[:2*chunkSize] {
		t.Errorf("read whose third chunk's fetch panicked = %d bytes, %v; want the first two chunks, then panicguard.ErrPanicked", len(b), err)
	}
	if n := len(v.reads); n != 0 {
		t.Errorf("%d read turns held after the read, want 0", n)
	}
	if n := g.Stopped("chunk_read"); n != 1 {
		t.Errorf(`memcgate_panics_total{where="chunk_read"} = %v, want 1`, n)
	}
}
