package upstream

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCountersFromZero: every per-node counter exists, at 0, for every
// node and label value before anything happened, so that an increase()
// alert sees the first ejection, refused ejection, failed probe or
// restart. (A
// series born with the value 1 has no earlier sample to increase from.)
func TestCountersFromZero(t *testing.T) {
	const nodes = 3
	c, _ := fakeCluster(t, nodes, nil)
	tests := []struct {
		name   string
		vec    *prometheus.CounterVec
		values [][]string // label values after node's, one set per series of a node
	}{
		{"memcgate_upstream_ejections_total", c.m.ejects, [][]string{{"probe"}, {"refused"}, {"timeouts"}}},
		{"memcgate_upstream_ejections_refused_total", c.m.ejectsRefused, [][]string{{}}},
		{"memcgate_upstream_probes_total", c.m.probes, [][]string{{"ok"}, {"fail"}}},
		{"memcgate_upstream_probes_late_total", c.m.probesLate, [][]string{{}}},
		{"memcgate_upstream_failovers_total", c.m.failovers, [][]string{{}}},
		{"memcgate_upstream_batched_gets_total", c.m.batched, [][]string{{}}},
		{"memcgate_upstream_readmit_invalidated_keys_total", c.m.invalidated, [][]string{{}}},
		{"memcgate_upstream_readmit_untracked_keys_total", c.m.untracked, [][]string{{}}},
		{"memcgate_upstream_readmit_unknown_history_total", c.m.unknown, [][]string{{}}},
		{"memcgate_upstream_restarts_total", c.m.restarts, [][]string{{}}},
		{"memcgate_upstream_buffered_share_refusals_total", c.m.shareRefused, [][]string{{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := nodes * len(tt.values)
			if got := testutil.CollectAndCount(tt.vec, tt.name); got != want {
				t.Fatalf("%s has %d series before any event, want %d", tt.name, got, want)
			}
			// Reading the expected series must not create any: they exist.
			for _, n := range c.topo.Load().nodes {
				for _, v := range tt.values {
					if got := testutil.ToFloat64(tt.vec.WithLabelValues(append([]string{n.name}, v...)...)); got != 0 {
						t.Errorf("%s{node=%q %v} = %v at start, want 0", tt.name, n.name, v, got)
					}
				}
			}
			if got := testutil.CollectAndCount(tt.vec, tt.name); got != want {
				t.Errorf("%s: %d series after reading the expected ones, want %d: some were missing", tt.name, got, want)
			}
		})
	}
	// Every operation and result of every node, likewise.
	if got, want := testutil.CollectAndCount(c.m.ops, "memcgate_upstream_ops_total"), nodes*int(numOps-1)*int(numResults); got != want {
		t.Errorf("memcgate_upstream_ops_total has %d series at start, want %d", got, want)
	}
}

// TestProbeCounters: a probe's result is counted on the node's own
// pre-created series.
func TestProbeCounters(t *testing.T) {
	c, probes := fakeCluster(t, 2, nil)
	probes[1].ok.Store(false)
	c.checkAll(t.Context())
	for i, want := range []struct{ ok, fail float64 }{{1, 0}, {0, 1}} {
		n := c.topo.Load().nodes[i]
		if got := testutil.ToFloat64(c.m.probes.WithLabelValues(n.name, "ok")); got != want.ok {
			t.Errorf("probes_total{node=%q,result=ok} = %v, want %v", n.name, got, want.ok)
		}
		if got := testutil.ToFloat64(c.m.probes.WithLabelValues(n.name, "fail")); got != want.fail {
			t.Errorf("probes_total{node=%q,result=fail} = %v, want %v", n.name, got, want.fail)
		}
	}
}
