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

// fakeLoad is a process whose CPU use the test sets, with
// the processors the Fitter asked for recorded.
type fakeLoad struct {
	mu   sync.Mutex
	cpu  time.Duration
	rate float64 // CPUs used from now on
	last time.Time
	sets []int
}

func newFakeLoad() *fakeLoad { return &fakeLoad{last: time.Now()} }

func (l *fakeLoad) CPU() (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.cpu += time.Duration(l.rate * float64(now.Sub(l.last)))
	l.last = now
	return l.cpu, true
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
	return slices.Clone(l.sets)
}

func (l *fakeLoad) fitter(def int) *Fitter {
	return New(Options{CPU: l.CPU, Set: l.Set, Default: def})
}

// ticks runs n of f's intervals of about 2 ms each, driven by the test.
func ticks(f *Fitter, n int) {
	for range n {
		time.Sleep(2 * time.Millisecond)
		f.tick()
	}
}

// TestFitterFollowsLoad drives a Fitter interval by interval through a
// load that goes from idle to busy and back, and checks the processors it
// sets.
func TestFitterFollowsLoad(t *testing.T) {
	l := newFakeLoad()
	f := l.fitter(4)
	if f.Procs() != 4 {
		t.Fatalf("before Run: Procs() = %d, want 4", f.Procs())
	}
	f.start()
	step := func(what string, n int, want int) {
		t.Helper()
		ticks(f, n)
		if f.Procs() != want {
			t.Fatalf("%s: Procs() = %d, want %d (sets %v)", what, f.Procs(), want, l.Sets())
		}
	}
	step("idle, not yet for downAfter intervals", downAfter-1, 4)
	step("idle for downAfter intervals", 1, 1)
	step("light load on one processor", 20, 1)
	l.setRate(1.5)
	step("busy", 1, 4)
	l.setRate(0.6)
	step("between the bounds", 30, 4)
	l.setRate(0.1)
	step("quiet again", downAfter, 1)
	if got, want := l.Sets(), []int{1, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("Set calls %v, want %v", got, want)
	}
}

// TestFitterUnreadableCPU checks that an interval whose CPU time could
// not be read changes nothing and that the next one is measured from it.
func TestFitterUnreadableCPU(t *testing.T) {
	l := newFakeLoad()
	ok := true
	f := New(Options{
		CPU: func() (time.Duration, bool) {
			c, _ := l.CPU()
			if !ok {
				return 0, false
			}
			return c, true
		},
		Set: l.Set, Default: 2,
	})
	l.setRate(0.3)
	f.start()
	ticks(f, downAfter)
	if f.Procs() != 1 {
		t.Fatalf("Procs() = %d, want 1", f.Procs())
	}
	ok = false
	ticks(f, 1)
	ok = true
	ticks(f, 3) // from a reading of 0 the next would read as a spike
	if f.Procs() != 1 {
		t.Errorf("after an unreadable interval: Procs() = %d, want 1 (sets %v)", f.Procs(), l.Sets())
	}
}

// TestRunRestoresDefault checks that Run sets one processor on an idle
// load and restores the default when its context ends.
func TestRunRestoresDefault(t *testing.T) {
	l := newFakeLoad()
	f := New(Options{Interval: time.Millisecond, CPU: l.CPU, Set: l.Set, Default: 4})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for f.Procs() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("idle: Procs() = %d, want 1", f.Procs())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if f.Procs() != 4 {
		t.Errorf("after Run: Procs() = %d, want 4", f.Procs())
	}
	if s := l.Sets(); len(s) == 0 || s[len(s)-1] != 0 {
		t.Errorf("Set calls %v, want the last to restore the default (0)", s)
	}
}

// TestFitterOneCPU checks that with a default of one processor Run sets
// nothing.
func TestFitterOneCPU(t *testing.T) {
	l := newFakeLoad()
	f := New(Options{Interval: time.Millisecond, CPU: l.CPU, Set: l.Set, Default: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	f.Run(ctx)
	if s := l.Sets(); len(s) != 0 {
		t.Errorf("Set calls %v, want none", s)
	}
}

// TestProcessCPU checks the real reading: the process's CPU time grows
// with work.
func TestProcessCPU(t *testing.T) {
	c0, ok := processCPU()
	if !ok {
		t.Fatal("processCPU: no reading")
	}
	for deadline := time.Now().Add(20 * time.Millisecond); time.Now().Before(deadline); {
	}
	if c1, _ := processCPU(); c1 <= c0 {
		t.Errorf("CPU time %v after 20 ms of work, %v before", c1, c0)
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
