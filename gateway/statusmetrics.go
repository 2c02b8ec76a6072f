package gateway

import (
	"math"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// The status page's numbers come from the Prometheus registry the
// gateway already keeps, read twice: a snapshot when the page is asked for
// and one taken at an earlier view. Rates and percentiles are the
// differences between the two, as Prometheus's rate() and
// histogram_quantile() would compute them from two scrapes. Nothing
// samples in the background: the snapshots are the page's own views.

// snapshot is what the status page reads from one Gather. Counters and
// histograms are cumulative since the process (or, for a node added by a
// reload, the node) started; the zero snapshot is the state at start.
type snapshot struct {
	at    time.Time
	nodes map[nodeID]*nodeSample // nil in the zero snapshot
	pools map[string]*poolSample // by pool name; nil in the zero snapshot
	http  httpSample
}

// nodeID names a node's series: its pool label (empty with one pool) and
// its node label. A node in two pools has a series in each.
type nodeID struct{ pool, node string }

// poolSample is one pool's replication series, summed over policies.
type poolSample struct {
	hedges, hedgesWon float64 // memcgate_pool_hedges_total sent and won
	fallbacks         float64 // memcgate_pool_read_fallbacks_total, every reason
	replicaFailures   float64 // memcgate_pool_replica_writes_total failed and background_failed
	warmFailures      float64 // memcgate_warmup_writebacks_total and _invalidations_total failed
}

// nodeSample is one memcached node's series, summed over operations.
type nodeSample struct {
	ops         float64   // memcgate_upstream_ops_total, every result
	errors      float64   // of which result error or timeout
	failovers   float64   // memcgate_upstream_failovers_total: its keys served by another node
	latency     histogram // memcgate_upstream_op_duration_seconds
	maxInFlight float64   // memcgate_upstream_max_in_flight (a gauge)
}

// httpSample is the gateway's own series.
type httpSample struct {
	byClass  [6]float64 // memcgate_http_requests_total by code/100; [0]: codes outside 100..599
	latency  histogram  // memcgate_http_request_duration_seconds, every method
	inFlight float64    // memcgate_http_in_flight_requests

	connsReading, connsIdle, connsActive float64 // memcgate_http_connections by state
	connsMax, connsRefused               float64 // memcgate_http_connections_max; _refused_total and memcgate_http_handovers_refused_total
	connsBad                             float64 // memcgate_http_connections_closed_total{listener="data",reason="bad_request"}

	buffered, bufferedLimit float64 // memcgate_buffered_bytes and _limit; limit 0: none exported
	refusals                float64 // memcgate_buffered_refusals_total

	asyncDepth, asyncBytes float64 // memcgate_async_queue_depth and _bytes
	asyncApplied           float64 // memcgate_async_writes_applied_total and _unconfirmed_total (sent as UDP)
	asyncFailed            float64 // memcgate_async_writes_failed_total, every reason
	asyncRejected          float64 // memcgate_async_writes_rejected_total, every reason
}

// node returns the sample of the named node of a pool ("" with one
// pool), a zero one if it has none.
func (s *snapshot) node(pool, name string) *nodeSample {
	if n := s.nodes[nodeID{pool, name}]; n != nil {
		return n
	}
	return &nodeSample{}
}

// pool returns the sample of the named pool, a zero one if it has none.
func (s *snapshot) pool(name string) *poolSample {
	if p := s.pools[name]; p != nil {
		return p
	}
	return &poolSample{}
}

// takeSnapshot reads the families the page shows out of mfs (a Gather's
// answer); it ignores every other family.
func takeSnapshot(mfs []*dto.MetricFamily, at time.Time) snapshot {
	s := snapshot{at: at, nodes: map[nodeID]*nodeSample{}, pools: map[string]*poolSample{}}
	node := func(m *dto.Metric) *nodeSample {
		id := nodeID{label(m, "pool"), label(m, "node")}
		n := s.nodes[id]
		if n == nil {
			n = &nodeSample{}
			s.nodes[id] = n
		}
		return n
	}
	pool := func(m *dto.Metric) *poolSample {
		name := label(m, "pool")
		p := s.pools[name]
		if p == nil {
			p = &poolSample{}
			s.pools[name] = p
		}
		return p
	}
	h := &s.http
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "memcgate_upstream_ops_total":
				n, v := node(m), m.GetCounter().GetValue()
				n.ops += v
				if r := label(m, "result"); r == "error" || r == "timeout" || r == "busy" {
					n.errors += v
				}
			case "memcgate_upstream_failovers_total":
				node(m).failovers += m.GetCounter().GetValue()
			case "memcgate_upstream_op_duration_seconds":
				n := node(m)
				n.latency = n.latency.add(histogramOf(m.GetHistogram()))
			case "memcgate_upstream_max_in_flight":
				node(m).maxInFlight = m.GetGauge().GetValue()
			case "memcgate_pool_hedges_total":
				switch label(m, "result") {
				case "sent":
					pool(m).hedges += m.GetCounter().GetValue()
				case "won":
					pool(m).hedgesWon += m.GetCounter().GetValue()
				}
			case "memcgate_pool_read_fallbacks_total":
				pool(m).fallbacks += m.GetCounter().GetValue()
			case "memcgate_pool_replica_writes_total":
				if r := label(m, "result"); r == "failed" || r == "background_failed" {
					pool(m).replicaFailures += m.GetCounter().GetValue()
				}
			case "memcgate_warmup_writebacks_total", "memcgate_warmup_invalidations_total":
				if label(m, "result") == "failed" {
					pool(m).warmFailures += m.GetCounter().GetValue()
				}
			case "memcgate_http_requests_total":
				h.byClass[codeClass(label(m, "code"))] += m.GetCounter().GetValue()
			case "memcgate_http_request_duration_seconds":
				h.latency = h.latency.add(histogramOf(m.GetHistogram()))
			case "memcgate_http_in_flight_requests":
				h.inFlight = m.GetGauge().GetValue()
			case "memcgate_http_connections":
				switch v := m.GetGauge().GetValue(); label(m, "state") {
				case "reading":
					h.connsReading = v
				case "idle":
					h.connsIdle = v
				case "active":
					h.connsActive = v
				}
			case "memcgate_http_connections_max":
				h.connsMax = m.GetGauge().GetValue()
			case "memcgate_http_connections_refused_total", "memcgate_http_handovers_refused_total":
				h.connsRefused += m.GetCounter().GetValue()
			case "memcgate_http_connections_closed_total":
				if label(m, "listener") == "data" && label(m, "reason") == "bad_request" {
					h.connsBad += m.GetCounter().GetValue()
				}
			case "memcgate_buffered_bytes":
				h.buffered = m.GetGauge().GetValue()
			case "memcgate_buffered_bytes_limit":
				h.bufferedLimit = m.GetGauge().GetValue()
			case "memcgate_buffered_refusals_total":
				h.refusals = m.GetCounter().GetValue()
			case "memcgate_async_queue_depth":
				h.asyncDepth = m.GetGauge().GetValue()
			case "memcgate_async_queue_bytes":
				h.asyncBytes = m.GetGauge().GetValue()
			case "memcgate_async_writes_applied_total", "memcgate_async_writes_unconfirmed_total":
				h.asyncApplied += m.GetCounter().GetValue()
			case "memcgate_async_writes_failed_total":
				h.asyncFailed += m.GetCounter().GetValue()
			case "memcgate_async_writes_rejected_total":
				h.asyncRejected += m.GetCounter().GetValue()
			}
		}
	}
	return s
}

func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// codeClass is the index into httpSample.byClass of a status code label.
func codeClass(code string) int {
	if len(code) == 3 && code[0] >= '1' && code[0] <= '5' && strings.Trim(code[1:], "0123456789") == "" {
		return int(code[0] - '0')
	}
	return 0
}

// histogram is a classic Prometheus histogram: cumulative counts at
// ascending finite upper bounds, and the count of every observation (the
// +Inf bucket). The zero histogram has seen nothing.
type histogram struct {
	upper []float64
	cum   []float64
	count float64
}

func histogramOf(h *dto.Histogram) histogram {
	var out histogram
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), +1) {
			continue
		}
		out.upper = append(out.upper, b.GetUpperBound())
		out.cum = append(out.cum, float64(b.GetCumulativeCount()))
	}
	out.count = float64(h.GetSampleCount())
	return out
}

// cumAt is the cumulative count at bound b: that of the largest bound not
// above b (exact when b is one of h's bounds).
func (h histogram) cumAt(b float64) float64 {
	i, found := slices.BinarySearch(h.upper, b)
	if found {
		return h.cum[i]
	}
	if i == 0 {
		return 0
	}
	return h.cum[i-1]
}

// combine returns the histogram over the union of both bounds whose
// counts are f(h's, o's) at every bound and of the totals.
func (h histogram) combine(o histogram, f func(a, b float64) float64) histogram {
	upper := slices.Concat(h.upper, o.upper)
	slices.Sort(upper)
	upper = slices.Compact(upper)
	out := histogram{upper: upper, cum: make([]float64, len(upper)), count: f(h.count, o.count)}
	for i, b := range upper {
		out.cum[i] = f(h.cumAt(b), o.cumAt(b))
	}
	return out
}

// add sums two histograms, such as the series of one node's operations.
// Their bounds are normally the same; if not, the union is used and a
// series lacking a bound counts what it had at its next lower one.
func (h histogram) add(o histogram) histogram {
	if len(h.upper) == 0 && h.count == 0 {
		return o
	}
	return h.combine(o, func(a, b float64) float64 { return a + b })
}

// since returns what h observed after prev, an earlier reading of the same
// series. A count below prev's is a reset (the process restarted, or a
// reload recreated the series): then everything h holds is new, as
// Prometheus's rate() assumes.
func (h histogram) since(prev histogram) histogram {
	if h.count < prev.count {
		return h
	}
	return h.combine(prev, func(a, b float64) float64 { return max(a-b, 0) })
}

// quantile estimates the q-quantile (0 < q < 1) as histogram_quantile does:
// linear interpolation inside the bucket that holds the rank, from 0 for
// the first. It returns NaN if nothing was observed and +Inf if the rank
// lies past the largest finite bound (the answer is only "more than that").
func (h histogram) quantile(q float64) float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	rank := q * h.count
	i, _ := slices.BinarySearchFunc(h.cum, rank, func(c, r float64) int {
		if c < r {
			return -1
		}
		return 1 // first bucket whose count reaches the rank
	})
	if i == len(h.cum) {
		return math.Inf(+1)
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.upper[i-1], h.cum[i-1]
	}
	in := h.cum[i] - below
	if in <= 0 {
		return h.upper[i]
	}
	return lower + (h.upper[i]-lower)*(rank-below)/in
}

// last returns the largest finite bound, 0 if none.
func (h histogram) last() float64 {
	if len(h.upper) == 0 {
		return 0
	}
	return h.upper[len(h.upper)-1]
}

// perSecond is a counter's rate between two readings dt apart; a counter
// that went down was reset, and then all of cur is new. It returns 0 for a
// window that is not positive.
func perSecond(prev, cur float64, dt time.Duration) float64 {
	if dt <= 0 {
		return 0
	}
	d := cur - prev
	if d < 0 {
		d = cur
	}
	return d / dt.Seconds()
}

// delta is a counter's increase between two readings, with resets as in
// perSecond.
func delta(prev, cur float64) float64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// nodeRates is one node's traffic between two snapshots.
type nodeRates struct {
	OpsPerSec       float64
	ErrorRatio      float64 // errors and timeouts per operation; NaN without operations
	FailoversPerSec float64 // its keys served by another node
	P50, P99        float64 // seconds; NaN without operations, +Inf past the last bucket
	Bound           float64 // the latency histogram's largest finite bound
}

// poolRates is one pool's replication work between two snapshots.
type poolRates struct {
	HedgesPerSec, HedgesWonPerSec float64
	FallbacksPerSec               float64 // reads that moved on to the next replica
	ReplicaFailuresPerSec         float64 // replica writes that failed
	WarmFailuresPerSec            float64 // warm-up copies into the pool, and deletes in its warm pool, that failed
}

func poolRatesOf(prev, cur *poolSample, dt time.Duration) poolRates {
	return poolRates{
		HedgesPerSec:          perSecond(prev.hedges, cur.hedges, dt),
		HedgesWonPerSec:       perSecond(prev.hedgesWon, cur.hedgesWon, dt),
		FallbacksPerSec:       perSecond(prev.fallbacks, cur.fallbacks, dt),
		ReplicaFailuresPerSec: perSecond(prev.replicaFailures, cur.replicaFailures, dt),
		WarmFailuresPerSec:    perSecond(prev.warmFailures, cur.warmFailures, dt),
	}
}

// httpRates is the gateway's own traffic between two snapshots.
type httpRates struct {
	PerSec        float64    // every request
	ClassPerSec   [6]float64 // by code/100 as httpSample.byClass
	ErrorRatio    float64    // 5xx per request; NaN without requests
	P50, P99      float64    // as nodeRates
	Bound         float64
	RefusedPerSec float64 // memcgate_buffered_refusals_total
	ConnsRefused  float64 // connections refused at the cap and requests refused a handover, per second
	ConnsBad      float64 // requests answered 400 (431, 501, 417) before any handler, per second
	AsyncPerSec   float64 // async writes applied, or sent as UDP datagrams
	AsyncFailures float64 // async writes failed or rejected, per second
}

// ratesOf computes a node's rates between prev and cur.
func ratesOf(prev, cur *nodeSample, dt time.Duration) nodeRates {
	r := nodeRates{
		OpsPerSec:       perSecond(prev.ops, cur.ops, dt),
		FailoversPerSec: perSecond(prev.failovers, cur.failovers, dt),
		ErrorRatio:      math.NaN(),
	}
	if ops := delta(prev.ops, cur.ops); ops > 0 {
		r.ErrorRatio = min(delta(prev.errors, cur.errors)/ops, 1)
	}
	lat := cur.latency.since(prev.latency)
	r.P50, r.P99, r.Bound = lat.quantile(0.5), lat.quantile(0.99), lat.last()
	return r
}

// httpRatesOf computes the gateway's rates between prev and cur.
func httpRatesOf(prev, cur *httpSample, dt time.Duration) httpRates {
	r := httpRates{ErrorRatio: math.NaN()}
	total := 0.0
	for c := range cur.byClass {
		r.ClassPerSec[c] = perSecond(prev.byClass[c], cur.byClass[c], dt)
		r.PerSec += r.ClassPerSec[c]
		total += delta(prev.byClass[c], cur.byClass[c])
	}
	if total > 0 {
		r.ErrorRatio = delta(prev.byClass[5], cur.byClass[5]) / total
	}
	lat := cur.latency.since(prev.latency)
	r.P50, r.P99, r.Bound = lat.quantile(0.5), lat.quantile(0.99), lat.last()
	r.RefusedPerSec = perSecond(prev.refusals, cur.refusals, dt)
	r.ConnsRefused = perSecond(prev.connsRefused, cur.connsRefused, dt)
	r.ConnsBad = perSecond(prev.connsBad, cur.connsBad, dt)
	r.AsyncPerSec = perSecond(prev.asyncApplied, cur.asyncApplied, dt)
	r.AsyncFailures = perSecond(prev.asyncFailed, cur.asyncFailed, dt) + perSecond(prev.asyncRejected, cur.asyncRejected, dt)
	return r
}

// snapshotRing keeps the last few snapshots the page took, so a view
// compares itself with an earlier one. It is not safe for concurrent use:
// the status page guards it.
type snapshotRing struct {
	buf  [8]snapshot
	n    int // snapshots stored, at most len(buf)
	next int // where the next one goes
}

// minWindow is the shortest span rates are computed over: two views a
// moment apart (a double click, two operators) would otherwise divide
// noise by almost nothing.
const minWindow = time.Second

// base returns the newest stored snapshot at least minWindow older than
// at; ok is false if there is none.
func (r *snapshotRing) base(at time.Time) (s snapshot, ok bool) {
	for i := range r.n {
		c := r.buf[i]
		if at.Sub(c.at) >= minWindow && (!ok || c.at.After(s.at)) {
			s, ok = c, true
		}
	}
	return s, ok
}

// add stores s unless a snapshot less than minWindow older is stored
// already, so that a burst of views cannot push out the older snapshots
// the next views need. The oldest snapshot makes room.
func (r *snapshotRing) add(s snapshot) {
	for i := range r.n {
		if d := s.at.Sub(r.buf[i].at); d < minWindow && d > -minWindow {
			return
		}
	}
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}
