package main

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// logBuffer collects log lines in memory and writes them to the log's
// destination from Run's goroutine alone, so that no request ever waits
// on that destination. A pipe whose reader falls behind (a container
// runtime, `| logger`, a test harness) or a slow disk would otherwise
// stall every request that logs behind a lock, and a client that sends
// cheap requests fast enough writes the lines that make it fall behind
// (docs/decisions/0018).
//
// Lines go out in blocks: when flushAt bytes have piled up, every
// flushEvery, and when Run ends. Without blocks every access log line is
// a write(2) of its own, a syscall per request on the hot path (nginx's
// access_log buffer= does the same). What is waiting is bounded by
// backlog bytes, and one block is being written at a time: a line that
// does not fit is dropped and counted, and a line saying how many were
// dropped follows once the destination takes lines again. A crash can
// lose what is waiting, at most flushEvery of lines at a steady rate.
type logBuffer struct {
	mu      sync.Mutex // guards buf, lost
	buf     []byte     // lines waiting for Run
	lost    int        // lines dropped since Run last wrote
	kicked  bool       // Run was told flushAt had piled up since it last took buf
	backlog int

	w       io.Writer
	kick    chan struct{} // a block is ready: Run writes before the tick
	spare   []byte        // the block Run wrote last, emptied; Run's alone
	dropped atomic.Uint64 // lines dropped, for the metric
	// notice, if not nil, is called by Run with the number of lines it
	// found dropped after it wrote a block: the logger's warning, which
	// comes back through Write into the emptied buffer.
	notice func(lines int)
}

const (
	flushEvery = 200 * time.Millisecond
	flushAt    = 64 << 10
	// logBacklog bounds the lines waiting while the destination is slow:
	// about 20,000 access log lines, a fifth of a second of them at
	// 100,000 requests a second. Twice this is the most the log holds
	// (one block being written, one filling).
	logBacklog = 4 << 20
)

func newLogBuffer(w io.Writer, backlog int) *logBuffer {
	return &logBuffer{w: w, backlog: backlog, kick: make(chan struct{}, 1)}
}

// Write adds one log line, or drops it if backlog bytes are waiting
// already; slog handlers call it once per record. It never fails: a
// dropped line is counted, not an error for the caller to handle.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	if len(b.buf)+len(p) > b.backlog {
		b.lost++
		b.mu.Unlock()
		b.dropped.Add(1)
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	kick := len(b.buf) >= flushAt && !b.kicked
	if kick {
		b.kicked = true
	}
	b.mu.Unlock()
	if kick {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// Dropped returns the number of lines dropped because the destination
// was slower than the lines came.
func (b *logBuffer) Dropped() uint64 { return b.dropped.Load() }

// flush writes out what is waiting and reports lines dropped before it.
// Only Run's goroutine calls it.
func (b *logBuffer) flush() {
	b.mu.Lock()
	out := b.buf
	b.buf, b.spare = b.spare[:0], nil
	lost := b.lost
	b.lost, b.kicked = 0, false
	b.mu.Unlock()
	if len(out) > 0 {
		_, _ = b.w.Write(out) // where would the error of the log's own destination go?
	}
	if cap(out) > flushAt*4 && len(out) < flushAt {
		out = nil // a burst is over: do not keep its megabytes
	}
	b.spare = out[:0]
	if lost > 0 && b.notice != nil {
		b.notice(lost)
	}
}

// Run writes blocks out until ctx is done, then once more.
func (b *logBuffer) Run(ctx context.Context) {
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.flush()
			b.flush() // the notice of lines dropped before the last block
			return
		case <-t.C:
		case <-b.kick:
		}
		b.flush()
	}
}
