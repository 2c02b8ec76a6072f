package panicguard

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRecover: a Site stops a panic of its goroutine, the goroutine's
// other deferred calls run after it, the panic is counted under its
// where, and logged with its stack once a second at most; a Site that
// saw none exports 0.
func TestRecover(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	g := New(slog.New(slog.NewTextHandler(&logs, nil)), reg)
	a, b := g.Site("a"), g.Site("b")
	for i := range 3 {
		gaveBack := false
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() { gaveBack = true }()
			defer a.Recover()
			panic("planted " + string(rune('0'+i)))
		}()
		<-done
		if !gaveBack {
			t.Fatalf("panic %d: the goroutine's other deferred call did not run", i)
		}
	}
	if n := testutil.ToFloat64(g.panics.WithLabelValues("a")); n != 3 {
		t.Errorf("memcgate_panics_total{where=a} = %v, want 3", n)
	}
	if n := testutil.ToFloat64(g.panics.WithLabelValues("b")); n != 0 || b == nil {
		t.Errorf("memcgate_panics_total{where=b} = %v, want 0", n)
	}
	out := logs.String()
	if c := strings.Count(out, "panic stopped"); c != 1 {
		t.Errorf("%d log lines for 3 panics within a second, want 1:\n%s", c, out)
	}
	for _, want := range []string{"where=a", "planted 0", "panicguard_test.go", "unlogged_before=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("log line lacks %q:\n%s", want, out)
		}
	}
}

// TestNilSite: a nil Guard's Site is nil and stops nothing: the panic
// goes on.
func TestNilSite(t *testing.T) {
	var g *Guard
	s := g.Site("x")
	if s != nil {
		t.Fatalf("nil Guard's Site = %v, want nil", s)
	}
	defer func() {
		if p := recover(); p != "through" {
			t.Errorf("recovered %v after a nil Site, want the panic itself", p)
		}
	}()
	func() {
		defer s.Recover()
		panic("through")
	}()
}

// TestRecoverNoting: RecoverNoting stops a panic as Recover does and
// says so to the deferred calls that run after it; on a normal return it
// says nothing.
func TestRecoverNoting(t *testing.T) {
	g := New(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	s := g.Site("noting")
	tests := []struct {
		name  string
		panic bool
	}{
		{"panics", true},
		{"returns", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen bool
			func() {
				panicked := false
				defer func() { seen = panicked }()
				defer s.RecoverNoting(&panicked)
				if tt.panic {
					panic("planted")
				}
			}()
			if seen != tt.panic {
				t.Errorf("panicked = %v after the deferred stop, want %v", seen, tt.panic)
			}
		})
	}
	if n := testutil.ToFloat64(g.panics.WithLabelValues("noting")); n != 1 {
		t.Errorf(`memcgate_panics_total{where="noting"} = %v, want 1`, n)
	}
}
