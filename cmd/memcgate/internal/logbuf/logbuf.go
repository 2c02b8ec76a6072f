// Package logbuf is the log's buffer: it takes log lines without ever
// making their writer wait and writes them to the log's destination
// from a goroutine of its own, dropping and counting what does not fit
// its bound. It does not format lines; slog handlers write into it.
package logbuf

import (
	"bytes"
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Buffer collects log lines in memory and writes them to the log's
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
// access_log buffer= does the same). What waits is bounded: access log
// lines (Access) fit while less than backlog bytes wait, other lines
// (Write) while less than backlog plus logReserve, so that a flood of
// requests cannot crowd out the warnings and errors. A line that does
// not fit is dropped and counted, and the block written next ends with
// a line saying how many were dropped before it, where they are
// missing. A crash can lose what is waiting, at most flushEvery of lines
// at a steady rate.
type Buffer struct {
	mu      sync.Mutex // guards buf, lost, kicked
	buf     []byte     // lines waiting for Run
	lost    int        // lines dropped since Run last took buf
	kicked  bool       // Run was told flushAt had piled up since it last took buf
	backlog int        // what access lines may fill; other lines have logReserve more

	w       io.Writer
	kick    chan struct{} // a block is ready: Run writes before the tick
	every   time.Duration // how often Run writes what waits (flushEvery)
	spare   []byte        // the block Run wrote last, emptied; Run's alone
	dropped atomic.Uint64 // lines dropped, for the metric
	// notice, if not nil, is called by Run with the number of lines
	// dropped since it last took a block, to write a line saying so to w;
	// Run appends that line to the block, past the bound, so that it is
	// never dropped itself. err is the destination's last error if it
	// refused some of them (a full disk), else nil.
	notice func(w io.Writer, lines int, err error)
	note   bytes.Buffer // notice's line; Run's alone
	// refused counts the lines the destination refused since a notice
	// last reached it, and refusedErr is its last error: the next notice
	// reports them. Run's alone.
	refused    int
	refusedErr error
	access     accessLines
}

const (
	// flushEvery is how often Run writes what waits, and so how late a
	// line may reach the log at a low rate.
	flushEvery = 200 * time.Millisecond
	// flushAt is how much waits before Run is woken to write it at once.
	flushAt = 64 << 10
	// Backlog bounds the access lines waiting while the destination
	// is slow: about 20,000 of them, a fifth of a second at 100,000
	// requests a second. With the reserve and the block being written,
	// the log holds at most twice Backlog + logReserve (8.5 MiB).
	Backlog = 4 << 20
	// logReserve is room kept for lines other than access lines: about
	// a thousand warnings and errors.
	logReserve = 256 << 10
)

// New returns a Buffer writing to w, whose access lines may fill backlog
// bytes; Run writes them. notice, if not nil, writes to its w the line
// saying that lines were dropped, and how many, in a block Run writes
// next (at most once a block, past the bound: it is never dropped), with
// the error w gave for those it refused (nil if none).
func New(w io.Writer, backlog int, notice func(w io.Writer, lines int, err error)) *Buffer {
	b := &Buffer{w: w, backlog: backlog, every: flushEvery, kick: make(chan struct{}, 1), notice: notice}
	b.access = accessLines{b}
	return b
}

// Write adds one log line, or drops it if it does not fit the backlog
// and its reserve; slog handlers call it once per record. It never
// fails: a dropped line is counted, not an error for the caller to
// handle.
func (b *Buffer) Write(p []byte) (int, error) {
	b.add(p, b.backlog+logReserve)
	return len(p), nil
}

// accessLines is the Buffer's writer for access log lines.
type accessLines struct{ b *Buffer }

// Write adds one access log line, or drops it if backlog bytes wait.
func (a accessLines) Write(p []byte) (int, error) {
	a.b.add(p, a.b.backlog)
	return len(p), nil
}

// Access returns the writer for access log lines, which leave the
// reserve to the others.
func (b *Buffer) Access() io.Writer { return b.access }

func (b *Buffer) add(p []byte, limit int) {
	b.mu.Lock()
	if len(b.buf)+len(p) > limit {
		b.lost++
		b.mu.Unlock()
		b.dropped.Add(1)
		return
	}
	if n := len(b.buf) + len(p); n > cap(b.buf) {
		// Grown here rather than by append, whose growth could pass the
		// bound by a quarter.
		grown := make([]byte, len(b.buf), min(max(2*cap(b.buf), n, flushAt+flushAt/4), b.backlog+logReserve))
		copy(grown, b.buf)
		b.buf = grown
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
}

// Dropped returns the number of lines dropped: not taken because the
// destination was slower than the lines came, or refused by it.
func (b *Buffer) Dropped() uint64 { return b.dropped.Load() }

// flush writes out what waits, ended by the notice of lines dropped
// before it. Only Run's goroutine calls it.
func (b *Buffer) flush() {
	b.mu.Lock()
	out := b.buf
	b.buf, b.spare = b.spare[:0], nil
	lost := b.lost
	b.lost, b.kicked = 0, false
	b.mu.Unlock()
	lines := len(out) // the lines', the notice after them
	if b.notice == nil {
		b.refused, b.refusedErr = 0, nil // counted in Dropped, and no line to tell
	}
	if lost += b.refused; lost > 0 && b.notice != nil {
		b.note.Reset()
		b.notice(&b.note, lost, b.refusedErr)
		out = append(out, b.note.Bytes()...)
		b.refused, b.refusedErr = 0, nil
	}
	if len(out) > 0 {
		// The destination's error can only be told once it takes lines
		// again: the lines it did not take are counted as dropped, and
		// the next notice says how many and why. A notice it did not
		// take whole is told again, with them.
		if n, err := b.w.Write(out); err != nil {
			k := bytes.Count(out[min(n, lines):lines], []byte{'\n'})
			b.dropped.Add(uint64(k))
			if n < len(out) && len(out) > lines {
				b.refused += lost
			}
			b.refused += k
			b.refusedErr = err
		}
	}
	if cap(out) > flushAt*4 && len(out) < flushAt {
		out = nil // a burst is over: do not keep its megabytes
	}
	b.spare = out[:0]
}

// Run writes what waits every flushEvery, or at once when flushAt bytes
// have piled up, until ctx is done; then it writes the rest.
func (b *Buffer) Run(ctx context.Context) {
	t := time.NewTicker(b.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.flush()
			return
		case <-t.C:
		case <-b.kick:
		}
		b.flush()
	}
}

// StopWait bounds how long a process should wait at exit for Run to
// write the last lines: a destination that takes nothing must not keep
// the process from exiting on SIGTERM (within systemd's
// TimeoutStopSec, Kubernetes' grace period).
const StopWait = 5 * time.Second
