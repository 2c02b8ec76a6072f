package gateway

import (
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeRowRE matches a node row of the status page: its name and state
// attributes, and the row's cells.
var nodeRowRE = regexp.MustCompile(`(?s)<tr class="node [^"]*" data-node="([^"]*)" data-state="([^"]*)" data-share="([^"]*)"[^>]*>(.*?)</tr>`)

func testStatus() StatusInfo {
	since := time.Now().Add(-90 * time.Second)
	return StatusInfo{
		Distribution: "ketama",
		Failover:     "rehash",
		Nodes: []NodeInfo{
			{Name: "10.0.0.1:11211", Up: true, Since: since, Reason: "configured", Share: 0.4, InFlight: 2, Connections: 3,
				Restarted: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)},
			{Name: `<script>alert("x")</script>:11211`, Up: false, Since: since, Reason: `probe: <b>boom</b> & "gone"`, Share: 0.35, Flaps: 2, HoldUntil: time.Now().Add(time.Minute)},
			{Name: "cache-c:11211", Up: true, Share: 0.25},
		},
	}
}

func TestStatusPage(t *testing.T) {
	rig := newMetricsRig(t)
	rig.op("10.0.0.1:11211", "get", "ok", 10, .0005)
	rig.req("GET", "200", 10, .0005)
	conns := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "memcgate_http_connections"}, []string{"state"})
	conns.WithLabelValues("reading").Set(3)
	conns.WithLabelValues("idle").Set(20)
	conns.WithLabelValues("active").Set(4)
	rig.reg.MustRegister(conns)
	connsMax := prometheus.NewGauge(prometheus.GaugeOpts{Name: "memcgate_http_connections_max"})
	connsMax.Set(768)
	refused := prometheus.NewCounter(prometheus.CounterOpts{Name: "memcgate_http_connections_refused_total"})
	refused.Add(90)
	rig.reg.MustRegister(connsMax, refused)
	h := NewAdminHandler(rig.reg, Admin{
		Unready: func() string { return "no memcached node is up (0 of 1)" },
		Status:  testStatus,
	})
	tests := []struct {
		name        string
		method      string
		target      string
		want        int
		contains    []string
		notContains []string
	}{
		{
			name: "page", method: "GET", target: "/status", want: 200,
			contains: []string{
				`<meta http-equiv="refresh" content="5">`,
				`NOT READY</span> <span class="why" id="ready-why">no memcached node is up (0 of 1)</span>`, `ketama ring`, `failover rehash`,
				`rates since start (first view)`,
				`no reloads`,
				`together 100.0 %`,
				`&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;:11211</td>`,
				`probe: &lt;b&gt;boom&lt;/b&gt; &amp; &#34;gone&#34;`,
				`hold until`, `2 flaps`, `restarted 2026-03-04 05:06:07</span>`,
				`<div class="value">27</div>`, `4 active · 20 idle · 3 reading · of 768 · <span class="bad-text">`,
			},
			notContains: []string{`<script`, `<b>boom`},
		},
		{name: "root serves it too", method: "GET", target: "/", want: 200, contains: []string{`id="nodes"`}},
		{name: "head", method: "HEAD", target: "/status", want: 200},
		{
			name: "refresh off", method: "GET", target: "/status?refresh=0", want: 200,
			contains: []string{`<a href="?refresh=0" class="current">off</a>`}, notContains: []string{`http-equiv="refresh"`},
		},
		{name: "refresh 30", method: "GET", target: "/status?refresh=30", want: 200, contains: []string{`content="30"`}},
		{name: "refresh not a number", method: "GET", target: "/status?refresh=soon", want: 400, contains: []string{"refresh must be"}},
		{name: "refresh too long", method: "GET", target: "/status?refresh=3601", want: 400},
		{name: "refresh negative", method: "GET", target: "/status?refresh=-1", want: 400},
		{name: "not a GET", method: "POST", target: "/status", want: 405},
		{name: "other paths are not the page", method: "GET", target: "/nope", want: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(h, tt.method, tt.target, "")
			body := w.Body.String()
			if w.Code != tt.want {
				t.Fatalf("%s %s = %d, want %d: %s", tt.method, tt.target, w.Code, tt.want, body)
			}
			if tt.want == 200 {
				if ct := w.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
					t.Errorf("Content-Type = %q, want text/html; charset=utf-8", ct)
				}
				if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
					t.Errorf("Content-Security-Policy = %q, want default-src 'none'", csp)
				}
			}
			for _, s := range tt.contains {
				if !strings.Contains(body, s) {
					t.Errorf("%s %s: body lacks %q", tt.method, tt.target, s)
				}
			}
			for _, s := range tt.notContains {
				if strings.Contains(body, s) {
					t.Errorf("%s %s: body has %q", tt.method, tt.target, s)
				}
			}
		})
	}

	rows := nodeRowRE.FindAllStringSubmatch(do(h, "GET", "/status", "").Body.String(), -1)
	want := []struct{ node, state, share string }{
		{"10.0.0.1:11211", "up", "0.400000"},
		{`&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;:11211`, "down", "0.350000"},
		{"cache-c:11211", "up", "0.250000"},
	}
	if len(rows) != len(want) {
		t.Fatalf("page has %d node rows, want %d", len(rows), len(want))
	}
	for i, w := range want {
		if rows[i][1] != w.node || rows[i][2] != w.state || rows[i][3] != w.share {
			t.Errorf("row %d = node %q state %q share %q, want %q %q %q", i, rows[i][1], rows[i][2], rows[i][3], w.node, w.state, w.share)
		}
	}
	if !strings.Contains(rows[1][4], `<span class="badge down">DOWN</span>`) || !strings.Contains(rows[0][4], `<span class="badge up">UP</span>`) {
		t.Errorf("state badges wrong:\n%s\n%s", rows[0][4], rows[1][4])
	}
}

// TestStatusPageWindow checks that a view's rates are measured since the
// previous view, and since the start on the first.
func TestStatusPageWindow(t *testing.T) {
	rig := newMetricsRig(t)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0.Add(10 * time.Second)
	p := newStatusPage(rig.reg, statusSource{started: t0, status: func() StatusInfo {
		return StatusInfo{Nodes: []NodeInfo{{Name: "a:1", Up: true, Share: 1}}}
	}})
	p.now = func() time.Time { return now }
	view := func() string {
		t.Helper()
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest("GET", "/status", nil))
		if w.Code != http.StatusOK {
			t.Fatalf("GET /status = %d", w.Code)
		}
		return w.Body.String()
	}
	steps := []struct {
		name     string
		ops      int           // operations on a:1 before the view
		advance  time.Duration // clock moved before the view
		contains []string
	}{
		{"first view: since the start", 50, 0, []string{"rates since start (first view)", `data-ops="5.000"`, "up 10s"}},
		{"a moment later: still since the start", 0, 500 * time.Millisecond, []string{"rates since start (first view)"}},
		{"five seconds on: since the first view", 100, 4500 * time.Millisecond, []string{"rates over the last 5.0 s", `data-ops="20.000"`}},
		{"nothing since", 0, 2 * time.Second, []string{"rates over the last 2.0 s", `data-ops="0.000"`}},
	}
	for _, s := range steps {
		if s.ops > 0 {
			rig.op("a:1", "get", "ok", s.ops, .0005)
		}
		now = now.Add(s.advance)
		body := view()
		for _, c := range s.contains {
			if !strings.Contains(body, c) {
				t.Errorf("%s: page lacks %q", s.name, c)
			}
		}
	}
}

func TestStatusPageReloads(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	reloads := []Reload{
		{Time: t0, Result: "ok", Message: "applied after SIGHUP", Changed: []string{"servers: added 10.0.0.9:11211", "log level: debug"}},
		{Time: t0.Add(time.Minute), Result: "invalid", Message: `MEMCGATE_SERVERS: bad port "<x>"`},
	}
	h := NewAdminHandler(newMetricsRig(t).reg, Admin{Reloads: func() []Reload { return reloads }})
	body := do(h, "GET", "/status", "").Body.String()
	for _, s := range []string{`<span class="badge ok">OK</span>`, `<li>servers: added 10.0.0.9:11211</li>`, `<span class="badge bad">invalid</span>`, `bad port &#34;&lt;x&gt;&#34;`, "no node information"} {
		if !strings.Contains(body, s) {
			t.Errorf("page lacks %q", s)
		}
	}
	if i, j := strings.Index(body, "bad port"), strings.Index(body, "applied after SIGHUP"); i < 0 || j < 0 || i > j {
		t.Errorf("reloads not newest first (the newest at %d, the oldest at %d)", i, j)
	}
	if strings.Contains(body, "no reloads") {
		t.Errorf("page says no reloads with %d reloads", len(reloads))
	}
}

func TestStatusPageNeedsAdminToken(t *testing.T) {
	toks := NewTokens(map[string]Scope{"reader-0123456789": ScopeRead, "admin-01234567890": ScopeAdmin})
	h := NewAdminHandler(newMetricsRig(t).reg, Admin{Access: NewAccess(toks, false)})
	tests := []struct {
		name, path, auth string
		want             int
	}{
		{"no token", "/status", "", 401},
		{"read token", "/status", "Bearer reader-0123456789", 403},
		{"admin token", "/status", "Bearer admin-01234567890", 200},
		{"root, no token", "/", "", 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.auth != "" {
				hdr = []string{"Authorization", tt.auth}
			}
			if w := do(h, "GET", tt.path, "", hdr...); w.Code != tt.want {
				t.Errorf("GET %s with %q = %d, want %d", tt.path, tt.auth, w.Code, tt.want)
			}
		})
	}
}

func TestStatusFormats(t *testing.T) {
	tests := []struct {
		name, got, want string
	}{
		{"age seconds", fmtAge(42 * time.Second), "42s"},
		{"age minutes", fmtAge(3*time.Minute + 7*time.Second), "3m07s"},
		{"age hours", fmtAge(26*time.Hour + 3*time.Minute), "26h03m"},
		{"age days", fmtAge(100 * time.Hour), "4d04h"},
		{"age after a clock step back", fmtAge(-3 * time.Second), "0s"},
		{"latency µs", fmtLatency(.000473, 1), "473 µs"},
		{"latency ms", fmtLatency(.00251, 1), "2.51 ms"},
		{"latency tens of ms", fmtLatency(.0945, 1), "94.5 ms"},
		{"latency past the buckets", fmtLatency(inf(), 1), "> 1.00 s"},
		{"latency none", fmtLatency(nan(), 1), "—"},
		{"bytes", fmtBytes(512), "512 B"},
		{"kibibytes", fmtBytes(1536), "1.5 KiB"},
		{"gibibytes", fmtBytes(3 << 30), "3.0 GiB"},
		{"rate", fmtRate(1234.4), "1234"},
		{"rate small", fmtRate(0.05), "<0.1"},
		{"rate large", fmtRate(25300), "25.3k"},
		{"pct", fmtPct(0.3333), "33.3 %"},
		{"pct none", fmtPct(nan()), "—"},
		{"clock today", fmtClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), time.Date(2026, 1, 2, 9, 0, 0, 0, time.UTC)), "03:04:05"},
		{"clock another day", fmtClock(time.Date(2026, 1, 1, 3, 4, 5, 0, time.UTC), time.Date(2026, 1, 2, 9, 0, 0, 0, time.UTC)), "2026-01-01 03:04:05"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

func inf() float64 { return math.Inf(1) }
func nan() float64 { return math.NaN() }

// TestStatusPageRefusalsOutsideHandlers: what is answered before any
// handler, so in no request rate of the page, shows on the Connections
// tile: requests the fast path refused to hand to net/http (503) with the
// connections refused at the cap, and the data listener's bad requests
// (400, 431), but not the admin listener's.
func TestStatusPageRefusalsOutsideHandlers(t *testing.T) {
	rig := newMetricsRig(t)
	handovers := prometheus.NewCounter(prometheus.CounterOpts{Name: "memcgate_http_handovers_refused_total"})
	handovers.Add(90)
	closed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memcgate_http_connections_closed_total"}, []string{"listener", "reason"})
	closed.WithLabelValues("data", "bad_request").Add(45)
	closed.WithLabelValues("data", "idle_timeout").Add(1000)
	closed.WithLabelValues("admin", "bad_request").Add(1000)
	rig.reg.MustRegister(handovers, closed)
	h := NewAdminHandler(rig.reg, Admin{Status: testStatus, Started: time.Now().Add(-90 * time.Second)})
	body := do(h, "GET", "/status", "").Body.String()
	for _, want := range []string{`<div class="tile bad">`, `<span class="bad-text">1.0/s refused</span>`, ` · 0.5/s bad requests</div>`} {
		if !strings.Contains(body, want) {
			t.Errorf("the status page lacks %q", want)
		}
	}
}
