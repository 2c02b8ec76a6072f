package loggate

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestPass: the first event passes, then one a second at most; the one
// that passes says how many were held back before it; a clock stepped
// back by a second or more lets the next event through.
func TestPass(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()
	steps := []struct {
		at   time.Duration // since base
		ok   bool
		held uint64
	}{
		{0, true, 0},                                     // the first
		{time.Nanosecond, false, 0},                      // held
		{999 * time.Millisecond, false, 0},               // held
		{time.Second, true, 2},                           // a second after the last that passed
		{time.Second, false, 0},                          // the same instant
		{1500 * time.Millisecond, false, 0},              // held
		{3 * time.Second, true, 2},                       // after a quiet spell, the two before it
		{3*time.Second + time.Second - 1, false, 0},      // a nanosecond short
		{4 * time.Second, true, 1},                       // exactly a second
		{4*time.Second - 500*time.Millisecond, false, 0}, // the clock back by less than a second: held
		{3*time.Second - time.Nanosecond, true, 1},       // back by more than a second: passes
		{3 * time.Second, false, 0},                      // and counts from there
		{4*time.Second - time.Nanosecond, true, 1},
	}
	var g Gate
	for i, st := range steps {
		held, ok := g.pass(base + int64(st.at))
		if ok != st.ok || held != st.held {
			t.Errorf("step %d (at %v): pass = %d, %v; want %d, %v", i, st.at, held, ok, st.held, st.ok)
		}
	}
}

// TestPassConcurrent: of events at one instant from many goroutines,
// one passes; it and the next to pass count all the others between them
// (one held back while the first passed may be counted in either).
func TestPassConcurrent(t *testing.T) {
	const n = 64
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()
	var g Gate
	var wg sync.WaitGroup
	var passed, firstHeld atomic.Uint64
	for range n {
		wg.Go(func() {
			if held, ok := g.pass(base); ok {
				passed.Add(1)
				firstHeld.Store(held)
			}
		})
	}
	wg.Wait()
	if p := passed.Load(); p != 1 {
		t.Fatalf("%d of %d events at one instant passed, want 1", p, n)
	}
	held, ok := g.pass(base + int64(Every))
	if !ok || firstHeld.Load()+held != n-1 {
		t.Errorf("a second later: pass = %d, %v, and the first held %d; want %d held in all, true", held, ok, firstHeld.Load(), n-1)
	}
}

// TestPassNow: Pass reads the clock (synctest's, which moves only when
// every goroutine of the test waits): the first event passes, one right
// after it is held, one a second later passes.
func TestPassNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Gate
		if _, ok := g.Pass(); !ok {
			t.Fatal("the first event was held")
		}
		if _, ok := g.Pass(); ok {
			t.Fatal("an event right after the first passed")
		}
		time.Sleep(Every)
		if held, ok := g.Pass(); !ok || held != 1 {
			t.Fatalf("a second later: Pass = %d, %v; want 1, true", held, ok)
		}
	})
}
