// Package procs fits the number of processors Go schedules the gateway's
// goroutines on (GOMAXPROCS) to its load: one while the gateway uses less
// than half a CPU, the runtime's default as soon as it uses most of one.
//
// A lightly loaded gateway with idle processors pays for them on every
// request: each hand-off between goroutines (the accepted connection, the
// memcached reply) wakes a thread for an idle processor, which spins,
// polls the network and sleeps again. On a host whose CPUs other programs
// use (PHP pages calling the gateway, each with a connection of its own)
// those wake-ups are most of the gateway's cost per request; with one
// processor there is no idle one to wake.
//
// The load is the CPU time the gateway got, not what it would have used:
// on a host whose CPUs are taken by programs that do not wait for the
// gateway, one processor gets it a smaller share of them than several,
// and requests that compute for long wait behind each other. Decision
// 0023 in docs/decisions has the measurements; the fitting is off unless
// configured.
package procs

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"
)

const (
	// upAbove is the CPUs used over one interval on one processor past
	// which the runtime's default is restored: one processor is then
	// nearly full and requests would queue for it.
	upAbove = 0.8
	// downBelow is the CPUs used with the default processors under which
	// an interval counts as quiet; downAfter quiet intervals in a row go
	// back to one processor. The gap between the two keeps a load near
	// either bound from switching back and forth.
	downBelow = 0.5
	downAfter = 10
	// DefaultInterval is how often the load is read.
	DefaultInterval = 100 * time.Millisecond
)

// Options configure a Fitter. The zero value reads the process's CPU time
// and sets the runtime's processors, every DefaultInterval.
type Options struct {
	Interval time.Duration // how often the load is read; DefaultInterval if 0
	// CPU returns the process's CPU time so far and whether it could be
	// read; getrusage if nil.
	CPU func() (time.Duration, bool)
	// Set schedules on n processors, or on the runtime's default if n is
	// 0; runtime.GOMAXPROCS and runtime.SetDefaultGOMAXPROCS if nil.
	Set func(n int)
	// Default is the number of processors Set(0) restores;
	// runtime.GOMAXPROCS(0) when New is called if 0.
	Default int
}

// Fitter switches the runtime between one processor and its default
// number of them as the load asks. Its zero value is not usable; call New.
type Fitter struct {
	interval time.Duration
	cpu      func() (time.Duration, bool)
	set      func(n int)
	def      int
	procs    atomic.Int32 // what Set was last asked for: 1 or def

	// The last reading and the rule's state, Run's alone.
	lastCPU time.Duration
	lastAt  time.Time
	quiet   int
}

// New returns a Fitter. It changes nothing until Run.
func New(o Options) *Fitter {
	f := &Fitter{interval: o.Interval, cpu: o.CPU, set: o.Set, def: o.Default}
	if f.interval <= 0 {
		f.interval = DefaultInterval
	}
	if f.cpu == nil {
		f.cpu = processCPU
	}
	if f.set == nil {
		f.set = setProcs
	}
	if f.def <= 0 {
		f.def = runtime.GOMAXPROCS(0)
	}
	f.procs.Store(int32(f.def))
	return f
}

// Procs returns the processors the Fitter last set: 1, or the default.
func (f *Fitter) Procs() int { return int(f.procs.Load()) }

// Run reads the load every interval and sets the processors until ctx is
// done, then restores the runtime's default. It is called once. With a
// default of one processor there is nothing to fit and it only waits for
// ctx.
func (f *Fitter) Run(ctx context.Context) {
	if f.def <= 1 {
		<-ctx.Done()
		return
	}
	defer func() {
		if f.Procs() != f.def {
			f.set(0)
			f.procs.Store(int32(f.def))
		}
	}()
	t := time.NewTicker(f.interval)
	defer t.Stop()
	f.start()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.tick()
		}
	}
}

// start takes the first reading.
func (f *Fitter) start() {
	f.lastCPU, _ = f.cpu()
	f.lastAt = time.Now()
}

// tick reads the load since the last reading and sets the processors the
// rule asks for. The time is taken after the CPU time, not when the tick
// was due, so that a late tick does not read as a busy interval.
func (f *Fitter) tick() {
	c, ok := f.cpu()
	now := time.Now()
	wall := now.Sub(f.lastAt)
	if !ok || wall <= 0 {
		return // no reading: the next one covers this interval too
	}
	used := float64(c-f.lastCPU) / float64(wall)
	f.lastCPU, f.lastAt = c, now
	cur := f.Procs()
	n, q := next(cur, f.def, used, f.quiet)
	f.quiet = q
	if n != cur {
		if n == f.def {
			f.set(0)
		} else {
			f.set(n)
		}
		f.procs.Store(int32(n))
	}
}

// next is the rule: from one processor to def once an interval used more
// than upAbove CPUs, from def to one after downAfter intervals in a row
// under downBelow. quiet counts those intervals.
func next(cur, def int, used float64, quiet int) (procs, quietAfter int) {
	if cur < def {
		if used > upAbove {
			return def, 0
		}
		return cur, 0
	}
	if used >= downBelow {
		return cur, 0
	}
	if quiet+1 >= downAfter {
		return 1, 0
	}
	return cur, quiet + 1
}

// setProcs is Options.Set's default: n processors, or the runtime's
// default (which goes on following a container's CPU limit) if n is 0.
func setProcs(n int) {
	if n == 0 {
		runtime.SetDefaultGOMAXPROCS()
		return
	}
	runtime.GOMAXPROCS(n)
}
