package route

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The hedge delay. A hedged read asks a second replica when the first has
// not answered within the delay; the delay should be what a read of a
// healthy node takes at worst, so that only reads slower than usual are
// hedged (5% of them, if the delay were the p95 of every read). A pool's
// reads are not one population, though: one slow node of three makes a
// third of them slow, and the p95 of them all is that node's latency,
// which hedges nothing. So each node's reads are measured apart, over the
// last one to two seconds, and the delay is the median of the nodes' p95s
// (the lower middle one for an even count): it follows the pool's typical
// node, and a minority of slow nodes does not raise it. It is clamped to
// HedgeMinDelay..HedgeMaxDelay, and is HedgeMaxDelay until some node has
// minSamples reads in its window.

// minSamples is the fewest reads a node's window needs for its p95 to
// count.
const minSamples = 20

// bucketBounds are the upper bounds of the latency buckets: about three
// per doubling from 50µs to 1s, then everything slower.
var bucketBounds = func() []time.Duration {
	var out []time.Duration
	for d := 50 * time.Microsecond; d <= time.Second; d = d * 5 / 4 {
		out = append(out, d)
	}
	return out
}()

// window counts one node's read latencies in two generations, the
// current one and the one before; updateDelays starts a new one every
// second.
type window struct {
	gen     atomic.Uint32
	buckets [2][]atomic.Uint64 // len(bucketBounds)+1 each
}

func newWindow() *window {
	w := &window{}
	for g := range w.buckets {
		w.buckets[g] = make([]atomic.Uint64, len(bucketBounds)+1)
	}
	return w
}

func (w *window) observe(d time.Duration) {
	i, _ := slices.BinarySearch(bucketBounds, d)
	w.buckets[w.gen.Load()&1][i].Add(1)
}

// p95 is the 95th percentile of both generations (the upper bound of its
// bucket), and false with fewer than minSamples reads.
func (w *window) p95() (time.Duration, bool) {
	counts := make([]uint64, len(bucketBounds)+1)
	var total uint64
	for g := range w.buckets {
		for i := range w.buckets[g] {
			c := w.buckets[g][i].Load()
			counts[i] += c
			total += c
		}
	}
	if total < minSamples {
		return 0, false
	}
	rank := (total*95 + 99) / 100
	var seen uint64
	for i, c := range counts {
		if seen += c; seen >= rank {
			if i == len(bucketBounds) {
				return bucketBounds[i-1] * 2, true // slower than the last bound
			}
			return bucketBounds[i], true
		}
	}
	return bucketBounds[len(bucketBounds)-1], true
}

// rotate starts a new generation, dropping the oldest.
func (w *window) rotate() {
	next := (w.gen.Load() + 1) & 1
	for i := range w.buckets[next] {
		w.buckets[next][i].Store(0)
	}
	w.gen.Store(next)
}

// latencies are a pool's windows, by node name. Reads look their node up
// in an immutable map; a node seen for the first time is added under mu.
type latencies struct {
	m  atomic.Pointer[map[string]*window]
	mu sync.Mutex
}

func (l *latencies) observe(node string, d time.Duration) {
	if m := l.m.Load(); m != nil {
		if w := (*m)[node]; w != nil {
			w.observe(d)
			return
		}
	}
	l.mu.Lock()
	old := l.m.Load()
	m := make(map[string]*window, 4)
	if old != nil {
		for k, w := range *old {
			m[k] = w
		}
	}
	w := m[node]
	if w == nil {
		w = newWindow()
		m[node] = w
	}
	l.m.Store(&m)
	l.mu.Unlock()
	w.observe(d)
}

// delay returns the median of the nodes' p95s, false if no node has
// enough reads, and starts a new generation in every window. Nodes not
// in keep (removed from the pool) are dropped.
func (l *latencies) delay(keep func(node string) bool) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.m.Load()
	if old == nil {
		return 0, false
	}
	var p95s []time.Duration
	m := make(map[string]*window, len(*old))
	for node, w := range *old {
		if !keep(node) {
			continue
		}
		m[node] = w
		if d, ok := w.p95(); ok {
			p95s = append(p95s, d)
		}
		w.rotate()
	}
	l.m.Store(&m)
	if len(p95s) == 0 {
		return 0, false
	}
	slices.Sort(p95s)
	return p95s[(len(p95s)-1)/2], true
}

// updateDelays sets every hedged pool's delay from its nodes' latencies.
func (r *Router) updateDelays() {
	t := r.t.Load()
	for _, v := range t.views {
		if v.read != ReadHedged {
			continue
		}
		nodes := map[string]bool{}
		for _, n := range v.c.Nodes() {
			nodes[n.Node] = true
		}
		d, ok := v.lat.delay(func(node string) bool { return nodes[node] })
		if !ok {
			d = r.opts.HedgeMaxDelay
		}
		d = min(max(d, r.opts.HedgeMinDelay), r.opts.HedgeMaxDelay)
		v.delay.Store(int64(d))
		r.m.hedgeDelay.WithLabelValues(v.name).Set(d.Seconds())
	}
}

// hedgeBudget caps a pool's hedges at a share of its reads: every read
// earns percent hundredths of a hedge, a hedge costs one, and at most
// hedgeBurst hedges are saved up.
type hedgeBudget struct {
	percent int64
	credit  atomic.Int64 // in hundredths of a hedge
}

// hedgeBurst is how many hedges a quiet pool saves up.
const hedgeBurst = 10

func (b *hedgeBudget) init(percent int) { b.percent = int64(percent) }

func (b *hedgeBudget) earn() {
	for {
		c := b.credit.Load()
		if c >= hedgeBurst*100 {
			return
		}
		if b.credit.CompareAndSwap(c, min(c+b.percent, hedgeBurst*100)) {
			return
		}
	}
}

// spend takes one hedge if the budget has it.
func (b *hedgeBudget) spend() bool {
	for {
		c := b.credit.Load()
		if c < 100 {
			return false
		}
		if b.credit.CompareAndSwap(c, c-100) {
			return true
		}
	}
}
