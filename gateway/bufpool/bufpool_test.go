package bufpool

import (
	"testing"
	"time"
)

func TestGetCapacity(t *testing.T) {
	tests := []struct {
		n, want int
	}{
		{-1, MinSize},
		{0, MinSize},
		{1, MinSize},
		{MinSize, MinSize},
		{MinSize + 1, 2 * MinSize},
		{100_000, 128 << 10},
		{128 << 10, 128 << 10},
		{1_000_000, MaxSize},
		{MaxSize, MaxSize},
		{MaxSize + 1, MaxSize + 1},
		{3 << 20, 3 << 20},
	}
	p := New(4 << 20)
	for _, tt := range tests {
		b := p.Get(tt.n)
		if len(b) != 0 || cap(b) != tt.want {
			t.Errorf("Get(%d): len %d cap %d, want 0 and %d", tt.n, len(b), cap(b), tt.want)
		}
	}
}

// TestReuse checks that a buffer given back is lent again from its own
// class, whole, and that buffers of no class are not kept.
func TestReuse(t *testing.T) {
	tests := []struct {
		name string
		put  []byte
		get  int  // the Get after the Put
		same bool // the same array comes back
	}{
		{"small class", make([]byte, 10, 8<<10), 5000, true},
		{"smallest", make([]byte, 0, MinSize), 1, true},
		{"large class", make([]byte, 10, 64<<10), 40_000, true},
		{"largest", make([]byte, MaxSize), MaxSize, true},
		{"other class", make([]byte, 0, 64<<10), 100_000, false},
		{"not a class", make([]byte, 0, 100_000), 100_000, false},
		{"too small", make([]byte, 0, MinSize/2), 1, false},
		{"too large", make([]byte, 0, 2*MaxSize), 2 * MaxSize, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New(4 << 20)
			tt.put = tt.put[:cap(tt.put)]
			var b []byte
			same := false
			// Under the race detector a sync.Pool drops a quarter of
			// what it is given: a kept buffer comes back within tries.
			for range 20 {
				p.Put(tt.put[:1])
				b = p.Get(tt.get)
				if same = cap(b) > 0 && &b[:1][0] == &tt.put[0]; same {
					break
				}
			}
			if same != tt.same {
				t.Fatalf("Get(%d) after Put(cap %d): same array %v, want %v", tt.get, cap(tt.put), same, tt.same)
			}
			if same && (len(b) != 0 || cap(b) != cap(tt.put)) {
				t.Errorf("reused buffer: len %d cap %d, want 0 and %d", len(b), cap(b), cap(tt.put))
			}
		})
	}
}

// TestLargeKeptBounded checks that large buffers are kept up to the
// Pool's bytes and no further, and that Get takes them out of the count.
func TestLargeKeptBounded(t *testing.T) {
	tests := []struct {
		name     string
		max      int
		put      []int // capacities given back, in order
		wantKept int
	}{
		{"within", 1 << 20, []int{256 << 10, 512 << 10}, 768 << 10},
		{"up to the bound", 1 << 20, []int{512 << 10, 512 << 10}, 1 << 20},
		{"past the bound", 1 << 20, []int{512 << 10, 512 << 10, 32 << 10}, 1 << 20},
		{"larger than the bound", 512 << 10, []int{MaxSize}, 0},
		{"none kept", 0, []int{32 << 10}, 0},
		{"small ones not counted", 0, []int{MinSize, SmallMax}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New(tt.max)
			for _, n := range tt.put {
				p.Put(make([]byte, 0, n))
			}
			if got := p.Kept(); got != tt.wantKept {
				t.Fatalf("Kept() = %d, want %d", got, tt.wantKept)
			}
			for _, n := range tt.put {
				if n > SmallMax {
					p.Get(n)
				}
			}
			if got := p.Kept(); got != 0 {
				t.Errorf("Kept() after taking every class back = %d, want 0", got)
			}
		})
	}
}

func TestNilPool(t *testing.T) {
	var p *Pool
	b := p.Get(10)
	if cap(b) != MinSize {
		t.Fatalf("nil Pool Get(10): cap %d, want %d", cap(b), MinSize)
	}
	p.Put(b) // dropped, no panic
	if p.Kept() != 0 {
		t.Fatal("a nil Pool keeps something")
	}
}

func TestGetAllocatesNothingWhenReused(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes a sync.Pool drop some of what it is given")
	}
	for _, n := range []int{5000, 100_000} {
		p := New(1 << 20)
		p.Put(p.Get(n))
		allocs := testing.AllocsPerRun(100, func() {
			p.Put(p.Get(n))
		})
		if allocs != 0 {
			t.Errorf("Get and Put of %d bytes: %.1f allocations, want 0", n, allocs)
		}
	}
}

func TestSetMax(t *testing.T) {
	p := New(1 << 20)
	for _, n := range []int{512 << 10, 256 << 10, 64 << 10, 64 << 10} {
		p.Put(make([]byte, 0, n))
	}
	p.SetMax(300 << 10) // the largest go first: 512 KiB, then 256 KiB
	if got, want := p.Kept(), 2*64<<10; got != want {
		t.Fatalf("Kept() after SetMax(300 KiB) = %d, want %d", got, want)
	}
	p.SetMax(2 << 20)
	p.Put(make([]byte, 0, MaxSize))
	if got, want := p.Kept(), 2*64<<10+MaxSize; got != want {
		t.Errorf("Kept() after a raised max and a Put = %d, want %d", got, want)
	}
	var nilPool *Pool
	nilPool.SetMax(1) // ignored
}

// TestIdleBuffersGo checks that a sweep lets go of the large buffers
// kept for the idle time and keeps the younger ones, and that the timer
// sweeps until nothing is kept and is set again by the next Put.
func TestIdleBuffersGo(t *testing.T) {
	p := New(4 << 20)
	p.idle = time.Hour // the sweep is called by hand first
	p.Put(make([]byte, 0, 64<<10))
	p.Put(make([]byte, 0, 256<<10))
	p.Put(make([]byte, 0, 64<<10))
	p.mu.Lock()
	old := time.Now().Add(-2 * time.Hour)
	p.large[class(64<<10)-small][0].at = old  // the first 64 KiB
	p.large[class(256<<10)-small][0].at = old // the 256 KiB
	p.mu.Unlock()
	p.sweepIdle()
	if got, want := p.Kept(), 64<<10; got != want {
		t.Fatalf("Kept() after a sweep = %d, want %d (the younger 64 KiB)", got, want)
	}
	if b := p.Get(64 << 10); cap(b) != 64<<10 {
		t.Fatalf("Get after the sweep: cap %d", cap(b))
	}

	p = New(4 << 20)
	p.idle = 20 * time.Millisecond
	for range 2 {
		p.Put(make([]byte, 0, 64<<10))
		waitKept(t, p, 0)
		for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
			p.mu.Lock()
			armed := p.armed
			p.mu.Unlock()
			if !armed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the sweep is still set with nothing kept")
			}
		}
	}
}

// waitKept waits up to a second for p to keep want bytes.
func waitKept(t *testing.T, p *Pool, want int) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); p.Kept() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Kept() = %d after a second, want %d", p.Kept(), want)
		}
	}
}
