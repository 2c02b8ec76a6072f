package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

func TestGCPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, base, floor uint64
		want              int
	}{
		{3 * mib, 3 * mib, 16 * mib, 400},     // 3 + 3*4 = 15 MiB, the runtime's minimum 16 MiB
		{3 * mib, 5 * mib, 16 * mib, 260},     // stacks and globals count: 3 + 5*2.6 = 16 MiB
		{4 * mib, 4 * mib, 16 * mib, 300},     // the goal exactly the floor
		{6 * mib, 6 * mib, 16 * mib, 167},     // rounded up: 6 + 6*1.67 = 16.02 MiB
		{0, 0, 16 * mib, 400},                 // before the first collection: the minimum, 16 MiB
		{mib, 2 * mib, 16 * mib, 400},         // bounded by the minimum
		{8*mib - 1, 8*mib - 1, 16 * mib, 101}, // a byte under half the floor
		{8 * mib, 8 * mib, 16 * mib, 100},     // GOGC=100's goal is the floor already
		{6 * mib, 10 * mib, 16 * mib, 100},    // so it is with stacks and globals
		{1 << 40, 1 << 40, 16 * mib, 100},     // far above
		{8 * mib, 8 * mib, 64 * mib, 700},     // another floor
		{mib, mib, 64 * mib, 1600},            // its minimum: 4 MiB * 16
		{0, 0, 2 * mib, 100},                  // a floor under the runtime's minimum: nothing to do
		{0, 0, 0, 100},                        // no floor
	} {
		if got := gcPercent(tc.live, tc.base, tc.floor); got != tc.want {
			t.Errorf("gcPercent(%d, %d, %d) = %d, want %d", tc.live, tc.base, tc.floor, got, tc.want)
		}
	}
}

// heapGoal is the collector's current heap goal.
func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// gcPercentNow reads the GC percentage (setting it back as it was).
func gcPercentNow() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// The floor raises the heap goal at once, keeps it up after collections
// (the finalizer sets it again when something else changed it), and
// stop leaves the default behind, which later collections keep.
func TestGCFloor(t *testing.T) {
	defer debug.SetGCPercent(gcPercentNow())
	const floor = 32 << 20 // above the test binary's GOGC=100 goal
	if goal := heapGoal(); goal >= floor {
		t.Skipf("heap goal %d before start: at the floor already", goal)
	}
	g := startGCFloor(floor)
	defer g.stop()
	if goal := heapGoal(); goal < floor {
		t.Fatalf("heap goal %d after start, want at least %d", goal, floor)
	}
	debug.SetGCPercent(100) // as if changed behind its back: the next collection's finalizer sets it again
	for i := 0; heapGoal() < floor; i++ {
		if i == 1000 {
			t.Fatalf("heap goal %d after %d collections, want at least %d", heapGoal(), i, floor)
		}
		runtime.GC()
		runtime.Gosched() // the finalizer goroutine runs the tuning
	}
	g.stop()
	if p := gcPercentNow(); p != 100 {
		t.Fatalf("GC percent %d after stop, want 100", p)
	}
	for range 3 {
		runtime.GC()
		runtime.Gosched()
	}
	if p := gcPercentNow(); p != 100 {
		t.Errorf("GC percent %d after stop and collections, want 100", p)
	}
	g.stop() // twice: nothing
}
