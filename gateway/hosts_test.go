package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestAllowedHosts is the Host rule: what a web page cannot make its own
// name (IP literals, localhost, names under .localhost, no Host at all)
// passes whatever is listed; other names pass only if listed, without
// port or case, a leading dot listing a domain and the names under it.
func TestAllowedHosts(t *testing.T) {
	tests := []struct {
		allowed []string
		host    string
		want    bool
	}{
		// Never a rebinding vector.
		{nil, "", true}, // HTTP/1.0 without Host
		{nil, "127.0.0.1", true},
		{nil, "127.0.0.1:9090", true},
		{nil, "127.1.2.3:9090", true},
		{nil, "[::1]:9090", true},
		{nil, "[::1]", true},
		{nil, "::1", true},
		{nil, "10.0.0.5:8080", true},
		{nil, "[fe80::1%25eth0]:80", true},
		{nil, "localhost", true},
		{nil, "localhost:9090", true},
		{nil, "LOCALHOST:9090", true},
		{nil, "localhost.:9090", true},
		{nil, "app.localhost:9090", true},
		// Names, unlisted.
		{nil, "evil.example", false},
		{nil, "evil.example:9090", false},
		{nil, "localhost.evil.example", false},
		{nil, "evillocalhost", false},
		{nil, "127.0.0.1.nip.io:9090", false},
		{nil, "2130706433", false}, // 127.0.0.1 as one number: not an address a browser sends
		{nil, "[evil.example]:80", false},
		{[]string{"memcgate.internal"}, "evil.example", false},
		// Listed.
		{[]string{"memcgate.internal"}, "memcgate.internal", true},
		{[]string{"memcgate.internal"}, "memcgate.internal:8080", true},
		{[]string{"memcgate.internal"}, "MemcGate.Internal.:8080", true},
		{[]string{"memcgate.internal"}, "a.memcgate.internal", false},
		{[]string{"Memcgate.Internal."}, "memcgate.internal", true},
		{[]string{"a", "b"}, "b:1", true},
		{[]string{".example.com"}, "example.com", true},
		{[]string{".example.com"}, "cache.example.com:8080", true},
		{[]string{".example.com"}, "a.b.EXAMPLE.com", true},
		{[]string{".example.com"}, "badexample.com", false},
		{[]string{".example.com"}, "example.com.evil", false},
		{[]string{"*"}, "evil.example", true},
		{[]string{""}, "evil.example", false},
	}
	for _, tt := range tests {
		a := NewAllowedHosts(tt.allowed)
		if got := a.Allows(tt.host); got != tt.want {
			t.Errorf("ALLOWED_HOSTS=%q: Host %q allowed = %v, want %v", strings.Join(tt.allowed, ","), tt.host, got, tt.want)
		}
	}
	if NewAllowedHosts(nil).Configured() || NewAllowedHosts([]string{" ", ""}).Configured() || !NewAllowedHosts([]string{"*"}).Configured() {
		t.Error("Configured: want false for no names, true for *")
	}
}

// TestHostCheckListeners: the admin listener checks every request's Host,
// /healthz and /readyz included, while it is bound to loopback only or
// names are configured; the data listener only while names are
// configured, before its slot, its body and memcached. Refusals are 421,
// counted by listener (and on the data listener as any answer is) and
// logged a line a second at most.
func TestHostCheckListeners(t *testing.T) {
	mc := memcachedtest.Start(t)
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 2, Timeout: time.Second}, discard, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()

	type setup struct {
		allowed  []string
		loopback bool // the admin listener is bound to loopback only
	}
	tests := []struct {
		name     string
		setup    setup
		listener string // data or admin
		method   string
		target   string
		host     string
		want     int
	}{
		{"loopback admin: rebound name", setup{loopback: true}, "admin", "GET", "/debug/config", "evil.example:9090", 421},
		{"loopback admin: rebound name on /healthz", setup{loopback: true}, "admin", "GET", "/healthz", "evil.example:9090", 421},
		{"loopback admin: rebound name on /readyz", setup{loopback: true}, "admin", "GET", "/readyz", "evil.example", 421},
		{"loopback admin: pprof profile", setup{loopback: true}, "admin", "GET", "/debug/pprof/profile?seconds=30", "evil.example:9090", 421},
		{"loopback admin: localhost", setup{loopback: true}, "admin", "GET", "/debug/config", "localhost:9090", 200},
		{"loopback admin: 127.0.0.1", setup{loopback: true}, "admin", "GET", "/debug/config", "127.0.0.1:9090", 200},
		{"loopback admin: [::1]", setup{loopback: true}, "admin", "GET", "/debug/config", "[::1]:9090", 200},
		{"loopback admin: no Host (HTTP/1.0)", setup{loopback: true}, "admin", "GET", "/healthz", "", 200},
		{"loopback admin: a listed name", setup{allowed: []string{"admin.internal"}, loopback: true}, "admin", "GET", "/debug/config", "admin.internal:9090", 200},
		{"admin on every address: any name", setup{}, "admin", "GET", "/debug/config", "evil.example:9090", 200},
		{"admin on every address, names set: another name", setup{allowed: []string{"admin.internal"}}, "admin", "GET", "/metrics", "evil.example:9090", 421},
		{"admin on every address, names set: a pod IP", setup{allowed: []string{"admin.internal"}}, "admin", "GET", "/healthz", "10.1.2.3:9090", 200},
		{"data, no names: any name", setup{loopback: true}, "data", "PUT", "/k", "evil.example:8080", 201},
		{"data, names set: another name", setup{allowed: []string{"cache.internal"}}, "data", "PUT", "/k", "evil.example:8080", 421},
		{"data, names set: another name's GET", setup{allowed: []string{"cache.internal"}}, "data", "GET", "/k", "evil.example:8080", 421},
		{"data, names set: another name's batch", setup{allowed: []string{"cache.internal"}}, "data", "POST", "/", "evil.example", 421},
		{"data, names set: a listed name", setup{allowed: []string{"cache.internal"}}, "data", "PUT", "/k", "CACHE.internal:8080", 201},
		{"data, names set: localhost", setup{allowed: []string{"cache.internal"}}, "data", "PUT", "/k", "localhost:8080", 201},
		{"data, names set: an IP", setup{allowed: []string{"cache.internal"}}, "data", "PUT", "/k", "10.0.0.7:8080", 201},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if res := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "k", Value: []byte("original")}}); res.Err != nil {
				t.Fatal(res.Err)
			}
			reg := prometheus.NewRegistry()
			var logs bytes.Buffer
			hosts := NewHostCheck(NewAllowedHosts(tt.setup.allowed), slog.New(slog.NewTextHandler(&logs, nil)), reg)
			var h http.Handler
			body := ""
			if tt.listener == "admin" {
				h = NewAdminHandler(reg, Admin{Config: func() any { return "config" }, Hosts: hosts, LoopbackOnly: tt.setup.loopback})
			} else {
				dh := NewHandler(c, discard, reg, Options{MaxValueBytes: 1 << 10, Hosts: hosts})
				h = dh
				if tt.method != "GET" {
					body = "changed"
				}
				if tt.target == "/" {
					body = `{"ops":[{"op":"set","key":"k","value":"changed"}]}`
				}
				r := httptest.NewRequest(tt.method, tt.target, strings.NewReader(body))
				r.Host = tt.host
				if limit := dh.BodyLimit(r); (limit == 0) != (tt.want == 421) {
					t.Errorf("BodyLimit = %d: a body must be read only for a request that is not refused", limit)
				}
			}
			r := httptest.NewRequest(tt.method, tt.target, strings.NewReader(body))
			r.Host = tt.host
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Fatalf("%s %s with Host %q = %d %q, want %d", tt.method, tt.target, tt.host, w.Code, w.Body, tt.want)
			}
			refused := testutil.ToFloat64(hosts.refused.WithLabelValues(tt.listener))
			k := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
			if tt.want != 421 {
				if refused != 0 || logs.Len() != 0 {
					t.Errorf("an allowed request was counted (%v) or logged (%q) as refused", refused, logs.String())
				}
				return
			}
			if refused != 1 {
				t.Errorf("memcgate_http_misdirected_requests_total{listener=%q} = %v, want 1", tt.listener, refused)
			}
			if !strings.Contains(w.Body.String(), `Host "`+tt.host+`"`) || !strings.Contains(w.Body.String(), "MEMCGATE_ALLOWED_HOSTS") {
				t.Errorf("421 body %q: want the Host and the variable to set", w.Body)
			}
			if !strings.Contains(logs.String(), "host="+tt.host) || !strings.Contains(logs.String(), "listener="+tt.listener) {
				t.Errorf("log %q: want the refusal with its Host and listener", logs.String())
			}
			if k.Err != nil || string(k.Item.Value) != "original" {
				t.Errorf("a refused request changed k: %q (%v)", k.Item.Value, k.Err)
			}
			if tt.listener == "data" {
				if n := countOf(t, reg, tt.method, "421"); n != 1 {
					t.Errorf("memcgate_http_requests_total{method=%q,code=\"421\"} = %v, want 1 (refusals counted as other answers are)", tt.method, n)
				}
			}
		})
	}
}

// countOf returns memcgate_http_requests_total{method, code} in reg.
func countOf(t *testing.T, reg *prometheus.Registry, method, code string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "memcgate_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method"] == method && labels["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestHostCheckLogBounded: a page that keeps sending rebound requests
// costs the log a line a second at most; every refusal is counted.
func TestHostCheckLogBounded(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	hosts := NewHostCheck(AllowedHosts{}, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	h := NewAdminHandler(reg, Admin{Hosts: hosts, LoopbackOnly: true})
	const n = 200
	start := time.Now()
	for range n {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.Host = "evil.example"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	lines := strings.Count(logs.String(), "\n")
	if most := int(time.Since(start)/time.Second) + 1; lines < 1 || lines > most {
		t.Errorf("%d refusals in %v logged %d lines, want 1 to %d:\n%s", n, time.Since(start), lines, most, logs.String())
	}
	if got := testutil.ToFloat64(hosts.refused.WithLabelValues("admin")); got != n {
		t.Errorf("refusals counted: %v, want %d", got, n)
	}
	// Set applies to the requests that follow, as a reload does.
	hosts.Set(NewAllowedHosts([]string{"evil.example"}))
	r := httptest.NewRequest("GET", "/healthz", nil)
	r.Host = "evil.example"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("after Set: Host evil.example = %d, want 200", w.Code)
	}
}
