package route

import (
	"testing"
	"time"
)

// TestHedgeDelay: the delay is the median of the nodes' p95s, so one slow
// node of three does not raise it; nodes with too few reads do not count.
func TestHedgeDelay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes map[string][]time.Duration // each node's reads
		want  time.Duration              // within a bucket
		ok    bool
	}{
		{"none", nil, 0, false},
		{"too few reads", map[string][]time.Duration{"a": repeat(time.Millisecond, minSamples-1)}, 0, false},
		{"one node", map[string][]time.Duration{"a": repeat(time.Millisecond, 100)}, time.Millisecond, true},
		{"one slow of three", map[string][]time.Duration{
			"a": repeat(200*time.Microsecond, 100), "b": repeat(300*time.Microsecond, 100), "c": repeat(40*time.Millisecond, 100),
		}, 300 * time.Microsecond, true},
		{"tail of 10%", map[string][]time.Duration{
			"a": append(repeat(200*time.Microsecond, 90), repeat(10*time.Millisecond, 10)...),
		}, 10 * time.Millisecond, true},
		{"two nodes: the lower", map[string][]time.Duration{
			"a": repeat(time.Millisecond, 50), "b": repeat(30*time.Millisecond, 50),
		}, time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l latencies
			for node, ds := range tc.nodes {
				for _, d := range ds {
					l.observe(node, d)
				}
			}
			got, ok := l.delay(func(string) bool { return true })
			if ok != tc.ok || ok && (got < tc.want || got > tc.want*5/4+time.Microsecond) {
				t.Errorf("delay = %v, %v; want %v (one bucket up), %v", got, ok, tc.want, tc.ok)
			}
			// Two rotations later the reads are gone.
			l.delay(func(string) bool { return true })
			if _, ok := l.delay(func(string) bool { return true }); ok {
				t.Error("reads still counted two windows later")
			}
		})
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// TestHedgeBudget: a pool's hedges stay within its share of reads, with a
// small burst saved up.
func TestHedgeBudget(t *testing.T) {
	var b hedgeBudget
	b.init(10)
	spent := 0
	for range 1000 {
		b.earn()
		if b.spend() {
			spent++
		}
	}
	if spent != 100 {
		t.Errorf("1000 reads at 10%% allowed %d hedges, want 100", spent)
	}
	for range 10000 {
		b.earn()
	}
	burst := 0
	for b.spend() {
		burst++
	}
	if burst != hedgeBurst {
		t.Errorf("a quiet pool saved %d hedges, want %d", burst, hedgeBurst)
	}
}
