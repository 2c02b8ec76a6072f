package deploy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

const (
	dashboardRel = "deploy/monitoring/memcgate-dashboard.json"
	alertsRel    = "deploy/monitoring/memcgate-alerts.yaml"
)

func itoa(i int) string { return strconv.Itoa(i) }

// startGateway runs the built binary against mcs (one new memcached when
// nil) and waits until it is ready.
func startGateway(t *testing.T, mcs []*memcachedtest.Server) *gatewaytest.Gateway {
	t.Helper()
	if mcs == nil {
		mcs = []*memcachedtest.Server{memcachedtest.Start(t)}
	}
	g := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":         memcachedtest.Addrs(mcs),
		"MEMCGATE_HEALTH_INTERVAL": "100ms",
		"MEMCGATE_DRAIN_DELAY":     "0s",
		"MEMCGATE_LOG_FORMAT":      "text",
	})
	g.Start(t)
	return g
}

// promExprs returns the PromQL of the dashboard (panel targets and template
// queries) and of the alert rules, by where they come from.
func promExprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	var dash any
	if err := json.Unmarshal([]byte(read(t, dashboardRel)), &dash); err != nil {
		t.Fatalf("%s: %v", dashboardRel, err)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, k := range keys(v) {
				if s, ok := v[k].(string); ok && (k == "expr" || k == "query" || k == "definition") {
					out[path+"."+k] = s
					continue
				}
				walk(path+"."+k, v[k])
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	walk("dashboard", dash)
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	decodeYAML(t, alertsRel, &rules)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert+r.Record] = r.Expr
		}
	}
	return out
}

var (
	metricRE   = regexp.MustCompile(`\b(?:memcgate|go|process)_[a-z0-9_]*[a-z0-9]\b`)
	selectorRE = regexp.MustCompile(`\b((?:memcgate|go|process)_[a-z0-9_]+)\{([^}]*)\}`)
	matcherRE  = regexp.MustCompile(`(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	groupingRE = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	// helpVarRE finds what looks like a variable in a help text: upper
	// case words joined by underscores, with or without MEMCGATE_.
	helpVarRE = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)
)

// TestMetricNames runs the real binary against real memcached, drives it
// through hits, misses, node failures and a refused ejection so that every
// family has samples, and checks that every metric, label and exact label
// value the dashboard and the alerts use is one the binary exports.
func TestMetricNames(t *testing.T) {
	exprs := promExprs(t)
	used := map[string][]string{} // metric → where
	for where, e := range exprs {
		for _, m := range metricRE.FindAllString(e, -1) {
			used[m] = append(used[m], where)
		}
	}
	if len(used) < 12 {
		t.Fatalf("found only %d metric names in the dashboard and alerts: %v", len(used), keys(used))
	}
	// Every metric of the brief must be watched somewhere.
	for _, m := range []string{
		"memcgate_http_requests_total", "memcgate_http_request_duration_seconds_bucket", "memcgate_http_in_flight_requests",
		"memcgate_upstream_ops_total", "memcgate_upstream_op_duration_seconds_bucket", "memcgate_upstream_connections",
		"memcgate_upstream_in_flight", "memcgate_upstream_node_up", "memcgate_upstream_ejections_total",
		"memcgate_upstream_ejections_refused_total", "memcgate_upstream_probes_total", "memcgate_upstream_failovers_total",
		"memcgate_async_writes_failed_total", "memcgate_buffered_bytes", "memcgate_config_reloads_total",
	} {
		if used[m] == nil {
			t.Errorf("neither the dashboard nor the alerts use %s", m)
		}
	}

	// The first node has a UDP port, so that its UDP gauge is exported;
	// the default pool fills from a warm pool, so that the warm-up
	// series are (they exist only with one).
	mcs := []*memcachedtest.Server{memcachedtest.StartUDP(t), memcachedtest.Start(t)}
	warm := memcachedtest.Start(t)
	g := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":         memcachedtest.Addrs(mcs),
		"MEMCGATE_POOLS":           "warm servers=" + warm.Addr,
		"MEMCGATE_WARM_POOL":       "warm",
		"MEMCGATE_UDP_PORTS":       mcs[0].Addr + "=" + itoa(mcs[0].UDPPort),
		"MEMCGATE_HEALTH_INTERVAL": "100ms",
		"MEMCGATE_DRAIN_DELAY":     "0s",
		"MEMCGATE_LOG_FORMAT":      "text",
	})
	g.Start(t)
	base := "http://" + g.DataAddr
	client := &http.Client{Timeout: 5 * time.Second}
	do := func(method, path, body string) int {
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 20 {
		k := "/metrics-test/" + itoa(i)
		do("PUT", k, "0")
		do("GET", k, "")
		do("GET", k+"/miss", "")
		do("POST", k+"?op=incr", "")
		do("DELETE", k, "")
	}
	// Both nodes die: the first refused connection ejects a node, the
	// second would exceed MAX_EJECTED_PERCENT (50%) and is refused; probes
	// then take both down.
	for _, m := range mcs {
		m.Kill()
	}

	var fams map[string]*gatewaytest.Family
	missing := func() []string {
		var out []string
		for m := range used {
			if family(fams, m) == nil && !tlsOnly[m] {
				out = append(out, m)
			}
		}
		slices.Sort(out)
		return out
	}
	for deadline := time.Now().Add(15 * time.Second); ; {
		for i := range 5 {
			do("GET", "/after-kill/"+itoa(i), "")
		}
		var err error
		if fams, err = g.Families(t.Context()); err != nil {
			t.Fatal(err)
		}
		m := missing()
		probeFail := fams["memcgate_upstream_probes_total"] != nil && fams["memcgate_upstream_probes_total"].Labels["result"]["fail"]
		if len(m) == 0 && probeFail {
			break
		}
		if time.Now().After(deadline) {
			for _, name := range m {
				t.Errorf("%s (used in %v) is not exported by the binary", name, used[name])
			}
			t.Fatalf("metrics exported:\n%s", strings.Join(keys(fams), "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Help texts that name a variable name one that exists.
	known := map[string]bool{}
	for _, v := range config.Vars() {
		known[v.Name] = true
	}
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "# HELP memcgate_") {
			continue
		}
		for _, name := range helpVarRE.FindAllString(line, -1) {
			if !known[name] && !known[config.Prefix+name] {
				t.Errorf("%s: %s is not a variable (memcgate -help lists them)", line, name)
			}
		}
	}

	// Labels: selectors, by/without clauses and exact values.
	for where, e := range exprs {
		for _, sel := range selectorRE.FindAllStringSubmatch(e, -1) {
			f := family(fams, sel[1])
			for _, mt := range matcherRE.FindAllStringSubmatch(sel[2], -1) {
				name, op, val := mt[1], mt[2], mt[3]
				if name == "instance" || name == "job" {
					continue // added by Prometheus
				}
				if f.Labels[name] == nil {
					t.Errorf("%s: %s has no label %q (has %v)", where, sel[1], name, keys(f.Labels))
				} else if op == "=" && !strings.Contains(val, "$") && !f.Labels[name][val] {
					t.Errorf("%s: %s{%s=%q}: the binary exports %s values %v", where, sel[1], name, val, name, keys(f.Labels[name]))
				} else if op == "=~" {
					re, err := regexp.Compile("^(?:" + val + ")$")
					if err != nil {
						t.Errorf("%s: %s=~%q: %v", where, name, val, err)
					} else if !slices.ContainsFunc(keys(f.Labels[name]), re.MatchString) && !strings.Contains(val, "$") {
						t.Errorf("%s: %s=~%q matches none of %v", where, name, val, keys(f.Labels[name]))
					}
				}
			}
		}
		// Grouping labels must exist on at least one metric of the
		// expression (memcached's: TestMemcachedMetricNames).
		if len(metricRE.FindAllString(e, -1)) == 0 {
			continue
		}
		for _, gr := range groupingRE.FindAllStringSubmatch(e, -1) {
			for _, l := range strings.Split(gr[1], ",") {
				l = strings.TrimSpace(l)
				if l == "" || l == "le" || l == "instance" || l == "job" {
					continue
				}
				found := false
				for _, m := range metricRE.FindAllString(e, -1) {
					if f := family(fams, m); f != nil && f.Labels[l] != nil {
						found = true
					}
				}
				if !found {
					t.Errorf("%s: groups by %q, a label none of its metrics has", where, l)
				}
			}
		}
	}
}

// tlsOnly are the metrics the binary exports only with a TLS file
// configured, which TestMetricNames's gateway has none of:
// TestTLSCertificateExpiry checks them.
var tlsOnly = map[string]bool{"memcgate_tls_certificate_expiry_timestamp_seconds": true}

// family finds name's family: itself, or the histogram a _bucket, _sum or
// _count series belongs to.
func family(fams map[string]*gatewaytest.Family, name string) *gatewaytest.Family {
	if f := fams[name]; f != nil && f.Type != "histogram" {
		return f
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f := fams[base]; f != nil && f.Type == "histogram" {
				return f
			}
		}
	}
	return nil
}

// TestDashboardLayout: panels have unique ids, fit the 24-column grid and do
// not overlap; every target names the templated data source.
func TestDashboardLayout(t *testing.T) {
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			GridPos struct{ H, W, X, Y int } `json:"gridPos"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(read(t, dashboardRel)), &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || len(d.Panels) < 10 {
		t.Fatalf("dashboard uid %q with %d panels", d.UID, len(d.Panels))
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Fatalf("panel %q overlaps %q at (%d,%d)", p.Title, other, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: want the ${datasource} variable and at least one target", p.Title)
		}
	}
}

// TestPromQL checks the syntax of every alert and dashboard expression with
// promtool (Debian package prometheus, which make test installs).
func TestPromQL(t *testing.T) {
	promtool := gatewaytest.Tool(t, "promtool", "prometheus")
	if out, err := run(t, "", promtool, "check", "rules", filepath.Join(root, alertsRel)); err != nil {
		t.Errorf("promtool check rules %s: %v\n%s", alertsRel, err, out)
	}
	// Dashboard queries as recording rules, Grafana's variables filled in.
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for where, e := range promExprs(t) {
		if !strings.HasPrefix(where, "dashboard") {
			continue
		}
		if m := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`).FindStringSubmatch(e); m != nil {
			e = m[1]
		}
		e = strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*").Replace(e)
		rules = append(rules, rule{Record: "dashboard:q" + itoa(len(rules)), Expr: e})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "", promtool, "check", "rules", path); err != nil {
		t.Errorf("dashboard queries do not parse: %v\n%s\n%s", err, out, b)
	}
}

// exporterVersion is the memcached-exporter image deploy/kubernetes runs
// next to each memcached node; memcachedMetrics lists the series of that
// version (its metrics.md and pkg/exporter) that the dashboard and alerts
// may use, with their labels. Bump both together.
const exporterVersion = "v0.16.0"

var memcachedMetrics = map[string][]string{
	"memcached_up":                         nil,
	"memcached_uptime_seconds":             nil,
	"memcached_version":                    {"version"},
	"memcached_commands_total":             {"command", "status"},
	"memcached_current_items":              nil,
	"memcached_items_total":                nil,
	"memcached_items_evicted_total":        nil,
	"memcached_items_reclaimed_total":      nil,
	"memcached_current_bytes":              nil,
	"memcached_limit_bytes":                nil,
	"memcached_current_connections":        nil,
	"memcached_max_connections":            nil,
	"memcached_connections_total":          nil,
	"memcached_connections_rejected_total": nil,
	"memcached_read_bytes_total":           nil,
	"memcached_written_bytes_total":        nil,
}

// TestMemcachedMetricNames: the memcached_* series the dashboard and the
// alerts use are ones the pinned exporter exports, with those labels; the
// memcgate ones are checked against the real binary by TestMetricNames.
func TestMemcachedMetricNames(t *testing.T) {
	mcRE := regexp.MustCompile(`\bmemcached_[a-z0-9_]*[a-z0-9]\b`)
	mcSelRE := regexp.MustCompile(`\b(memcached_[a-z0-9_]+)\{([^}]*)\}`)
	used := 0
	for where, e := range promExprs(t) {
		for _, m := range mcRE.FindAllString(e, -1) {
			used++
			if _, ok := memcachedMetrics[m]; !ok {
				t.Errorf("%s: %s is not a metric of memcached-exporter %s", where, m, exporterVersion)
			}
		}
		for _, sel := range mcSelRE.FindAllStringSubmatch(e, -1) {
			for _, mt := range matcherRE.FindAllStringSubmatch(sel[2], -1) {
				if l := mt[1]; !targetLabel(l) && !slices.Contains(memcachedMetrics[sel[1]], l) {
					t.Errorf("%s: %s has no label %q", where, sel[1], l)
				}
			}
		}
		if mcRE.MatchString(e) {
			for _, gr := range groupingRE.FindAllStringSubmatch(e, -1) {
				for _, l := range strings.Split(gr[1], ",") {
					l = strings.TrimSpace(l)
					// An expression with memcgate's metrics too (an
					// exporter's alert quiet for what the gateways
					// count) may group by theirs: TestMetricNames
					// checks those against the binary.
					ok := l == "" || targetLabel(l) || metricRE.MatchString(e)
					for _, m := range mcRE.FindAllString(e, -1) {
						ok = ok || slices.Contains(memcachedMetrics[m], l)
					}
					if !ok {
						t.Errorf("%s: groups by %q, a label none of its metrics has", where, l)
					}
				}
			}
		}
	}
	// The panels issue 18 asks for: hit ratio, evictions, items and
	// connections per node.
	for _, m := range []string{"memcached_commands_total", "memcached_items_evicted_total", "memcached_current_items", "memcached_current_connections"} {
		found := false
		for _, e := range promExprs(t) {
			found = found || strings.Contains(e, m) && strings.Contains(e, "by (pod)")
		}
		if !found {
			t.Errorf("no dashboard query shows %s per node (by (pod))", m)
		}
	}
	if used == 0 {
		t.Error("the dashboard uses no memcached_* metric: memcached's own statistics are nowhere")
	}
}

// targetLabel reports whether l is a label the shipped scrape configs put
// on every series of a target (job, instance; pod and namespace in
// deploy/kubernetes).
func targetLabel(l string) bool {
	return l == "job" || l == "instance" || l == "pod" || l == "namespace"
}

// TestRunbook: every alert links its own section of docs/runbook.md, and
// every section there belongs to an alert.
func TestRunbook(t *testing.T) {
	const prefix = "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#"
	anchors := map[string]string{} // GitHub's anchor → heading
	for _, line := range strings.Split(read(t, "docs/runbook.md"), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			anchors[githubAnchor(h)] = h
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Annotations map[string]string
			}
		}
	}
	decodeYAML(t, alertsRel, &rules)
	linked := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, prefix)
			switch {
			case !ok:
				t.Errorf("alert %s: runbook_url %q, want %s<anchor>", r.Alert, url, prefix)
			case anchors[anchor] != r.Alert:
				t.Errorf("alert %s: runbook_url anchor #%s is not a section named %s in docs/runbook.md", r.Alert, anchor, r.Alert)
			}
			linked[anchor] = true
		}
	}
	for a, h := range anchors {
		if !linked[a] {
			t.Errorf("docs/runbook.md section %q belongs to no alert", h)
		}
	}
	if len(linked) < 10 {
		t.Errorf("only %d alerts link the runbook", len(linked))
	}
}

// githubAnchor is the fragment GitHub gives a Markdown heading: lower
// case, spaces as hyphens, punctuation but - and _ dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
