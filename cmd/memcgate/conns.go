package main

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/cmd/memcgate/internal/closewatch"
	"github.com/memcgate/memcgate/cmd/memcgate/internal/conncap"
	"github.com/memcgate/memcgate/gateway/h1"
)

// connTracker counts the data listener's client connections by state for
// memcgate_http_connections: those net/http serves through its ConnState
// hook, and those the fast path serves from h1.Server.ConnStats (fast,
// nil when net/http serves every connection).
type connTracker struct {
	fast   func() h1.ConnStats
	max    atomic.Int64 // the cap on client connections; 0: none
	stdCap *conncap.Cap // the cap of the listeners net/http serves alone; nil on the fast path
	fastH1 *h1.Server   // the fast path, nil without it
	states sync.Map     // net.Conn → *atomic.Int32, the http.ConnState of each connection net/http serves
	count  [http.StateClosed + 1]atomic.Int64
	news   atomic.Uint64 // connections net/http has taken, ever
	// stdAcceptErrs counts the accept errors net/http waited out and
	// retried on the data listeners, from its log (serverLog).
	stdAcceptErrs atomic.Uint64
	// data and admin count the connections net/http closed before a
	// handler saw their request, on each listener; the fast path's own
	// are in fast's ConnStats.
	data, admin *closewatch.Watch

	connsDesc, acceptedDesc, acceptErrorsDesc, maxDesc, reclaimedDesc, refusedDesc, handedRefusedDesc, badDesc, roomDesc, closedDesc *prometheus.Desc
}

// hook is http.Server.ConnState. Transitions of one connection come in
// order from its own goroutine; only New and Closed touch the map's
// structure, so requests on kept-alive connections take no lock.
func (t *connTracker) hook(c net.Conn, s http.ConnState) {
	if t.stdCap != nil {
		t.stdCap.State(c, s)
	}
	switch s {
	case http.StateNew:
		v := new(atomic.Int32)
		v.Store(int32(s))
		t.states.Store(c, v)
		t.count[s].Add(1)
		t.news.Add(1)
	case http.StateActive, http.StateIdle:
		if v, ok := t.states.Load(c); ok {
			t.count[v.(*atomic.Int32).Swap(int32(s))].Add(-1)
			t.count[s].Add(1)
		}
	case http.StateHijacked, http.StateClosed:
		if v, ok := t.states.LoadAndDelete(c); ok {
			t.count[v.(*atomic.Int32).Load()].Add(-1)
		}
	}
}

// newConnTracker returns a tracker for data listeners whose client
// connections are capped at limit (0: no cap).
func newConnTracker(limit int) *connTracker {
	t := &connTracker{
		maxDesc: prometheus.NewDesc("memcgate_http_connections_max",
			"The cap on client connections open at once over the data listeners (MEMCGATE_MAX_CLIENT_CONNS; 0: none).", nil, nil),
		reclaimedDesc: prometheus.NewDesc("memcgate_http_connections_reclaimed_total",
			"Client connections closed to make room for a new one at the MEMCGATE_MAX_CLIENT_CONNS cap (idle ones, or ones that sent no complete request head nor finished a TLS handshake yet), or for a request the fast path hands to net/http at its share of the cap (idle ones net/http serves, or with none idle the slowest below 1 KiB/s).", nil, nil),
		refusedDesc: prometheus.NewDesc("memcgate_http_connections_refused_total",
			"New client connections closed at the MEMCGATE_MAX_CLIENT_CONNS cap with no idle or silent one to make room (answered 503 on the fast path).", nil, nil),
		connsDesc: prometheus.NewDesc("memcgate_http_connections",
			"Client connections open on the data listener, by state: reading (a request, or a new connection's first bytes, not all here yet), idle (between requests), active (being served).",
			[]string{"state"}, nil),
		acceptedDesc: prometheus.NewDesc("memcgate_http_connections_accepted_total",
			"Client connections accepted on the data listener.", nil, nil),
		handedRefusedDesc: prometheus.NewDesc("memcgate_http_handovers_refused_total",
			"Requests the fast path hands to Go's net/http (chunked bodies, heads over 4 KiB) answered 503 instead, because a thirty-second of the connection cap were net/http's already, none idle or below 1 KiB/s.", nil, nil),
		badDesc: prometheus.NewDesc("memcgate_http_bad_requests_total",
			"Requests answered 400 and their connections closed before any handler, so in no access log line or request metric: heads the fast path cannot read, and framing a proxy in front may read differently (Content-Length with Transfer-Encoding, Transfer-Encoding on HTTP/1.0 or not ending in chunked, a folded header line). The fast path's share of memcgate_http_connections_closed_total{listener=\"data\",reason=\"bad_request\"}.", nil, nil),
		closedDesc: prometheus.NewDesc("memcgate_http_connections_closed_total",
			"Client connections the server closed before any handler saw a request on them, so in no access log line or request metric, by listener and reason: bad_request (a request answered 400, 431, 501 or 417 by the server itself: a head it cannot read or over MEMCGATE_MAX_HEADER_BYTES, framing a proxy in front may read differently), header_timeout (a request head, or a new connection's first bytes, not all there within MEMCGATE_READ_HEADER_TIMEOUT), idle_timeout (no request within MEMCGATE_IDLE_TIMEOUT of the last).",
			[]string{"listener", "reason"}, nil),
		roomDesc: prometheus.NewDesc("memcgate_http_bodies_waiting_for_room",
			"Request bodies waiting, their connections parked, for room in MEMCGATE_MAX_BUFFERED_BYTES to be read (fast path; at most MEMCGATE_REQUEST_TIMEOUT each, then 503). Counted among the reading connections too.", nil, nil),
		acceptErrorsDesc: prometheus.NewDesc("memcgate_http_accept_errors_total",
			"Accept failures on the data listener that the server waited out and retried, mostly a lack of file descriptors (EMFILE): more client connections than the open-file limit allows.", nil, nil),
	}
	t.max.Store(int64(limit))
	return t
}

// setMax changes the cap on client connections (0: none) of every data
// listener, on the fast path and off it.
func (t *connTracker) setMax(limit int) {
	t.max.Store(int64(limit))
	if t.fastH1 != nil {
		t.fastH1.SetMaxConns(limit)
	}
	if t.stdCap != nil {
		t.stdCap.SetMax(limit)
	}
}

// Describe implements prometheus.Collector.
func (t *connTracker) Describe(ch chan<- *prometheus.Desc) {
	ch <- t.connsDesc
	ch <- t.acceptedDesc
	ch <- t.acceptErrorsDesc
	ch <- t.maxDesc
	ch <- t.reclaimedDesc
	ch <- t.refusedDesc
	ch <- t.handedRefusedDesc
	ch <- t.badDesc
	ch <- t.roomDesc
	ch <- t.closedDesc
}

// Collect implements prometheus.Collector: one pass over the fast path's
// connections per scrape.
func (t *connTracker) Collect(ch chan<- prometheus.Metric) {
	reading, idle, active := t.count[http.StateNew].Load(), t.count[http.StateIdle].Load(), t.count[http.StateActive].Load()
	accepted := t.news.Load()
	var reclaimed, refused, handedRefused, bad uint64
	acceptErrors := t.stdAcceptErrs.Load()
	waitingForRoom := 0
	closed := t.data.Counts()
	if t.stdCap != nil {
		reclaimed, refused = t.stdCap.Reclaimed(), t.stdCap.Refused()
	}
	if t.fast != nil {
		s := t.fast()
		reading, idle, active = reading+int64(s.Reading), idle+int64(s.Idle), active+int64(s.Active)
		accepted = s.Accepted // every connection starts there: handed-over ones are not counted twice
		acceptErrors += s.AcceptErrors
		reclaimed, refused, handedRefused, bad = s.Reclaimed, s.Refused, s.HandoversRefused, s.BadRequests
		waitingForRoom = s.WaitingForRoom
		closed[closewatch.BadRequest] += s.BadRequests
		closed[closewatch.HeaderTimeout] += s.HeaderTimeouts
		closed[closewatch.IdleTimeout] += s.IdleTimeouts
	}
	ch <- prometheus.MustNewConstMetric(t.connsDesc, prometheus.GaugeValue, float64(reading), "reading")
	ch <- prometheus.MustNewConstMetric(t.connsDesc, prometheus.GaugeValue, float64(idle), "idle")
	ch <- prometheus.MustNewConstMetric(t.connsDesc, prometheus.GaugeValue, float64(active), "active")
	ch <- prometheus.MustNewConstMetric(t.acceptedDesc, prometheus.CounterValue, float64(accepted))
	ch <- prometheus.MustNewConstMetric(t.acceptErrorsDesc, prometheus.CounterValue, float64(acceptErrors))
	ch <- prometheus.MustNewConstMetric(t.maxDesc, prometheus.GaugeValue, float64(t.max.Load()))
	ch <- prometheus.MustNewConstMetric(t.reclaimedDesc, prometheus.CounterValue, float64(reclaimed))
	ch <- prometheus.MustNewConstMetric(t.refusedDesc, prometheus.CounterValue, float64(refused))
	ch <- prometheus.MustNewConstMetric(t.handedRefusedDesc, prometheus.CounterValue, float64(handedRefused))
	ch <- prometheus.MustNewConstMetric(t.badDesc, prometheus.CounterValue, float64(bad))
	ch <- prometheus.MustNewConstMetric(t.roomDesc, prometheus.GaugeValue, float64(waitingForRoom))
	for listener, n := range map[string][closewatch.Reasons]uint64{"data": closed, "admin": t.admin.Counts()} {
		for i, c := range n {
			ch <- prometheus.MustNewConstMetric(t.closedDesc, prometheus.CounterValue, float64(c), listener, closewatch.Reason(i).String())
		}
	}
}
