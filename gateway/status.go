package gateway

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StatusInfo is the cluster's state as the status page shows it.
type StatusInfo struct {
	Nodes        []NodeInfo // in configured order, pool by pool
	Distribution string     // how keys are placed, e.g. "ketama"
	Failover     string     // what happens to a down node's keys, e.g. "rehash"
	// Pools are the pools, in configured order, the default one first;
	// the page shows them when there are several or one keeps replicas.
	Pools []PoolInfo
}

// PoolInfo is one pool of memcached nodes on the status page.
type PoolInfo struct {
	Name         string        // the pool label of the metrics (none with one pool)
	Prefixes     []string      // the keys it takes; none for the default pool
	Replicas     int           // copies of each key
	Write, Read  string        // its write and read policies
	MissFallback bool          // a miss on one replica reads the next
	HedgeDelay   time.Duration // of a hedged pool; 0 otherwise
	Nodes, Up    int           // its nodes, and how many of them take traffic
	// Warm is the pool it fills its misses from, Shadow the pool its
	// sample of ShadowPercent of the keys is mirrored to; empty for none.
	Warm, Shadow  string
	ShadowPercent float64 // 0 to 100
}

// NodeInfo is one memcached node on the status page.
type NodeInfo struct {
	// Pool is the node's pool when there are several (the pool label of
	// its metrics), else empty.
	Pool   string
	Name   string    // host:port as configured; the node label of the metrics
	Up     bool      // takes traffic
	Since  time.Time // last change of Up; zero if unknown
	Reason string    // why it is in its state ("probe: … connection refused")
	// Share is the node's fraction of the keys on the ring while every
	// node is up (0..1); the shares of all nodes sum to 1.
	Share       float64
	InFlight    int       // operations in flight now
	Connections int64     // open data connections now
	Flaps       int       // ejections in a row that followed a re-admission quickly
	HoldUntil   time.Time // no re-admission before this; zero if none
	// Restarted is when its memcached last restarted, if the gateway saw
	// another process answer at its address (its start, as its stats
	// say); zero if none.
	Restarted time.Time
}

// Reload is one attempt to apply a new configuration, for the status
// page's reload history.
type Reload struct {
	Time    time.Time // when it was attempted
	Result  string    // "ok", or why nothing changed ("invalid", "failed", …)
	Message string    // a line for the operator: the error, or a summary
	Changed []string  // what the reload changed, one item per setting or node
}

// refreshMax bounds ?refresh=: past an hour a page is better reloaded by
// hand.
const refreshMax = 3600

// defaultRefresh is the page's refresh interval without ?refresh=.
const defaultRefresh = 5

//go:embed status.html
var statusHTML string

// parseStatusTemplate parses the embedded page; it panics if the page
// does not parse, which TestStatusPage catches.
func parseStatusTemplate() *template.Template {
	return template.Must(template.New("status").Funcs(template.FuncMap{
		"rate":    fmtRate,
		"pct":     fmtPct,
		"latency": fmtLatency,
		"bytes":   fmtBytes,
		"clock":   fmtClock,
		"age":     fmtAge,
		"width":   barWidth,
		// above is f > limit, false for NaN (nothing measured); the
		// template's gt is !le, true for NaN.
		"above": func(f, limit float64) bool { return f > limit },
		"share": func(f float64) string { return strconv.FormatFloat(f, 'f', 6, 64) },
	}).Parse(statusHTML))
}

// statusPage serves GET /status: see NewAdminHandler. It is safe for
// concurrent use.
type statusPage struct {
	g       prometheus.Gatherer
	src     statusSource
	tmpl    *template.Template
	started time.Time
	host    string
	now     func() time.Time

	mu    sync.Mutex // guards snaps
	snaps snapshotRing
}

// statusSource is what the status page shows besides the registry, taken
// from the Admin the admin handler is given. Every func may be nil.
type statusSource struct {
	build   BuildInfo
	started time.Time
	unready func() string
	status  func() StatusInfo
	reloads func() []Reload
}

// BuildInfo names the binary: its release (or "devel"), VCS revision, the
// Go toolchain that built it and its GOOS/GOARCH.
type BuildInfo struct {
	Version, Revision, GoVersion, Platform string
}

func newStatusPage(g prometheus.Gatherer, src statusSource) *statusPage {
	p := &statusPage{g: g, src: src, tmpl: parseStatusTemplate(), started: src.started, now: time.Now}
	if p.started.IsZero() {
		p.started = time.Now()
	}
	p.host, _ = os.Hostname()
	return p
}

func (p *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	refresh := defaultRefresh
	if s := r.URL.Query().Get("refresh"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > refreshMax {
			text(w, http.StatusBadRequest, fmt.Sprintf("refresh must be a whole number of seconds from 0 (off) to %d\n", refreshMax))
			return
		}
		refresh = n
	}
	v := p.view(refresh)
	var buf bytes.Buffer
	if err := p.tmpl.Execute(&buf, v); err != nil {
		text(w, http.StatusInternalServerError, "status page: "+err.Error()+"\n")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// Everything the page needs is in it: no script, no fetch, no frame.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(buf.Bytes())
}

// sample reads the registry now and returns that snapshot and the one to
// compare it with: the newest earlier view at least minWindow old, or, on
// the first view, the process start (every counter zero then).
func (p *statusPage) sample() (cur, prev snapshot, err error) {
	now := p.now()
	if p.g != nil {
		mfs, gerr := p.g.Gather() // outside the lock: collectors take their own
		cur, err = takeSnapshot(mfs, now), gerr
	} else {
		cur = snapshot{at: now}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	prev, ok := p.snaps.base(now)
	if !ok {
		prev = snapshot{at: p.started}
	}
	p.snaps.add(cur)
	return cur, prev, err
}

// view gathers everything the template shows.
func (p *statusPage) view(refresh int) *statusView {
	cur, prev, err := p.sample()
	dt := cur.at.Sub(prev.at)
	v := &statusView{
		Host:      p.host,
		Now:       cur.at.UTC(),
		Uptime:    cur.at.Sub(p.started),
		Refresh:   refresh,
		Window:    dt,
		FromStart: prev.at.Equal(p.started),
		Build:     p.src.build,
		HTTP:      httpRatesOf(&prev.http, &cur.http, dt),
		Gauges:    cur.http,
	}
	if err != nil {
		v.GatherError = err.Error()
	}
	for _, s := range []int{0, 2, 5, 10, 30} {
		v.Refreshes = append(v.Refreshes, refreshChoice{Seconds: s, Current: s == refresh})
	}
	if p.src.unready != nil {
		v.Ready, v.ReadyWhy = "ready", p.src.unready()
		if v.ReadyWhy != "" {
			v.Ready = "not ready"
		}
	}
	if p.src.status != nil {
		st := p.src.status()
		v.Distribution, v.Failover, v.HaveNodes = st.Distribution, st.Failover, true
		v.MultiPool = len(st.Pools) > 1
		for _, pi := range st.Pools {
			if v.MultiPool || pi.Replicas > 1 {
				v.Pools = append(v.Pools, poolRow{PoolInfo: pi, Rates: poolRatesOf(prev.pool(pi.Name), cur.pool(pi.Name), dt)})
			}
		}
		for _, n := range st.Nodes {
			cn := cur.node(n.Pool, n.Name)
			row := nodeRow{NodeInfo: n, Rates: ratesOf(prev.node(n.Pool, n.Name), cn, dt), MaxInFlight: cn.maxInFlight}
			if !n.Since.IsZero() {
				row.For = cur.at.Sub(n.Since)
			}
			if n.Up {
				v.Up++
			}
			v.ShareSum += n.Share
			v.Nodes = append(v.Nodes, row)
		}
	}
	for c, name := range []string{"other", "1xx", "2xx", "3xx", "4xx", "5xx"} {
		total := cur.http.byClass[c]
		if total == 0 && (c == 0 || c == 1) {
			continue // rare classes only once seen
		}
		row := classRow{Class: name, PerSec: v.HTTP.ClassPerSec[c], Total: total, Share: math.NaN()}
		if v.HTTP.PerSec > 0 {
			row.Share = row.PerSec / v.HTTP.PerSec
		}
		v.Classes = append(v.Classes, row)
	}
	if p.src.reloads != nil {
		v.Reloads = slices.Clone(p.src.reloads())
		slices.SortStableFunc(v.Reloads, func(a, b Reload) int { return b.Time.Compare(a.Time) }) // newest first
		if len(v.Reloads) > maxReloadRows {
			v.OlderReloads = len(v.Reloads) - maxReloadRows
			v.Reloads = v.Reloads[:maxReloadRows]
		}
	}
	return v
}

// maxReloadRows bounds the reload table; the rest is counted.
const maxReloadRows = 20

// statusView is the template's data.
type statusView struct {
	Host        string
	Now         time.Time
	Uptime      time.Duration
	Refresh     int
	Refreshes   []refreshChoice
	Window      time.Duration // what the rates are computed over
	FromStart   bool          // Window runs from the process start: the first view
	Ready       string        // "ready", "not ready", or "" if unknown
	ReadyWhy    string        // why not ready, as /readyz says it
	GatherError string

	HaveNodes              bool
	Distribution, Failover string
	Nodes                  []nodeRow
	Up                     int
	ShareSum               float64 // of every node: 1 per pool
	MultiPool              bool    // the nodes table names each node's pool
	Pools                  []poolRow

	HTTP    httpRates
	Gauges  httpSample
	Classes []classRow

	Reloads      []Reload
	OlderReloads int

	Build BuildInfo
}

type refreshChoice struct {
	Seconds int
	Current bool
}

type nodeRow struct {
	NodeInfo
	Rates       nodeRates
	MaxInFlight float64 // 0: unknown
	For         time.Duration
}

type poolRow struct {
	PoolInfo
	Rates poolRates
}

type classRow struct {
	Class  string
	PerSec float64
	Share  float64 // of the requests in the window; NaN without any
	Total  float64 // since start
}

// Down returns the number of nodes down.
func (v *statusView) Down() int { return len(v.Nodes) - v.Up }

// BufferedShare is the buffered bytes' fraction of their limit; NaN
// without a limit.
func (v *statusView) BufferedShare() float64 {
	if v.Gauges.bufferedLimit <= 0 {
		return math.NaN()
	}
	return v.Gauges.buffered / v.Gauges.bufferedLimit
}

// Buffered and BufferedLimit are the budget's gauges, for the template.
func (v *statusView) Buffered() float64      { return v.Gauges.buffered }
func (v *statusView) BufferedLimit() float64 { return v.Gauges.bufferedLimit }

// AsyncDepth and AsyncBytes are the async queue's gauges.
func (v *statusView) AsyncDepth() float64 { return v.Gauges.asyncDepth }
func (v *statusView) AsyncBytes() float64 { return v.Gauges.asyncBytes }

// InFlight is the gateway's requests in flight.
func (v *statusView) InFlight() float64 { return v.Gauges.inFlight }

// Conns is the client connections open, and by state.
func (v *statusView) Conns() float64 {
	return v.Gauges.connsReading + v.Gauges.connsIdle + v.Gauges.connsActive
}

// ConnsReading, ConnsIdle and ConnsActive are the connections by state.
func (v *statusView) ConnsReading() float64 { return v.Gauges.connsReading }
func (v *statusView) ConnsIdle() float64    { return v.Gauges.connsIdle }
func (v *statusView) ConnsActive() float64  { return v.Gauges.connsActive }

// ConnsMax is the cap on client connections; 0: none, or not exported.
func (v *statusView) ConnsMax() float64 { return v.Gauges.connsMax }

// fmtRate formats a per-second rate compactly.
func fmtRate(r float64) string {
	switch {
	case math.IsNaN(r):
		return "—"
	case r == 0:
		return "0"
	case r < 0.1:
		return "<0.1"
	case r < 10:
		return strconv.FormatFloat(r, 'f', 1, 64)
	case r < 10000:
		return strconv.FormatFloat(r, 'f', 0, 64)
	default:
		return strconv.FormatFloat(r/1000, 'f', 1, 64) + "k"
	}
}

// fmtPct formats a fraction as a percentage; NaN (nothing to divide) is a
// dash.
func fmtPct(f float64) string {
	switch {
	case math.IsNaN(f):
		return "—"
	case f == 0:
		return "0 %"
	case f < 0.001:
		return "<0.1 %"
	default:
		return strconv.FormatFloat(100*f, 'f', 1, 64) + " %"
	}
}

// fmtLatency formats a quantile in seconds; +Inf is "> bound".
func fmtLatency(s, bound float64) string {
	switch {
	case math.IsNaN(s):
		return "—"
	case math.IsInf(s, +1):
		return "> " + fmtSeconds(bound)
	}
	return fmtSeconds(s)
}

func fmtSeconds(s float64) string {
	switch {
	case s < 0.001:
		return strconv.FormatFloat(s*1e6, 'f', 0, 64) + " µs"
	case s < 0.01:
		return strconv.FormatFloat(s*1e3, 'f', 2, 64) + " ms"
	case s < 1:
		return strconv.FormatFloat(s*1e3, 'f', 1, 64) + " ms"
	default:
		return strconv.FormatFloat(s, 'f', 2, 64) + " s"
	}
}

// fmtBytes formats a byte count in binary units.
func fmtBytes(b float64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatFloat(b, 'f', 0, 64) + " B"
	}
	exp, div := 0, float64(unit)
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(b/div, 'f', 1, 64) + " " + "KMGTP"[exp:exp+1] + "iB"
}

// fmtClock formats a time in UTC: the time of day, with the date if it is
// not the day of now.
func fmtClock(t, now time.Time) string {
	t = t.UTC()
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format("15:04:05")
	}
	return t.Format("2006-01-02 15:04:05")
}

// fmtAge formats a duration for people: 42s, 3m12s, 2h03m, 5d04h.
func fmtAge(d time.Duration) string {
	d = max(d, 0).Round(time.Second) // a Since without a monotonic reading may lie ahead of now
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// barWidth is a fraction as a CSS width percentage, clamped to 0..100.
func barWidth(f float64) template.CSS {
	if math.IsNaN(f) || f < 0 {
		f = 0
	}
	return template.CSS(strconv.FormatFloat(100*min(f, 1), 'f', 1, 64) + "%")
}
