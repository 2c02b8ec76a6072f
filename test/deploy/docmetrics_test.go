package deploy

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// docLabelsRE finds a metric with a label list in the docs' prose, as
// `name{node,state=in_use\|idle}` or `name{result="failed"}`.
var docLabelsRE = regexp.MustCompile(`\b((?:memcgate|go|process)_[a-z0-9_]*[a-z0-9])\{([^}]*)\}`)

// docPages are the pages whose metric names must be the binary's: the
// README and docs/, but benchmarks.md, whose dated runs may name what the
// binary exported then.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, p := range pages {
		if rel, _ := filepath.Rel(root, p); rel != filepath.Join("docs", "benchmarks.md") {
			out = append(out, rel)
		}
	}
	return out
}

// TestDocsMetricNames: every metric the README and docs/ name is one the
// binary exports, and every label they give it (`name{label}`,
// `name{label="value"}`, values joined by |) is one of its labels, with
// that value among those it exports. The gateway runs with a UDP port, a
// warm pool and a shadow pool, so that the series those settings add are
// exported. Values of the code label are HTTP statuses, an open set: only
// the label is checked.
func TestDocsMetricNames(t *testing.T) {
	// Names that look like metrics but are the PHP functions of
	// test/php/memcgate_get.php, which docs/php.md prints.
	funcs := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^function (\w+)\(`).FindAllStringSubmatch(read(t, "test/php/memcgate_get.php"), -1) {
		funcs[m[1]] = true
	}
	if len(funcs) == 0 {
		t.Fatal("test/php/memcgate_get.php defines no function")
	}
	type use struct{ page, labels string }
	used := map[string][]use{}
	for _, page := range docPages(t) {
		text := read(t, page)
		for _, m := range metricRE.FindAllString(text, -1) {
			if !funcs[m] {
				used[m] = append(used[m], use{page: page})
			}
		}
		for _, m := range docLabelsRE.FindAllStringSubmatch(text, -1) {
			used[m[1]] = append(used[m[1]], use{page: page, labels: m[2]})
		}
	}
	if len(used) < 50 {
		t.Fatalf("found only %d metric names in the docs: %v", len(used), keys(used))
	}

	mc := memcachedtest.StartUDP(t)
	warm, shadow := memcachedtest.Start(t), memcachedtest.Start(t)
	g := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":         mc.Addr,
		"MEMCGATE_UDP_PORTS":       mc.Addr + "=" + itoa(mc.UDPPort),
		"MEMCGATE_POOLS":           "warm servers=" + warm.Addr + ";shadow servers=" + shadow.Addr,
		"MEMCGATE_WARM_POOL":       "warm",
		"MEMCGATE_SHADOW_POOL":     "shadow",
		"MEMCGATE_HEALTH_INTERVAL": "100ms",
		"MEMCGATE_DRAIN_DELAY":     "0s",
		"MEMCGATE_LOG_FORMAT":      "text",
	})
	g.Start(t)
	// Traffic, so that the histograms have series with their labels.
	client := &http.Client{Timeout: 5 * time.Second}
	for _, r := range []struct{ method, path string }{
		{"PUT", "/docs-metrics"}, {"GET", "/docs-metrics"}, {"GET", "/docs-metrics-miss"},
		{"POST", "/docs-metrics?op=append"}, {"DELETE", "/docs-metrics"},
	} {
		req, err := http.NewRequestWithContext(t.Context(), r.method, "http://"+g.DataAddr+r.path, strings.NewReader("v"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	var fams map[string]*gatewaytest.Family
	// A histogram is named by its family's name too.
	lookup := func(name string) *gatewaytest.Family {
		if f := fams[name]; f != nil {
			return f
		}
		return family(fams, name)
	}
	missing := func() []string {
		var out []string
		for name := range used {
			if lookup(name) == nil && !tlsOnly[name] { // TestTLSCertificateExpiry checks those
				out = append(out, name)
			}
		}
		slices.Sort(out)
		return out
	}
	// The UDP port's gauge comes with its first probe.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if fams, err = g.Families(t.Context()); err != nil {
			t.Fatal(err)
		}
		m := missing()
		if len(m) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, name := range m {
				pages := []string{}
				for _, u := range used[name] {
					pages = append(pages, u.page)
				}
				t.Errorf("%s (named in %v) is not exported by the binary", name, slices.Compact(pages))
			}
			t.Fatalf("metrics exported:\n%s", strings.Join(keys(fams), "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	for _, name := range keys(used) {
		f := lookup(name)
		if f == nil {
			continue // tlsOnly
		}
		for _, u := range used[name] {
			if u.labels == "" {
				continue
			}
			for _, item := range strings.Split(u.labels, ",") {
				label, values, hasValues := strings.Cut(strings.TrimSpace(item), "=")
				if f.Labels[label] == nil {
					t.Errorf("%s: %s{%s}: %s has no label %q (has %v)", u.page, name, u.labels, name, label, keys(f.Labels))
					continue
				}
				if !hasValues || label == "code" {
					continue
				}
				for _, v := range strings.Split(strings.ReplaceAll(values, `\|`, "|"), "|") {
					if v = strings.Trim(v, `"`); !f.Labels[label][v] {
						t.Errorf("%s: %s{%s}: the binary exports %s values %v, not %q", u.page, name, u.labels, label, keys(f.Labels[label]), v)
					}
				}
			}
		}
	}
}
