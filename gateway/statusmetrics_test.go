package gateway

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metricsRig registers, under their real names, the series the status
// page reads, in a registry of its own.
type metricsRig struct {
	reg      *prometheus.Registry
	ops      *prometheus.CounterVec
	dur      *prometheus.HistogramVec
	fail     *prometheus.CounterVec
	requests *prometheus.CounterVec
	reqDur   *prometheus.HistogramVec
}

var rigBuckets = []float64{.001, .01, .1}

func newMetricsRig(t *testing.T) *metricsRig {
	t.Helper()
	r := &metricsRig{
		reg:      prometheus.NewRegistry(),
		ops:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_upstream_ops_total"}, []string{"node", "op", "result"}),
		dur:      prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "memcgate_upstream_op_duration_seconds", Buckets: rigBuckets}, []string{"node", "op"}),
		fail:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_upstream_failovers_total"}, []string{"node"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_http_requests_total"}, []string{"method", "code"}),
		reqDur:   prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "memcgate_http_request_duration_seconds", Buckets: rigBuckets}, []string{"method"}),
	}
	r.reg.MustRegister(r.ops, r.dur, r.fail, r.requests, r.reqDur)
	return r
}

// op counts n operations on node with result, each taking secs.
func (r *metricsRig) op(node, op, result string, n int, secs float64) {
	r.ops.WithLabelValues(node, op, result).Add(float64(n))
	for range n {
		r.dur.WithLabelValues(node, op).Observe(secs)
	}
}

// req counts n HTTP answers with code, each taking secs.
func (r *metricsRig) req(method, code string, n int, secs float64) {
	r.requests.WithLabelValues(method, code).Add(float64(n))
	for range n {
		r.reqDur.WithLabelValues(method).Observe(secs)
	}
}

func (r *metricsRig) snapshot(t *testing.T, at time.Time) snapshot {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	return takeSnapshot(mfs, at)
}

// near reports whether got is want within 1e-9, NaN and ±Inf included.
func near(got, want float64) bool {
	if math.IsNaN(want) || math.IsInf(want, 0) {
		return math.IsNaN(got) == math.IsNaN(want) && math.IsInf(got, 1) == math.IsInf(want, 1)
	}
	return math.Abs(got-want) < 1e-9
}

// TestNodeRatesFromSnapshots computes a node's rates between two readings
// of a real registry, as the status page does between two views.
func TestNodeRatesFromSnapshots(t *testing.T) {
	const node = "10.0.0.1:11211"
	tests := []struct {
		name    string
		before  func(r *metricsRig) // before the first snapshot
		between func(r *metricsRig) // between the two
		restart bool                // the second snapshot is of a new process
		window  time.Duration
		want    nodeRates
	}{
		{
			name:    "steady traffic",
			before:  func(r *metricsRig) { r.op(node, "get", "ok", 10, .05) },
			between: func(r *metricsRig) { r.op(node, "get", "ok", 60, .0005); r.op(node, "set", "ok", 40, .0005) },
			window:  10 * time.Second,
			// 100 operations in 10 s, all in (0, 1ms]: the median is
			// interpolated at half the bucket, the earlier 50ms
			// operations are not in the window.
			want: nodeRates{OpsPerSec: 10, ErrorRatio: 0, P50: .0005, P99: .00099, Bound: .1},
		},
		{
			name: "errors and timeouts count, misses do not",
			between: func(r *metricsRig) {
				r.op(node, "get", "ok", 50, .0005)
				r.op(node, "get", "miss", 30, .0005)
				r.op(node, "get", "error", 10, .0005)
				r.op(node, "get", "timeout", 10, .5)
			},
			window: time.Second,
			// 90 operations in (0, 1ms]: rank 50 is 50/90 of the way.
			// p99 is rank 99 of 100: the 10 timeouts lie past the last
			// bound (.1 s), and so does rank 99.
			want: nodeRates{OpsPerSec: 100, ErrorRatio: .2, P50: .001 * 50 / 90, P99: math.Inf(1), Bound: .1},
		},
		{
			name:   "no traffic in the window",
			before: func(r *metricsRig) { r.op(node, "get", "ok", 10, .0005) },
			window: 5 * time.Second,
			want:   nodeRates{OpsPerSec: 0, ErrorRatio: math.NaN(), P50: math.NaN(), P99: math.NaN(), Bound: .1},
		},
		{
			name: "latency spread over buckets",
			between: func(r *metricsRig) {
				r.op(node, "get", "ok", 50, .0005)
				r.op(node, "get", "ok", 40, .005)
				r.op(node, "get", "ok", 10, .05)
			},
			window: time.Second,
			// rank 50 is the last of the first bucket; rank 99 is the
			// 9th of 10 in (10ms, 100ms]: 10ms + 90ms·9/10.
			want: nodeRates{OpsPerSec: 100, ErrorRatio: 0, P50: .001, P99: .091, Bound: .1},
		},
		{
			name:    "failovers",
			between: func(r *metricsRig) { r.fail.WithLabelValues(node).Add(30) },
			window:  3 * time.Second,
			want:    nodeRates{OpsPerSec: 0, ErrorRatio: math.NaN(), FailoversPerSec: 10, P50: math.NaN(), P99: math.NaN()},
		},
		{
			name:    "counter reset: the process restarted between views",
			before:  func(r *metricsRig) { r.op(node, "get", "ok", 1000, .05) },
			between: func(r *metricsRig) { r.op(node, "get", "ok", 20, .0005) },
			restart: true,
			window:  2 * time.Second,
			want:    nodeRates{OpsPerSec: 10, ErrorRatio: 0, P50: .0005, P99: .00099, Bound: .1},
		},
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newMetricsRig(t)
			if tt.before != nil {
				tt.before(r)
			}
			prev := r.snapshot(t, t0)
			if tt.restart {
				r = newMetricsRig(t)
			}
			if tt.between != nil {
				tt.between(r)
			}
			cur := r.snapshot(t, t0.Add(tt.window))
			got := ratesOf(prev.node("", node), cur.node("", node), tt.window)
			if !near(got.OpsPerSec, tt.want.OpsPerSec) || !near(got.ErrorRatio, tt.want.ErrorRatio) ||
				!near(got.FailoversPerSec, tt.want.FailoversPerSec) || !near(got.P50, tt.want.P50) ||
				!near(got.P99, tt.want.P99) || !near(got.Bound, tt.want.Bound) {
				t.Errorf("ratesOf() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestHTTPRatesFromSnapshots does the same for the gateway's requests.
func TestHTTPRatesFromSnapshots(t *testing.T) {
	tests := []struct {
		name      string
		before    func(r *metricsRig)
		between   func(r *metricsRig)
		window    time.Duration
		wantClass [6]float64
		wantTotal float64
		wantErr   float64
		wantP50   float64
	}{
		{
			name:   "by class",
			before: func(r *metricsRig) { r.req("GET", "500", 100, .05) },
			between: func(r *metricsRig) {
				r.req("GET", "200", 70, .0005)
				r.req("PUT", "201", 10, .0005)
				r.req("GET", "404", 10, .0005)
				r.req("GET", "503", 10, .0005)
			},
			window:    10 * time.Second,
			wantClass: [6]float64{2: 8, 4: 1, 5: 1},
			wantTotal: 10,
			wantErr:   .1,
			wantP50:   .0005,
		},
		{
			name:      "no requests",
			window:    time.Second,
			wantErr:   math.NaN(),
			wantP50:   math.NaN(),
			wantClass: [6]float64{},
		},
		{
			name:      "odd codes land in class 0",
			between:   func(r *metricsRig) { r.req("GET", "999", 4, .0005) },
			window:    2 * time.Second,
			wantClass: [6]float64{0: 2},
			wantTotal: 2,
			wantErr:   0,
			wantP50:   .0005,
		},
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newMetricsRig(t)
			if tt.before != nil {
				tt.before(r)
			}
			prev := r.snapshot(t, t0)
			if tt.between != nil {
				tt.between(r)
			}
			cur := r.snapshot(t, t0.Add(tt.window))
			got := httpRatesOf(&prev.http, &cur.http, tt.window)
			for c := range got.ClassPerSec {
				if !near(got.ClassPerSec[c], tt.wantClass[c]) {
					t.Errorf("ClassPerSec[%d] = %v, want %v", c, got.ClassPerSec[c], tt.wantClass[c])
				}
			}
			if !near(got.PerSec, tt.wantTotal) || !near(got.ErrorRatio, tt.wantErr) || !near(got.P50, tt.wantP50) {
				t.Errorf("httpRatesOf() = %v/s, 5xx %v, p50 %v; want %v/s, %v, %v", got.PerSec, got.ErrorRatio, got.P50, tt.wantTotal, tt.wantErr, tt.wantP50)
			}
		})
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := func(count float64, cum ...float64) histogram {
		return histogram{upper: []float64{1, 2, 4}, cum: cum, count: count}
	}
	tests := []struct {
		name string
		h    histogram
		q    float64
		want float64
	}{
		{"empty", histogram{}, .5, math.NaN()},
		{"no observations", h(0, 0, 0, 0), .5, math.NaN()},
		{"first bucket from zero", h(10, 10, 10, 10), .5, .5},
		{"middle bucket", h(10, 0, 10, 10), .5, 1.5},
		{"rank on a boundary", h(10, 5, 10, 10), .5, 1},
		{"last finite bucket", h(100, 0, 0, 100), .99, 2 + 2*.99},
		{"past the last bound", h(100, 90, 90, 90), .99, math.Inf(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.h.quantile(tt.q); !near(got, tt.want) {
				t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

func TestHistogramAddAndSince(t *testing.T) {
	a := histogram{upper: []float64{1, 2}, cum: []float64{1, 3}, count: 4}
	b := histogram{upper: []float64{1, 2}, cum: []float64{2, 2}, count: 5}
	sum := histogram{}.add(a).add(b)
	if want := (histogram{upper: []float64{1, 2}, cum: []float64{3, 5}, count: 9}); !equalHist(sum, want) {
		t.Errorf("add = %+v, want %+v", sum, want)
	}
	// Different bounds: a lacks 1.5, so it counts its cumulative at 1.
	c := histogram{upper: []float64{1.5}, cum: []float64{1}, count: 1}
	if got, want := a.add(c), (histogram{upper: []float64{1, 1.5, 2}, cum: []float64{1, 2, 4}, count: 5}); !equalHist(got, want) {
		t.Errorf("add with other bounds = %+v, want %+v", got, want)
	}
	later := histogram{upper: []float64{1, 2}, cum: []float64{4, 8}, count: 10}
	if got, want := later.since(a), (histogram{upper: []float64{1, 2}, cum: []float64{3, 5}, count: 6}); !equalHist(got, want) {
		t.Errorf("since = %+v, want %+v", got, want)
	}
	if got := a.since(later); !equalHist(got, a) {
		t.Errorf("since after a reset = %+v, want everything (%+v)", got, a)
	}
}

func equalHist(a, b histogram) bool {
	if a.count != b.count || len(a.upper) != len(b.upper) || len(a.cum) != len(b.cum) {
		return false
	}
	for i := range a.upper {
		if a.upper[i] != b.upper[i] || a.cum[i] != b.cum[i] {
			return false
		}
	}
	return true
}

func TestPerSecond(t *testing.T) {
	tests := []struct {
		name       string
		prev, cur  float64
		dt         time.Duration
		want       float64
		wantChange float64
	}{
		{"rise", 10, 30, 4 * time.Second, 5, 20},
		{"flat", 7, 7, time.Second, 0, 0},
		{"reset", 100, 8, 2 * time.Second, 4, 8},
		{"no window", 1, 2, 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := perSecond(tt.prev, tt.cur, tt.dt); got != tt.want {
				t.Errorf("perSecond(%v, %v, %v) = %v, want %v", tt.prev, tt.cur, tt.dt, got, tt.want)
			}
			if got := delta(tt.prev, tt.cur); got != tt.wantChange {
				t.Errorf("delta(%v, %v) = %v, want %v", tt.prev, tt.cur, got, tt.wantChange)
			}
		})
	}
}

func TestSnapshotRing(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) snapshot { return snapshot{at: t0.Add(time.Duration(ms) * time.Millisecond)} }
	tests := []struct {
		name   string
		stored []int // ms after t0, in the order views took them
		now    int
		want   int // ms of the base, -1 for none
	}{
		{"first view", nil, 0, -1},
		{"previous view", []int{0}, 5000, 0},
		{"too recent", []int{0}, 500, -1},
		{"newest old enough", []int{0, 5000, 10000}, 10500, 5000},
		{"out of order", []int{5000, 0}, 7000, 5000},
		{"burst kept out", []int{0, 300, 600, 900}, 1500, 0},
		{"oldest pushed out", []int{0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000}, 8000, 7000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r snapshotRing
			for _, ms := range tt.stored {
				r.add(at(ms))
			}
			got, ok := r.base(at(tt.now).at)
			if tt.want < 0 {
				if ok {
					t.Errorf("base(%d ms) = %v, want none", tt.now, got.at.Sub(t0))
				}
				return
			}
			if !ok || !got.at.Equal(at(tt.want).at) {
				t.Errorf("base(%d ms) = %v (ok %v), want %d ms", tt.now, got.at.Sub(t0), ok, tt.want)
			}
		})
	}
	var r snapshotRing
	for ms := 0; ms < 9000; ms += 1000 {
		r.add(at(ms))
	}
	if r.n != len(r.buf) {
		t.Errorf("ring holds %d snapshots after 9 views, want %d", r.n, len(r.buf))
	}
	if _, ok := r.base(at(1500).at); ok {
		t.Errorf("base(1500 ms) found a snapshot, but 0 ms was pushed out and 1000 ms is too recent")
	}
}

// TestPoolRatesFromSnapshots computes a pool's rates between two readings
// of a registry holding the route package's series under their real
// names and labels, failures summed over results and warm pools.
func TestPoolRatesFromSnapshots(t *testing.T) {
	reg := prometheus.NewRegistry()
	replica := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_pool_replica_writes_total"}, []string{"pool", "policy", "result"})
	fallbacks := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_pool_read_fallbacks_total"}, []string{"pool", "policy", "reason"})
	hedges := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_pool_hedges_total"}, []string{"pool", "result"})
	writeBacks := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_warmup_writebacks_total"}, []string{"pool", "warm", "result"})
	invalidations := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_warmup_invalidations_total"}, []string{"pool", "warm", "result"})
	reg.MustRegister(replica, fallbacks, hedges, writeBacks, invalidations)
	snap := func(at time.Time) snapshot {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("Gather: %v", err)
		}
		return takeSnapshot(mfs, at)
	}
	start := time.Unix(1000, 0)
	replica.WithLabelValues("cold", "all", "failed").Add(100) // before the window
	prev := snap(start)

	replica.WithLabelValues("cold", "all", "ok").Add(500)
	replica.WithLabelValues("cold", "all", "failed").Add(10)
	replica.WithLabelValues("cold", "all", "background_failed").Add(10)
	fallbacks.WithLabelValues("cold", "all", "miss").Add(30)
	fallbacks.WithLabelValues("cold", "all", "error").Add(10)
	hedges.WithLabelValues("cold", "sent").Add(40)
	hedges.WithLabelValues("cold", "won").Add(20)
	writeBacks.WithLabelValues("cold", "warm", "stored").Add(400)
	writeBacks.WithLabelValues("cold", "warm", "failed").Add(6)
	writeBacks.WithLabelValues("cold", "warm", "dropped").Add(50) // a later miss copies the key: not a failure
	writeBacks.WithLabelValues("cold", "warm2", "failed").Add(2)
	invalidations.WithLabelValues("cold", "warm", "deleted").Add(70)
	invalidations.WithLabelValues("cold", "warm", "failed").Add(12)
	writeBacks.WithLabelValues("other", "warm", "failed").Add(1000) // another pool's
	cur := snap(start.Add(10 * time.Second))

	got := poolRatesOf(prev.pool("cold"), cur.pool("cold"), 10*time.Second)
	want := poolRates{HedgesPerSec: 4, HedgesWonPerSec: 2, FallbacksPerSec: 4, ReplicaFailuresPerSec: 2, WarmFailuresPerSec: 2}
	if got != want {
		t.Errorf("poolRatesOf = %+v, want %+v", got, want)
	}
	if got := poolRatesOf(prev.pool("none"), cur.pool("none"), 10*time.Second); got != (poolRates{}) {
		t.Errorf("a pool without series: %+v, want zero rates", got)
	}
}
