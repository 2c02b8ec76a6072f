package upstream

import (
	"io"
	"log/slog"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/hashring"
)

func TestClusterShares(t *testing.T) {
	tests := []struct {
		name    string
		dist    hashring.Distribution
		servers []Server
		want    map[string]float64 // ± 0.05
	}{
		{"one node", hashring.Ketama, []Server{{Host: "a", Port: 1}}, map[string]float64{"a:1": 1}},
		{"modula", hashring.Modula, []Server{{Host: "a", Port: 1}, {Host: "b", Port: 2}},
			map[string]float64{"a:1": 0.5, "b:2": 0.5}},
		{"ketama weights", hashring.Ketama, []Server{{Host: "a", Port: 1, Weight: 1}, {Host: "b", Port: 2, Weight: 3}},
			map[string]float64{"a:1": 0.25, "b:2": 0.75}},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(Options{Servers: tt.servers, Distribution: tt.dist}, log, prometheus.NewRegistry())
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			got := c.Shares()
			if len(got) != len(tt.want) {
				t.Fatalf("Shares() = %v, want %d nodes", got, len(tt.want))
			}
			sum := 0.0
			for name, w := range tt.want {
				if math.Abs(got[name]-w) > 0.05 {
					t.Errorf("Shares()[%q] = %.3f, want %.2f ± 0.05", name, got[name], w)
				}
				sum += got[name]
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Errorf("Shares() = %v sums to %v, want 1", got, sum)
			}
		})
	}
}
