package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// gate is a log destination that blocks every write until opened, as a
// pipe nobody reads does.
type gate struct {
	open chan struct{}
	mu   sync.Mutex
	got  bytes.Buffer
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.got.Write(p)
}

func (g *gate) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.got.String()
}

// TestLogBufferNeverBlocks writes lines to a logBuffer whose destination
// blocks: every Write returns at once, lines past the backlog are dropped
// and counted, and when the destination takes lines again the rest come
// out in order, followed by the notice of what was dropped.
func TestLogBufferNeverBlocks(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	const backlog = 1000
	b := newLogBuffer(g, backlog)
	var notices []int
	var nmu sync.Mutex
	b.notice = func(n int) {
		nmu.Lock()
		notices = append(notices, n)
		nmu.Unlock()
		fmt.Fprintf(b, "dropped %d\n", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()

	start := time.Now()
	var want strings.Builder
	for i := range 500 { // 10 bytes each: 100 fit the backlog
		line := fmt.Sprintf("line %04d\n", i)
		if n, err := b.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if i < backlog/len(line) {
			want.WriteString(line)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("500 writes to a blocked destination took %v", took)
	}
	// Run may have taken some lines into the block it is stuck writing,
	// which makes room for as many more: at most backlog/10 of those.
	if d := b.Dropped(); d < 300 || d > 400 {
		t.Fatalf("Dropped = %d, want 400 less what the stuck block took", d)
	}
	close(g.open)
	time.Sleep(3 * flushEvery)
	cancel()
	<-done

	got := g.String()
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if !strings.HasPrefix(got, want.String()[:backlog/10]) { // the first lines, whatever the block took
		t.Fatalf("the log starts %q, want the first lines in order", got[:min(len(got), 40)])
	}
	last := lines[len(lines)-1]
	nmu.Lock()
	defer nmu.Unlock()
	if len(notices) != 1 || uint64(notices[0]) != b.Dropped() || last != fmt.Sprintf("dropped %d", b.Dropped()) {
		t.Fatalf("notices %v, last line %q; want one notice of all %d dropped, last", notices, last, b.Dropped())
	}
	if kept := len(lines) - 1; uint64(kept)+b.Dropped() != 500 {
		t.Fatalf("%d lines written and %d dropped, want 500 in all", kept, b.Dropped())
	}
}

// TestLogBufferBlocks checks that lines come out in blocks: nothing before
// flushAt bytes or the tick, everything, in order, by the end.
func TestLogBufferBlocks(t *testing.T) {
	var out syncBuf
	b := newLogBuffer(&out, logBacklog)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	start := time.Now()
	go func() { b.Run(ctx); close(done) }()
	line := strings.Repeat("x", 99) + "\n"
	for range flushAt / len(line) {
		b.Write([]byte(line))
	}
	if n := out.Len(); n != 0 && time.Since(start) < flushEvery/2 { // else the tick may have come
		t.Fatalf("%d bytes written before a block filled or the tick", n)
	}
	var want strings.Builder
	want.WriteString(strings.Repeat(line, flushAt/len(line)))
	for range 10 {
		b.Write([]byte(line)) // past flushAt: Run is kicked
		want.WriteString(line)
	}
	deadline := time.Now().Add(flushEvery / 2)
	for out.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if out.Len() == 0 {
		t.Fatalf("nothing written %v after %d bytes piled up", flushEvery/2, flushAt)
	}
	b.Write([]byte("last\n"))
	want.WriteString("last\n")
	cancel()
	<-done
	if got := out.String(); got != want.String() || b.Dropped() != 0 {
		t.Fatalf("wrote %d bytes, dropped %d; want %d bytes in order, none dropped", len(got), b.Dropped(), want.Len())
	}
}

// syncBuf is a bytes.Buffer safe for concurrent use.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
