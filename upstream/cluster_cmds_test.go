package upstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestClusterCommandsCounted: stats, version and flush_all sent to every
// node (/memc) are counted per node in memcgate_upstream_ops_total, as
// every other operation, and timed: ok for a node that answered,
// timeout for one stopped, nothing for one passed over as down.
func TestClusterCommandsCounted(t *testing.T) {
	tests := []struct {
		name string
		op   string
		run  func(c *Cluster, ctx context.Context) []NodeReply
	}{
		{"stats", "stats", func(c *Cluster, ctx context.Context) []NodeReply { return c.Stats(ctx) }},
		{"version", "version", func(c *Cluster, ctx context.Context) []NodeReply { return c.Version(ctx) }},
		{"flush_all", "flush_all", func(c *Cluster, ctx context.Context) []NodeReply { return c.FlushAll(ctx, 0) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 3)
			c, reg := newTestCluster(t, mcs, func(o *Options) { o.Timeout = 200 * time.Millisecond })
			nodes := c.topo.Load().nodes
			nodes[2].eject("probe", errors.New("test: down"), false)
			mcs[1].Pause()
			defer mcs[1].Resume()
			replies := tt.run(c, t.Context())
			if replies[0].Err != nil || replies[1].Err == nil || replies[2].Err == nil {
				t.Fatalf("replies %+v; want the first node's answer, the others' errors", replies)
			}
			want := []map[string]float64{
				{"ok": 1},      // answered
				{"timeout": 1}, // stopped
				{},             // down: not sent
			}
			for i, n := range nodes {
				for _, res := range resultNames {
					got := testutil.ToFloat64(c.m.ops.WithLabelValues(n.name, tt.op, res))
					if got != want[i][res] {
						t.Errorf("memcgate_upstream_ops_total{node=%d,op=%q,result=%q} = %v, want %v%s", i, tt.op, res, got, want[i][res], mcs[1].ResumedNote())
					}
				}
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			timed := map[string]uint64{}
			for _, mf := range mfs {
				if mf.GetName() != "memcgate_upstream_op_duration_seconds" {
					continue
				}
				for _, m := range mf.GetMetric() {
					var node, o string
					for _, l := range m.GetLabel() {
						switch l.GetName() {
						case "node":
							node = l.GetValue()
						case "op":
							o = l.GetValue()
						}
					}
					if o == tt.op {
						timed[node] = m.GetHistogram().GetSampleCount()
					}
				}
			}
			for i, want := range []uint64{1, 1, 0} {
				if got := timed[nodes[i].name]; got != want {
					t.Errorf("memcgate_upstream_op_duration_seconds{node=%d,op=%q} has %d samples, want %d", i, tt.op, got, want)
				}
			}
		})
	}
}
