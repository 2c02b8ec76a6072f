package route

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's collectors: per pool and policy, what
// replication and hedging did. Every pool's series are created with the
// pool (at 0), so that rate() and increase() see their first event.
type metrics struct {
	writes      *prometheus.CounterVec
	substituted *prometheus.CounterVec
	bgRefused   *prometheus.CounterVec
	fallbacks   *prometheus.CounterVec
	hedges      *prometheus.CounterVec
	hedgeDelay  *prometheus.GaugeVec
	reg         prometheus.Registerer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		reg: reg,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_pool_replica_writes_total",
			Help: "Writes to one replica of a replicated pool, by pool, write policy and result: answered or failed before the write was answered, background_answered or background_failed after it.",
		}, []string{"pool", "policy", "result"}),
		substituted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_pool_replica_substitutions_total",
			Help: "Replica writes moved to the next live node of the key's chain because the replica could not be reached or was taken out of service.",
		}, []string{"pool"}),
		bgRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_pool_background_refused_total",
			Help: "Writes that waited for every replica because the background budget (MEMCGATE_REPLICA_BACKGROUND_BYTES, _OPS) was full.",
		}, []string{"pool"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_pool_read_fallbacks_total",
			Help: "Reads of a replicated pool that moved on to the next replica, by pool, read policy and reason (error, miss).",
		}, []string{"pool", "policy", "reason"}),
		hedges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_pool_hedges_total",
			Help: "Hedged reads' second requests, by pool and result: sent, won (it gave the answer), skipped_busy (the replica had no free slot), skipped_budget (MEMCGATE_HEDGE_MAX_PERCENT reached).",
		}, []string{"pool", "result"}),
		hedgeDelay: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "memcgate_pool_hedge_delay_seconds",
			Help: "The delay after which a hedged read asks a second replica: the median of the pool's nodes' read p95, within MEMCGATE_HEDGE_MIN_DELAY..MEMCGATE_HEDGE_MAX_DELAY.",
		}, []string{"pool"}),
	}
	reg.MustRegister(m.writes, m.substituted, m.bgRefused, m.fallbacks, m.hedges, m.hedgeDelay)
	return m
}

// watchBound exports the background budget's use and caps.
func (m *metrics) watchBound(b *bound) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "memcgate_replica_background_bytes",
			Help: "Value bytes of replica writes running after their write was answered (capped by MEMCGATE_REPLICA_BACKGROUND_BYTES).",
		}, func() float64 { return float64(b.bytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "memcgate_replica_background_ops",
			Help: "Writes with replicas still running after their answer (capped by MEMCGATE_REPLICA_BACKGROUND_OPS).",
		}, func() float64 { return float64(b.ops.Load()) }),
	)
}

// policyMetrics are one view's collectors, resolved once.
type policyMetrics struct {
	writeAnswered, writeFailed, bgAnswered, bgFailed prometheus.Counter
	substituted, bgRefused                           prometheus.Counter
	fallbackError, fallbackMiss                      prometheus.Counter
	hedgesSent, hedgesWon, hedgesBusy, hedgesBudget  prometheus.Counter
}

func (m *metrics) forPolicy(v *view) policyMetrics {
	w, r := string(v.write), string(v.read)
	return policyMetrics{
		writeAnswered: m.writes.WithLabelValues(v.name, w, "answered"),
		writeFailed:   m.writes.WithLabelValues(v.name, w, "failed"),
		bgAnswered:    m.writes.WithLabelValues(v.name, w, "background_answered"),
		bgFailed:      m.writes.WithLabelValues(v.name, w, "background_failed"),
		substituted:   m.substituted.WithLabelValues(v.name),
		bgRefused:     m.bgRefused.WithLabelValues(v.name),
		fallbackError: m.fallbacks.WithLabelValues(v.name, r, "error"),
		fallbackMiss:  m.fallbacks.WithLabelValues(v.name, r, "miss"),
		hedgesSent:    m.hedges.WithLabelValues(v.name, "sent"),
		hedgesWon:     m.hedges.WithLabelValues(v.name, "won"),
		hedgesBusy:    m.hedges.WithLabelValues(v.name, "skipped_busy"),
		hedgesBudget:  m.hedges.WithLabelValues(v.name, "skipped_budget"),
	}
}
