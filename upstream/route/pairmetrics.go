package route

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
)

// pairMetrics are the warm-up and shadow collectors. A pool's series
// are created (at 0) when its policy is configured.
type pairMetrics struct {
	warmReads     *prometheus.CounterVec
	writeBacks    *prometheus.CounterVec
	ttls          *prometheus.CounterVec
	invalidations *prometheus.CounterVec
	shadow        *prometheus.CounterVec
	shadowDropped *prometheus.CounterVec
}

func newPairMetrics(reg prometheus.Registerer, warmBG, shadBG *bound) *pairMetrics {
	m := &pairMetrics{
		warmReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_warmup_reads_total",
			Help: "Reads of a pool with a warm pool, by pool, warm pool and result: cold_hit (the pool had the key), warm_hit (read from the warm pool), miss (neither had it), warm_error (the warm pool failed; the miss stands).",
		}, []string{"pool", "warm", "result"}),
		writeBacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_warmup_writebacks_total",
			Help: "Warm items copied into their cold pool, by result: stored, exists (a client's write was first), expired (gone or in its last second in the warm pool), changed (rewritten in the warm pool since it was read), failed, dropped (MEMCGATE_WARM_BACKGROUND_BYTES or _OPS full).",
		}, []string{"pool", "warm", "result"}),
		ttls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_warmup_ttl_total",
			Help: "Expirations of warm-up copies, by source: warm (the warm item's remaining TTL, from mg <key> t) or default (MEMCGATE_WARM_DEFAULT_TTL: the warm pool could not tell).",
		}, []string{"pool", "warm", "source"}),
		invalidations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_warmup_invalidations_total",
			Help: "Deletes in the warm pool that follow a write to its cold pool, by result: deleted, absent, failed (the warm pool may still hold an older value).",
		}, []string{"pool", "warm", "result"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_shadow_total",
			Help: "Operations mirrored to a shadow pool, by pool, shadow pool, operation and result: match, mismatch, error (the shadow pool failed).",
		}, []string{"pool", "shadow", "op", "result"}),
		shadowDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_shadow_dropped_total",
			Help: "Operations of the shadow sample not mirrored because MEMCGATE_SHADOW_BACKGROUND_BYTES or _OPS was full.",
		}, []string{"pool", "shadow"}),
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.warmReads, m.writeBacks, m.ttls, m.invalidations, m.shadow, m.shadowDropped,
		gauge("memcgate_warmup_background_bytes", "Value bytes of warm-up write-backs running (capped by MEMCGATE_WARM_BACKGROUND_BYTES).",
			func() float64 { return float64(warmBG.bytes.Load()) }),
		gauge("memcgate_warmup_background_ops", "Warm-up write-backs running (capped by MEMCGATE_WARM_BACKGROUND_OPS).",
			func() float64 { return float64(warmBG.ops.Load()) }),
		gauge("memcgate_shadow_background_bytes", "Value bytes held by operations mirrored to shadow pools (capped by MEMCGATE_SHADOW_BACKGROUND_BYTES).",
			func() float64 { return float64(shadBG.bytes.Load()) }),
		gauge("memcgate_shadow_background_ops", "Operations mirrored to shadow pools and still running (capped by MEMCGATE_SHADOW_BACKGROUND_OPS).",
			func() float64 { return float64(shadBG.ops.Load()) }),
	)
	return m
}

// warmMetrics are one cold pool's warm-up counters, resolved once.
type warmMetrics struct {
	coldHit, warmHit, miss, warmError                             prometheus.Counter
	wbStored, wbExists, wbExpired, wbChanged, wbFailed, wbDropped prometheus.Counter
	ttlKnown, ttlDefault                                          prometheus.Counter
	invDeleted, invAbsent, invFailed                              prometheus.Counter
}

func (m *pairMetrics) forWarm(pool, warm string) warmMetrics {
	r := func(v *prometheus.CounterVec, res string) prometheus.Counter {
		return v.WithLabelValues(pool, warm, res)
	}
	return warmMetrics{
		coldHit: r(m.warmReads, "cold_hit"), warmHit: r(m.warmReads, "warm_hit"),
		miss: r(m.warmReads, "miss"), warmError: r(m.warmReads, "warm_error"),
		wbStored: r(m.writeBacks, "stored"), wbExists: r(m.writeBacks, "exists"), wbExpired: r(m.writeBacks, "expired"),
		wbChanged: r(m.writeBacks, "changed"), wbFailed: r(m.writeBacks, "failed"), wbDropped: r(m.writeBacks, "dropped"),
		ttlKnown: r(m.ttls, "warm"), ttlDefault: r(m.ttls, "default"),
		invDeleted: r(m.invalidations, "deleted"), invAbsent: r(m.invalidations, "absent"), invFailed: r(m.invalidations, "failed"),
	}
}

// shadowMetrics are one pool's shadow counters, by verb and comparison,
// resolved once.
type shadowMetrics struct {
	results [op.MaxVerb + 1][numComparisons]prometheus.Counter
	dropped prometheus.Counter
}

func (m *pairMetrics) forShadow(pool, shadow string) *shadowMetrics {
	sm := &shadowMetrics{}
	for _, v := range op.Verbs() {
		for c := range numComparisons {
			sm.results[v][c] = m.shadow.WithLabelValues(pool, shadow, v.String(), c.String())
		}
	}
	sm.dropped = m.shadowDropped.WithLabelValues(pool, shadow)
	return sm
}

// count counts one comparison of verb v.
func (sm *shadowMetrics) count(v op.Verb, c comparison) {
	if v.Valid() {
		sm.results[v][c].Inc()
	}
}
