package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// heapFloor is the least heap goal the collector is given when GOGC is
// not set: a collection once the heap has grown to 16 MiB at least,
// not at Go's minimum of 4 MiB. A gateway's live heap is a few MiB
// under light or moderate load (3 MiB with 64 keep-alive clients) and
// what it allocates per request is short-lived, so at the minimum it
// collects 30–45 times a second at 40k requests a second, each cycle
// scanning every goroutine's stack and the globals for the same few
// MiB: a tenth of its CPU per request (docs/decisions/0066). Above
// 8 MiB of live heap the floor no longer raises the goal, which stays
// GOGC=100's (the live heap twice over), so the memory bounds of
// docs/security.md hold as before; a soft memory limit (GOMEMLIMIT, or
// the cgroup's) caps the goal, floor included.
const heapFloor = 16 << 20

// gcFloor keeps the collector's heap goal at least floor while it runs:
// after every collection it sets the GC percentage from the live heap
// that collection found, 100 or the percentage that puts the goal at
// floor, whichever is larger. It learns of collections through a
// finalizer, run by the runtime's finalizer goroutine; it starts no
// goroutine of its own.
type gcFloor struct {
	floor  uint64
	mu     sync.Mutex // serialises tune and stop
	done   bool
	sample []metrics.Sample
}

// startGCFloor starts keeping the heap goal at least floor bytes. It is
// for a process whose GOGC is not set, which stop leaves at GOGC=100,
// the runtime's default.
func startGCFloor(floor uint64) *gcFloor {
	g := &gcFloor{floor: floor, sample: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"},
	}}
	g.tune()
	g.arm()
	return g
}

// gcSentinel is garbage made for its finalizer, which runs after the
// collection that finds it unreachable. It holds a pointer so that the
// allocator never packs it with other small objects (a finalizer on
// such an object may never run).
type gcSentinel struct{ _ *byte }

func (g *gcFloor) arm() {
	runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) {
		if g.tune() {
			g.arm()
		}
	})
}

// tune sets the GC percentage for the live heap the last collection
// found; false once stop has run.
func (g *gcFloor) tune() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return false
	}
	metrics.Read(g.sample)
	var v [3]uint64 // 0 for a metric missing
	for i, s := range g.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	debug.SetGCPercent(gcPercent(v[0], v[0]+v[1]+v[2], g.floor))
	return true
}

// gcPercent is the GC percentage that puts the heap goal at floor, or
// 100 if GOGC=100's goal is that much already. The runtime's goal is
// the larger of live + base*p/100, base being the live heap plus the
// stacks and the globals it scans (Go 1.18 on), and a minimum of
// runtimeHeapMin*p/100; so p is at most the one whose minimum is floor,
// or the minimum alone would put the goal above it. That bound also
// keeps the goal at floor before the first collection, when the live
// heap reads 0 (a percentage made of that would put off the collection,
// and every later one, without end: a finalizer runs only after a
// collection).
func gcPercent(live, base, floor uint64) int {
	base = max(base, live, 1)
	if live+base >= floor {
		return 100
	}
	p := ((floor-live)*100 + base - 1) / base // rounded up: the goal is not under floor
	return int(max(min(p, floor*100/runtimeHeapMin), 100))
}

// runtimeHeapMin is the Go runtime's least heap goal at GOGC=100
// (defaultHeapMinimum in runtime/mgcpacer.go), which it scales with the
// GC percentage.
const runtimeHeapMin = 4 << 20

// stop ends the tuning and puts the GC percentage back to the default,
// 100. A nil gcFloor does nothing.
func (g *gcFloor) stop() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.done {
		g.done = true
		debug.SetGCPercent(100)
	}
}
