//go:build linux

package abuse

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// attack is one row of the suite: how to run it against a fresh gateway.
type attack struct {
	name   string
	size   string            // for the report
	window time.Duration     // how long the attack is held at least once under way (canaryWindow if zero)
	mcMB   int               // memcached -m (memcachedMB if zero)
	env    map[string]string // the gateway's settings beyond the defaults
	// prepare, if not nil, runs before the canary starts (store the
	// value an attack reads, say).
	prepare func(t *testing.T, r *rig)
	// run carries out the attack: it sets it up, calls hold once the
	// attack is under way (hold returns when the canary has seen enough),
	// stops it, closing every connection it opened, and returns what it
	// got.
	run func(t *testing.T, r *rig, hold func()) result
}

// result is what an attacker got.
type result struct {
	got   string        // what came back, for the report
	setup time.Duration // to open its connections (0: nothing to open)
	// accepted lists the keys answered 202; with check, they must all be
	// in memcached once the async queue is empty (c).
	accepted []string
	check    func(key string, value []byte) bool
	notes    []string
}

// observation is everything measured around one attack.
type observation struct {
	res      result
	canary   [nKinds]*summary // requests begun while the attack ran
	redials  int              // canary keep-alive connections reopened
	peak     int64            // VmHWM
	rss      [2]int64         // VmRSS before the attack, after recovery
	base     map[string]float64
	gauges   *gaugeWatch
	rec      recovery
	lost     int // of res.accepted, when res.check is set
	drained  time.Duration
	async    map[string]float64 // gauges after the loss check
	checked  bool               // the loss check ran
	gwEvents string
}

// runAttack runs a on a fresh memcached and gateway with the canary on,
// logs its row, asserts (a)–(d) and returns the row for the report.
func runAttack(t *testing.T, a attack) row {
	t.Helper()
	o := observe(t, a)
	out := o.row(a)
	t.Logf("| %s | %s | setup %s | peak RSS %s | canary keep-alive %s | new conn %s | not 200 in 1 s: %s | attacker got %s | lost 202s %s | recovery %s | %s |",
		out.attack, out.size, out.setup, out.peakRSS, out.keepAlive, out.newConn, out.canaryBad, out.got, out.lost, out.recovery, out.notes)
	for kind, s := range o.canary {
		verdict := "meets"
		if s.n == 0 || s.p50 > targetP50 {
			verdict = "MISSES"
		}
		t.Logf("canary %s p50 %s %s the %s target", connKind(kind), dur(s.p50), verdict, dur(targetP50))
	}
	if o.gwEvents != "" {
		t.Logf("gateway log, other than access lines (last 20):\n%s", o.gwEvents)
	}
	o.assert(t)
	return out
}

// observe runs a and measures.
func observe(t *testing.T, a attack) *observation {
	t.Helper()
	ctx := t.Context()
	r := newRig(t, orDefault(a.mcMB, memcachedMB), a.env)
	if a.prepare != nil {
		a.prepare(t, r)
	}
	r.put(t, canaryKey, []byte(canaryValue))
	o := &observation{}
	var err error
	if o.base, err = r.gauges(ctx); err != nil {
		t.Fatalf("metrics before the attack: %v", err)
	}
	if o.rss[0], _, err = procMem(r.pid); err != nil {
		t.Fatalf("gateway memory: %v", err)
	}
	mem := watchMem(r.pid)
	gauges := r.watchGauges(ctx)
	c := startCanary(t, r.gw.DataAddr)

	start := time.Now()
	o.res = a.run(t, r, func() { c.hold(orDefault(a.window, canaryWindow), holdLimit, holdSamples) })
	stopped := time.Now()
	o.rec = r.recover(ctx, c, stopped, o.base[mGoroutines])
	c.close()
	o.gauges = gauges.finish()
	if o.peak, o.rss[1], err = mem.finish(); err != nil {
		t.Errorf("reading the gateway's memory: %v", err)
	}
	for kind := range nKinds {
		o.canary[kind] = c.summarize(kind, start, stopped, canaryBound)
	}
	o.redials = c.redials

	if o.res.check != nil {
		o.checked = true
		o.lost, o.drained = r.lostWrites(t, o.res.accepted, o.res.check)
		o.async, _ = r.gauges(ctx)
	}
	o.gwEvents = r.events(20)
	return o
}

// row formats the observation for the report.
func (o *observation) row(a attack) row {
	out := row{
		attack: a.name, size: a.size, setup: "—", peakRSS: size(o.peak) + " (heap " + size(int64(o.gauges.maxHeap)) + ")",
		keepAlive: o.canary[keepAlive].String(), newConn: o.canary[newConn].String(), canaryBad: "none",
		got: o.res.got, lost: "—", recovery: o.rec.String(),
	}
	if o.res.setup > 0 {
		out.setup = dur(o.res.setup)
	}
	var bad []string
	for kind, s := range o.canary {
		if s.bad.total() > 0 {
			bad = append(bad, connKind(kind).String()+": "+s.bad.String())
		}
	}
	if len(bad) > 0 {
		out.canaryBad = strings.Join(bad, "; ")
	}
	g := o.gauges
	notes := append([]string{}, o.res.notes...)
	if g.minNodeUp < 1 {
		notes = append(notes, fmt.Sprintf("node ejected (node_up %v)", g.minNodeUp))
	}
	if g.maxQueue > 0 {
		notes = append(notes, "async queue max "+thousands(int(g.maxQueue)))
	}
	if g.failures > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d metrics scrapes failed", g.failures, g.scrapes+g.failures))
	}
	notes = append(notes,
		"in flight max "+thousands(int(g.maxInFlight)),
		fmt.Sprintf("goroutines %.0f → max %.0f → %.0f", o.base[mGoroutines], g.maxGoroutines, o.rec.goroutines),
		"RSS "+size(o.rss[0])+" → "+size(o.rss[1]))
	if o.redials > 0 {
		notes = append(notes, fmt.Sprintf("canary keep-alive reopened %d×", o.redials))
	}
	if o.checked {
		n := len(o.res.accepted)
		out.lost = thousands(o.lost) + " of " + thousands(n)
		if n > 0 {
			out.lost += fmt.Sprintf(" (%.0f%%)", 100*float64(o.lost)/float64(n))
		}
		notes = append(notes, fmt.Sprintf("async applied %s failed %s rejected %s, queue drained in %s",
			thousands(int(o.async[mApplied])), thousands(int(o.async[mFailed])), thousands(int(o.async[mRejected])), dur(o.drained)))
	}
	out.notes = strings.Join(notes, "; ")
	return out
}

// assert checks the targets, after the figures are logged, so that a
// failing attack still reports all of them.
func (o *observation) assert(t *testing.T) {
	t.Helper()
	for kind, s := range o.canary {
		if s.n == 0 {
			t.Errorf("(a) canary %s: no request during the attack", connKind(kind))
		} else if s.bad.total() > 0 {
			t.Errorf("(a) canary %s: %d of %d requests not answered 200 within %v (%s); max %s",
				connKind(kind), s.bad.total(), s.n, canaryBound, s.bad.String(), dur(s.max))
		}
	}
	if o.peak > rssBound {
		t.Errorf("(b) peak RSS %s, want ≤ %s", size(o.peak), size(rssBound))
	}
	if heap := int64(o.gauges.maxHeap); heap > rssBound {
		t.Errorf("(b) Go heap in use reached %s (reserved, if RSS stayed lower), want ≤ %s", size(heap), size(rssBound))
	}
	if o.lost > 0 {
		t.Errorf("(c) %d of %d writes answered 202 are not in memcached, which stayed up", o.lost, len(o.res.accepted))
	}
	if o.rec.took == 0 {
		t.Errorf("(d) not recovered %v after the attacker stopped: %s", recoverWithin, strings.Join(o.rec.missing, ", "))
	}
}

// orDefault returns v, or def if v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
