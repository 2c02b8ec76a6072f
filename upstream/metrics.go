package upstream

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
)

// metricOp indexes the per-operation metrics: each verb by its op.Verb
// value, then the operations no verb names.
type metricOp uint8

const (
	opGetMulti metricOp = metricOp(op.MaxVerb) + 1 + iota // a multi-key get
	opSetUDP                                              // a set sent as a UDP datagram
	opStats                                               // stats sent to every node (Cluster.Stats: /memc)
	opVersion                                             // version sent to every node (Cluster.Version)
	opFlushAll                                            // flush_all sent to every node (Cluster.FlushAll)
	numOps
)

// verbOp is the metrics index of a verb.
func verbOp(v op.Verb) metricOp { return metricOp(v) }

func (o metricOp) String() string {
	switch o {
	case opGetMulti:
		return "get_multi"
	case opSetUDP:
		return "set_udp"
	case opStats:
		return "stats"
	case opVersion:
		return "version"
	case opFlushAll:
		return "flush_all"
	}
	return op.Verb(o).String()
}

// valid reports whether o names an operation (index 0 is no verb).
func (o metricOp) valid() bool { return o > 0 && o < numOps }

// result is the outcome of one operation on one node, as counted in metrics.
type result uint8

const (
	resOK       result = iota // hit, stored, deleted, touched
	resMiss                   // not found
	resRejected               // exists, cas conflict, not numeric, too large: a protocol refusal
	resError                  // transport failure or unexpected reply
	resTimeout                // no answer in time
	resBusy                   // refused unsent: the node held its share of requests (busy.go)
	numResults
)

var resultNames = [numResults]string{"ok", "miss", "rejected", "error", "timeout", "busy"}

// ejectReasons are the reason label's values of
// memcgate_upstream_ejections_total (the reasons node.eject is given).
var ejectReasons = []string{"probe", "refused", "timeouts"}

// metrics holds every collector of the package. Counters for a node are
// resolved once per node (nodeMetrics) so the hot path does no label lookups.
type metrics struct {
	ops           *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	up            *prometheus.GaugeVec
	udpUp         *prometheus.GaugeVec
	ejects        *prometheus.CounterVec
	ejectsRefused *prometheus.CounterVec
	probes        *prometheus.CounterVec
	probesLate    *prometheus.CounterVec
	probesSlow    *prometheus.CounterVec
	failovers     *prometheus.CounterVec
	batched       *prometheus.CounterVec
	invalidated   *prometheus.CounterVec
	untracked     *prometheus.CounterVec
	unknown       *prometheus.CounterVec
	restarts      *prometheus.CounterVec
	shareRefused  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_ops_total",
			Help: "Operations for memcached, by node, operation and result (ok, miss, rejected, error, timeout; busy: refused unsent, the node held its share of MEMCGATE_MAX_REQUESTS).",
		}, []string{"node", "op", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "memcgate_upstream_op_duration_seconds",
			Help:    "Time of one memcached operation including the wait for a connection slot.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"node", "op"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "memcgate_upstream_node_up",
			Help: "1 while the node takes traffic, 0 while it is ejected.",
		}, []string{"node"}),
		udpUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "memcgate_upstream_node_udp_up",
			Help: "1 while asynchronous sets to the node go out as UDP datagrams (its MEMCGATE_UDP_PORTS port answered a UDP probe), 0 while they go over TCP. Only nodes with a UDP port have it.",
		}, []string{"node"}),
		ejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_ejections_total",
			Help: "Times a node was taken out of service, by reason (probe, refused, timeouts).",
		}, []string{"node", "reason"}),
		ejectsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_ejections_refused_total",
			Help: "Passive ejections not made because MEMCGATE_MAX_EJECTED_PERCENT of the nodes were already down.",
		}, []string{"node"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_failovers_total",
			Help: "Operations served by another node than the key's owner, by owner.",
		}, []string{"node"}),
		batched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_batched_gets_total",
			Help: "Gets that waited for a busy node and went out inside a multi-key get with others.",
		}, []string{"node"}),
		invalidated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_readmit_invalidated_keys_total",
			Help: "Keys deleted on a node before its re-admission because they were written to other nodes while it was away.",
		}, []string{"node"}),
		untracked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_readmit_untracked_keys_total",
			Help: "Keys written to other nodes while the node was away that it could not remember (its set was full): they may read stale after its re-admission unless MEMCGATE_READMIT_FLUSH is on.",
		}, []string{"node"}),
		unknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_readmit_unknown_history_total",
			Help: "Admissions of a node holding items whose past this process did not see: away since before it started, or added by a reload or SERVERS_DNS answer. Keys written to other nodes on its account before then were not recorded here, so it may serve values older than theirs until they are written again or expire (MEMCGATE_READMIT_FLUSH avoids it).",
		}, []string{"node"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_restarts_total",
			Help: "Restarts of a node's memcached seen by the health probes: another process (another pid, or another start: time less uptime) answered a new probe connection than the one before, whether or not the node went down. Its cache starts empty (unless memcached restarted warm), so its keys miss until written again.",
		}, []string{"node"}),
		shareRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_buffered_share_refusals_total",
			Help: "Values refused unread (503, as when MEMCGATE_MAX_BUFFERED_BYTES is full) because the node's reads already held their share of MEMCGATE_MAX_BUFFERED_BYTES while its values were read, or because four times MEMCGATE_MAX_BUFFERED_BYTES of its large values were already on their way (asked for, not yet read).",
		}, []string{"node"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_probes_total",
			Help: "Active health probes (memcached version), by node and result (ok, fail).",
		}, []string{"node", "result"}),
		probesLate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_probes_late_total",
			Help: "Health probes (and flushes before a re-admission) tried once more because the first try timed out at a deadline the gateway came to a quarter of MEMCGATE_HEALTH_TIMEOUT or more late: the gateway, not memcached, was not running (stopped, starved of CPU, throttled). A probe is sent again; a flush reads on for the answer to the flush_all it sent, never sent twice at once. The probe's result (memcgate_upstream_probes_total) is the second try's.",
		}, []string{"node"}),
		probesSlow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_upstream_probes_slow_total",
			Help: "Failed health probes (counted in memcgate_upstream_probes_total as fail) whose own answer did not come within MEMCGATE_HEALTH_TIMEOUT but the late answer to the probe before them did: memcached answers, slower than the timeout. A node in service stays in it (they do not count toward MEMCGATE_HEALTH_FALL); one out of service is not re-admitted by them.",
		}, []string{"node"}),
	}
	reg.MustRegister(m.ops, m.duration, m.up, m.udpUp, m.ejects, m.ejectsRefused, m.probes, m.probesLate, m.probesSlow, m.failovers, m.batched, m.invalidated, m.untracked, m.unknown, m.restarts, m.shareRefused)
	return m
}

// forget deletes every series of a node that left the cluster.
func (m *metrics) forget(name string) {
	l := prometheus.Labels{"node": name}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{m.ops, m.duration, m.up, m.udpUp, m.ejects, m.ejectsRefused, m.probes, m.probesLate, m.probesSlow, m.failovers, m.batched, m.invalidated, m.untracked, m.unknown, m.restarts, m.shareRefused} {
		v.DeletePartialMatch(l)
	}
}

// nodeMetrics are one node's pre-resolved collectors.
type nodeMetrics struct {
	ops       [numOps][numResults]prometheus.Counter
	duration  [numOps]prometheus.Observer
	up        prometheus.Gauge
	udpUp     prometheus.Gauge // nil for a node without a UDP port
	failovers prometheus.Counter
	batched   prometheus.Counter
	probeOK   prometheus.Counter
	probeFail prometheus.Counter
	probeLate prometheus.Counter // probes sent once more for a deadline seen late (probeClient.late)
	probeSlow prometheus.Counter // probes that got only the late answer to the one before in time (errProbeSlow)
	// staleInvalidated and staleUntracked count keys written elsewhere
	// (stale.go): deleted before re-admission, and not remembered.
	staleInvalidated prometheus.Counter
	staleUntracked   prometheus.Counter
	// unknownHistory counts admissions that may serve stale values
	// because the node's past was not seen here: away since before the
	// process started, or added by a server change (stale.go, "Unknown
	// history").
	unknownHistory prometheus.Counter
	// restarts counts the node's memcached seen replaced by another
	// process (restart.go).
	restarts prometheus.Counter
	// shareRefused counts values refused past the node's share of the
	// byte budget (readshare.go).
	shareRefused prometheus.Counter
}

// forNode resolves a node's collectors. Every counter of the node, for
// every label value it can take, is created here, so that it is exported
// at 0 from the start: increase() and rate() see its first event, which
// they cannot for a series that appears with the value 1. udp says the
// node has a UDP port: only then does it have a UDP gauge.
func (m *metrics) forNode(name string, udp bool) *nodeMetrics {
	nm := &nodeMetrics{
		up:        m.up.WithLabelValues(name),
		failovers: m.failovers.WithLabelValues(name),
		batched:   m.batched.WithLabelValues(name),
		probeOK:   m.probes.WithLabelValues(name, "ok"),
		probeFail: m.probes.WithLabelValues(name, "fail"),
		probeLate: m.probesLate.WithLabelValues(name),
		probeSlow: m.probesSlow.WithLabelValues(name),

		staleInvalidated: m.invalidated.WithLabelValues(name),
		staleUntracked:   m.untracked.WithLabelValues(name),
		unknownHistory:   m.unknown.WithLabelValues(name),
		restarts:         m.restarts.WithLabelValues(name),
		shareRefused:     m.shareRefused.WithLabelValues(name),
	}
	if udp {
		nm.udpUp = m.udpUp.WithLabelValues(name)
	}
	for _, reason := range ejectReasons {
		m.ejects.WithLabelValues(name, reason)
	}
	m.ejectsRefused.WithLabelValues(name)
	for o := range numOps {
		if !o.valid() {
			continue
		}
		nm.duration[o] = m.duration.WithLabelValues(name, o.String())
		for r := range numResults {
			nm.ops[o][r] = m.ops.WithLabelValues(name, o.String(), resultNames[r])
		}
	}
	return nm
}

// poolCollector reports each node's connections, split into in-use and
// idle, from the node's atomic counters at scrape time.
type poolCollector struct {
	nodes func() []*node // the current ones
	desc  *prometheus.Desc
	inFl  *prometheus.Desc
	maxFl *prometheus.Desc
	held  *prometheus.Desc
}

func newPoolCollector(nodes func() []*node) *poolCollector {
	return &poolCollector{
		nodes: nodes,
		desc: prometheus.NewDesc("memcgate_upstream_connections",
			"Open connections to each node, by state (in_use, idle).", []string{"node", "state"}, nil),
		inFl: prometheus.NewDesc("memcgate_upstream_in_flight",
			"Operations in flight on each node (bounded by MEMCGATE_MAX_IN_FLIGHT_PER_NODE; by MEMCGATE_MAX_CONNS_PER_NODE with MEMCGATE_PIPELINE_CONNS=0).", []string{"node"}, nil),
		maxFl: prometheus.NewDesc("memcgate_upstream_max_in_flight",
			"The cap on memcgate_upstream_in_flight (MEMCGATE_MAX_IN_FLIGHT_PER_NODE, or MEMCGATE_MAX_CONNS_PER_NODE with MEMCGATE_PIPELINE_CONNS=0), for saturation ratios.", []string{"node"}, nil),
		held: prometheus.NewDesc("memcgate_upstream_buffered_bytes",
			"Bytes of MEMCGATE_MAX_BUFFERED_BYTES that the node's reads hold while their values are read, from each value's VALUE line to the end of its reply (bounded by the node's share while another node is up).", []string{"node"}, nil),
	}
}

func (p *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.desc
	ch <- p.inFl
	ch <- p.maxFl
	ch <- p.held
}

func (p *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range p.nodes() {
		open, inUse := n.conns.Load(), int64(len(n.sem))
		idle := max(open-inUse, 0)
		ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, float64(min(inUse, open)), n.name, "in_use")
		ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, float64(idle), n.name, "idle")
		ch <- prometheus.MustNewConstMetric(p.inFl, prometheus.GaugeValue, float64(inUse), n.name)
		ch <- prometheus.MustNewConstMetric(p.maxFl, prometheus.GaugeValue, float64(cap(n.sem)), n.name)
		ch <- prometheus.MustNewConstMetric(p.held, prometheus.GaugeValue, float64(n.reads.held.Load()), n.name)
	}
}
