package procs

import (
	"context"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name             string
		cur, def         int
		used             float64
		quiet            int
		wantN, wantQuiet int
	}{
		{"one processor, light load", 1, 2, 0.3, 0, 1, 0},
		{"one processor, at the bound", 1, 2, upAbove, 0, 1, 0},
		{"one processor, past the bound", 1, 2, 0.81, 0, 2, 0},
		{"one processor, saturated", 1, 8, 1.02, 0, 8, 0},
		{"default, busy", 2, 2, 0.9, 5, 2, 0},
		{"default, at the lower bound", 2, 2, downBelow, 5, 2, 0},
		{"default, first quiet interval", 2, 2, 0.2, 0, 2, 1},
		{"default, quiet but not long enough", 2, 2, 0.2, downAfter - 2, 2, downAfter - 1},
		{"default, quiet long enough", 2, 2, 0.2, downAfter - 1, 1, 0},
		{"default, idle", 4, 4, 0, downAfter - 1, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, q := next(tc.cur, tc.def, tc.used, tc.quiet)
			if n != tc.wantN || q != tc.wantQuiet {
				t.Errorf("next(%d, %d, %v, %d) = %d, %d; want %d, %d", tc.cur, tc.def, tc.used, tc.quiet, n, q, tc.wantN, tc.wantQuiet)
			}
		})
	}
}

// fakeLoad is a process whose CPU use per interval the test sets, with
// the processors the Fitter asked for recorded.
type fakeLoad struct {
	mu   sync.Mutex
	cpu  time.Duration
	rate float64 // CPUs used from now on
	last time.Time
	sets []int
}

func (l *fakeLoad) CPU() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.cpu += time.Duration(l.rate * float64(now.Sub(l.last)))
	l.last = now
	return l.cpu
}

func (l *fakeLoad) setRate(r float64) {
	l.CPU()
	l.mu.Lock()
	l.rate = r
	l.mu.Unlock()
}

func (l *fakeLoad) Set(n int) {
	l.mu.Lock()
	l.sets = append(l.sets, n)
	l.mu.Unlock()
}

func (l *fakeLoad) Sets() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.sets...)
}

func waitProcs(t *testing.T, f *Fitter, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.Procs() != want {
		if time.Now().After(deadline) {
			t.Fatalf("Procs() = %d, want %d", f.Procs(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFitterFollowsLoad drives a Fitter with a process whose load goes
// from idle to busy and back, and checks what it sets: one processor
// after the quiet intervals, the default (Set(0)) once busy, and the
// default again when Run ends.
func TestFitterFollowsLoad(t *testing.T) {
	l := &fakeLoad{last: time.Now()}
	f := New(Options{Interval: 5 * time.Millisecond, CPU: l.CPU, Set: l.Set, Default: 4})
	if f.Procs() != 4 {
		t.Fatalf("before Run: Procs() = %d, want 4", f.Procs())
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()

	waitProcs(t, f, 1) // idle
	l.setRate(1.5)
	waitProcs(t, f, 4)
	l.setRate(0.6) // between the bounds: stays
	time.Sleep(20 * 5 * time.Millisecond)
	if f.Procs() != 4 {
		t.Fatalf("at 0.6 CPUs: Procs() = %d, want 4 (between the bounds nothing changes)", f.Procs())
	}
	l.setRate(0.1)
	waitProcs(t, f, 1)
	cancel()
	<-done
	if f.Procs() != 4 {
		t.Errorf("after Run: Procs() = %d, want 4", f.Procs())
	}
	if got, want := l.Sets(), []int{1, 0, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("Set calls %v, want %v", got, want)
	}
}

// TestFitterOneCPU checks that with a default of one processor Run sets
// nothing.
func TestFitterOneCPU(t *testing.T) {
	l := &fakeLoad{last: time.Now()}
	f := New(Options{Interval: time.Millisecond, CPU: l.CPU, Set: l.Set, Default: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	f.Run(ctx)
	if s := l.Sets(); len(s) != 0 {
		t.Errorf("Set calls %v, want none", s)
	}
}

// TestSetProcs checks the real setter: one processor, then the runtime's
// default again.
func TestSetProcs(t *testing.T) {
	def := runtime.GOMAXPROCS(0)
	if def == 1 || os.Getenv("GOMAXPROCS") != "" {
		t.Skipf("GOMAXPROCS is %d (environment %q): no default above one to return to", def, os.Getenv("GOMAXPROCS"))
	}
	setProcs(1)
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("after setProcs(1): GOMAXPROCS %d", n)
	}
	setProcs(0)
	if n := runtime.GOMAXPROCS(0); n != def {
		t.Errorf("after setProcs(0): GOMAXPROCS %d, want the default %d", n, def)
	}
}
