package main

import (
	"bufio"
	"context"
	"io"
	"sync"
	"time"
)

// logBuffer collects log lines and writes them out in blocks: when 64 KiB
// have piled up, every flushEvery, and on Close. Without it every access
// log line is a write(2) of its own, a syscall per request on the hot path
// (nginx's access_log buffer= does the same). A crash can lose at most
// flushEvery of log lines.
type logBuffer struct {
	mu sync.Mutex // guards w
	w  *bufio.Writer
}

const flushEvery = 200 * time.Millisecond

func newLogBuffer(w io.Writer) *logBuffer {
	return &logBuffer{w: bufio.NewWriterSize(w, 64<<10)}
}

// Write buffers one log line; slog handlers call it once per record.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.w.Write(p)
}

// Flush writes out what is buffered.
func (b *logBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.w.Flush()
}

// Run flushes every flushEvery until ctx is done, then once more.
func (b *logBuffer) Run(ctx context.Context) {
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = b.Flush()
			return
		case <-t.C:
			_ = b.Flush()
		}
	}
}
