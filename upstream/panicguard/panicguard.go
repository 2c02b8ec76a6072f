// Package panicguard stops a panic at the boundary of a goroutine that
// runs a request's code but is not the request's own handler goroutine
// (memcached's reply reader, a write copy, a retry): net/http and h1
// recover their handlers' panics, but a panic anywhere else ends the
// process, and every client of the gateway loses its connections for one
// request. The health checks, which recover their own panics as failed
// probes, count and log them through a Site too (Site.Stopped). A Site
// counts such a panic in memcgate_panics_total{where},
// logs it with its stack (a line a second at most: a client that found a
// request that panics repeats it at will), and lets the goroutine's other
// deferred calls give back what it held. It lives under upstream/, as
// loggate does, so that every layer imports it downward.
package panicguard

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/memcgate/memcgate/upstream/loggate"
)

// ErrPanicked is the error of an operation whose goroutine panicked and
// was stopped (a bug): whether it reached memcached is not known. The
// gateway answers it 500.
var ErrPanicked = errors.New("panicguard: the operation's goroutine panicked (a bug)")

// Guard counts and logs the panics its Sites stop. It is safe for
// concurrent use.
type Guard struct {
	log    *slog.Logger
	gate   loggate.Gate // one line a second at most, for every Site
	panics *prometheus.CounterVec
}

// New returns a Guard that logs to log and counts in
// memcgate_panics_total{where}, registered on reg.
func New(log *slog.Logger, reg prometheus.Registerer) *Guard {
	g := &Guard{log: log, panics: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_panics_total",
		Help: "Panics stopped on a goroutine other than a request's handler, by where they were stopped: a bug. The process goes on serving; the log has the first stack of each second.",
	}, []string{"where"})}
	reg.MustRegister(g.panics)
	return g
}

// Site returns the place named where (a fixed name, a label value), its
// series exported from 0. A nil Guard returns a nil Site.
func (g *Guard) Site(where string) *Site {
	if g == nil {
		return nil
	}
	return &Site{g: g, where: where, n: g.panics.WithLabelValues(where)}
}

// Stopped is how many panics the Sites named where stopped: its series
// of memcgate_panics_total.
func (g *Guard) Stopped(where string) float64 {
	var m dto.Metric
	if err := g.panics.WithLabelValues(where).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// Site is one place where panics are stopped.
type Site struct {
	g     *Guard
	where string
	n     prometheus.Counter
}

// Recover stops a panic of the goroutine it runs on, counts it and logs
// it with its stack. It works only when deferred itself, `defer
// s.Recover()` (recover's rule): deferred before it, the goroutine's
// other deferred calls run afterwards, as on a normal return, and give
// back what it held. A nil Site stops nothing: the panic goes on, as
// without it.
func (s *Site) Recover() {
	if s == nil {
		return
	}
	if p := recover(); p != nil {
		s.stopped(p)
	}
}

// RecoverNoting is Recover that also sets *panicked when it stops a
// panic, for the deferred calls that run after it to answer for the work
// cut short (`defer s.RecoverNoting(&panicked)`, deferred last).
func (s *Site) RecoverNoting(panicked *bool) {
	if s == nil {
		return
	}
	if p := recover(); p != nil {
		*panicked = true
		s.stopped(p)
	}
}

// Stopped counts and logs p, a panic its caller recovered itself (to
// turn it into an error of its own), with attrs (slog's key-value
// pairs) on its line. A nil Site logs it to log, every time.
func (s *Site) Stopped(log *slog.Logger, p any, attrs ...any) {
	if s == nil {
		log.Error("panic stopped", append(attrs, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))...)
		return
	}
	s.stopped(p, attrs...)
}

// stopped counts and logs p, a panic stopped, with attrs on its line.
func (s *Site) stopped(p any, attrs ...any) {
	s.n.Inc()
	if held, ok := s.g.gate.Pass(); ok {
		s.g.log.Error("panic stopped", append([]any{"where", s.where}, append(attrs, "panic", fmt.Sprint(p), "stack", string(debug.Stack()), "unlogged_before", held)...)...)
	}
}
