// Package loggate keeps a log line that any client, or one node going
// down, can set off at any rate to a line a second at most: a Gate lets
// one event a second through and counts the ones it holds back, so that
// the line that passes can say how many went unlogged. An event held
// back costs an atomic load and an atomic add, no lock. It imports only
// the standard library and lives under upstream/ so that every package
// that logs such lines, upstream/route the lowest, imports it downward
// (docs/decisions/0040-one-log-gate-below-every-layer.md).
package loggate

import (
	"sync/atomic"
	"time"
)

// Every is the least time between two events a Gate lets through.
const Every = time.Second

// Gate lets through the first event and then one event a second at most,
// and counts the events it holds back. The zero value is ready; it is
// safe for concurrent use and must not be copied after first use.
//
// Time is the wall clock's, in Unix nanoseconds, so that the state is one
// atomic word: a clock stepped back by a second or more lets the next
// event through at once rather than hold every event until the clock
// catches up.
type Gate struct {
	last atomic.Int64  // when an event last passed, in Unix nanoseconds; 0: none yet
	held atomic.Uint64 // events held back since that one, or since the start
}

// Pass reports whether an event that happens now may be logged, and if
// so how many events the Gate held back before it (since the last one
// that passed, or since the start). Each held-back event is counted in
// exactly one later event's held, that of the next to pass; an event
// held back while another passes at the same instant may be counted in
// that one's.
func (g *Gate) Pass() (held uint64, ok bool) { return g.pass(time.Now().UnixNano()) }

// pass is Pass for an event at now, in Unix nanoseconds.
func (g *Gate) pass(now int64) (uint64, bool) {
	last := g.last.Load()
	if d := now - last; last != 0 && d < int64(Every) && d > -int64(Every) || !g.last.CompareAndSwap(last, now) {
		g.held.Add(1)
		return 0, false
	}
	return g.held.Swap(0), true
}
