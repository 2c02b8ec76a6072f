package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestAdminDebugConfig(t *testing.T) {
	tests := []struct {
		name     string
		config   func() any
		want     int
		wantBody map[string]string
	}{
		{"not wired", nil, 404, nil},
		{"the configuration as JSON", func() any { return map[string]string{"MEMCGATE_SERVERS": "a:1"} }, 200, map[string]string{"MEMCGATE_SERVERS": "a:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(NewAdminHandler(prometheus.NewRegistry(), Admin{Config: tt.config}), "GET", "/debug/config", "")
			if w.Code != tt.want {
				t.Fatalf("GET /debug/config = %d %q, want %d", w.Code, w.Body.String(), tt.want)
			}
			if tt.wantBody == nil {
				return
			}
			var got map[string]string
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("GET /debug/config = %q (%s): %v, want JSON", w.Body.String(), w.Header().Get("Content-Type"), err)
			}
			for k, v := range tt.wantBody {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// TestAdminCrossSite: the admin listener refuses every request a browser
// sends from a page of another site, as the data listener refuses such a
// page's writes (FromOtherSite, TestCrossSiteWrites), so that no web page
// its users open can make the gateway profile or trace itself for a
// minute, again and again; tokens or not. Programs (curl, Prometheus,
// kubelet probes) send neither Sec-Fetch-Site nor Origin, and a person
// opening its address, or following the status page's own links, is not
// another site. Another site's link opens the status page and nothing
// else: not a path that cleans to another one, nor with another method;
// header values are compared as browsers send them, so a variant is
// another site.
func TestAdminCrossSite(t *testing.T) {
	const token = "admin-token-0123456789"
	open := NewAdminHandler(prometheus.NewRegistry(), Admin{})
	guarded := NewAdminHandler(prometheus.NewRegistry(), Admin{Access: NewAccess(NewTokens(map[string]Scope{token: ScopeAdmin}), false)})

	crossSite := []string{"Sec-Fetch-Site", "cross-site"}
	sameSite := []string{"Sec-Fetch-Site", "same-site"}
	oldBrowser := []string{"Origin", "https://evil.example"} // no Sec-Fetch-Site
	tests := []struct {
		name   string
		h      http.Handler
		method string // "" is GET
		target string
		hdr    []string
		want   int
	}{
		{name: "cross-site CPU profile", h: open, target: "/debug/pprof/profile?seconds=60", hdr: crossSite, want: 403},
		{name: "cross-site trace", h: open, target: "/debug/pprof/trace?seconds=60", hdr: crossSite, want: 403},
		{name: "same-site CPU profile", h: open, target: "/debug/pprof/profile?seconds=60", hdr: sameSite, want: 403},
		{name: "old browser's cross-origin trace", h: open, target: "/debug/pprof/trace?seconds=60", hdr: oldBrowser, want: 403},
		{name: "a sandboxed page's Origin: null", h: open, target: "/debug/pprof/profile?seconds=60", hdr: []string{"Origin", "null"}, want: 403},
		{name: "cross-site and another Origin", h: open, target: "/debug/pprof/profile?seconds=60", hdr: append([]string{"Origin", "https://evil.example"}, crossSite...), want: 403},
		{name: "cross-site metrics", h: open, target: "/metrics", hdr: crossSite, want: 403},
		{name: "cross-site healthz", h: open, target: "/healthz", hdr: crossSite, want: 403},
		{name: "cross-site status page", h: open, target: "/status", hdr: crossSite, want: 403},
		{name: "another site's link to the status page", h: open, target: "/status", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 200},
		{name: "another site's link to /", h: open, target: "/", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 200},
		{name: "another site's frame of the status page", h: open, target: "/status", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "iframe"}, crossSite...), want: 403},
		{name: "another site's link to a profile", h: open, target: "/debug/pprof/profile?seconds=60", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 403},
		{name: "another site's link past the status page", h: open, target: "/status/../debug/pprof/profile?seconds=60", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 403},
		{name: "another site's link to //status", h: open, target: "//status", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 403},
		{name: "another site's link to /status/", h: open, target: "/status/", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 403},
		{name: "another site's link to the status page with a query", h: open, target: "/status?refresh=1&x", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 200},
		{name: "another site's link to the status page, the word escaped", h: open, target: "/%73tatus", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 200},
		{name: "another site's form posted to the status page", h: open, method: "POST", target: "/status", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 403},
		{name: "another site's HEAD of the status page", h: open, method: "HEAD", target: "/status", hdr: append([]string{"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, crossSite...), want: 403},
		{name: "cross-site, its value's case changed", h: open, target: "/debug/pprof/profile?seconds=60", hdr: []string{"Sec-Fetch-Site", "Cross-Site"}, want: 403},
		{name: "an old browser's Origin of this host on another port", h: open, target: "/metrics", hdr: []string{"Origin", "http://example.com:8080"}, want: 403},
		{name: "an old browser's Origin of this host in capitals", h: open, target: "/metrics", hdr: []string{"Origin", "http://EXAMPLE.com"}, want: 403},
		{name: "cross-site, with tokens and without one", h: guarded, target: "/debug/pprof/profile?seconds=60", hdr: crossSite, want: 403},
		{name: "cross-site, with tokens and with one", h: guarded, target: "/debug/pprof/profile?seconds=60", hdr: append([]string{"Authorization", "Bearer " + token}, crossSite...), want: 403},
		{name: "curl: metrics", h: open, target: "/metrics", want: 200},
		{name: "curl: healthz", h: open, target: "/healthz", want: 200},
		{name: "curl: readyz", h: open, target: "/readyz", want: 200},
		{name: "curl: status page", h: open, target: "/status", want: 200},
		{name: "curl: pprof index", h: open, target: "/debug/pprof/", want: 200},
		{name: "curl: pprof cmdline", h: open, target: "/debug/pprof/cmdline", want: 200},
		{name: "curl, with tokens: healthz", h: guarded, target: "/healthz", want: 200},
		{name: "curl, with tokens: metrics with the token", h: guarded, target: "/metrics", hdr: []string{"Authorization", "Bearer " + token}, want: 200},
		{name: "typed in the address bar", h: open, target: "/status", hdr: []string{"Sec-Fetch-Site", "none"}, want: 200},
		{name: "the status page's own link", h: open, target: "/status?refresh=2", hdr: []string{"Sec-Fetch-Site", "same-origin"}, want: 200},
		{name: "Origin of the admin listener itself", h: open, target: "/metrics", hdr: []string{"Origin", "http://example.com"}, want: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Bounds a profile the handler would run if it did not refuse.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			method := tt.method
			if method == "" {
				method = "GET"
			}
			r := httptest.NewRequestWithContext(ctx, method, tt.target, nil) // Host: example.com
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				r.Header.Set(tt.hdr[i], tt.hdr[i+1])
			}
			w := httptest.NewRecorder()
			tt.h.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Fatalf("%s %s with %q = %d %q, want %d", method, tt.target, tt.hdr, w.Code, w.Body, tt.want)
			}
			if tt.want == 403 && !strings.Contains(w.Body.String(), "page of another site") {
				t.Errorf("%s %s with %q answered %q, want the reason (a page of another site)", method, tt.target, tt.hdr, w.Body)
			}
		})
	}
}

// TestEmptyKeySaysWhereTheKeyGoes: a request that names no key is told
// where its route takes one. "use /{key}" is the single-key routes'
// answer; on /debug/owners, in a batch operation or a multi-get it sent
// the user to another route.
func TestEmptyKeySaysWhereTheKeyGoes(t *testing.T) {
	admin := NewAdminHandler(prometheus.NewRegistry(), Admin{Owners: func(key string) any { return key }})
	data := newTestHandler(t, newFake())
	tests := []struct {
		name         string
		h            http.Handler
		method, path string
		body         string
		want         string // in the answer
	}{
		{"owners without key", admin, "GET", "/debug/owners", "", "empty key: use /debug/owners?key=K\n"},
		{"owners with an empty key", admin, "GET", "/debug/owners?key=", "", "empty key: use /debug/owners?key=K\n"},
		{"batch operation without key", data, "POST", "/", `{"ops":[{"op":"get"}]}`, `empty key: every operation names its \"key\"`},
		{"multi-get with an empty key", data, "GET", "/?key=a&key=", "", `"": empty key` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(tt.h, tt.method, tt.path, tt.body)
			if got := w.Body.String(); !strings.Contains(got, tt.want) || strings.Contains(got, "/{key}") {
				t.Errorf("%s %s = %d %q, want %q in it and no /{key}", tt.method, tt.path, w.Code, got, tt.want)
			}
		})
	}
}

// TestAdminWorkAtOnce: the admin endpoints that gather the registry or
// the nodes' state (/metrics, the status page, /debug/*) serve at most
// adminWorkers requests at once, each costing what the registry's size
// costs; past that they answer 503 with Retry-After at once. /healthz
// and /readyz are never refused so: probes must pass.
func TestAdminWorkAtOnce(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 100)
	var busy atomic.Int64
	h := NewAdminHandler(prometheus.NewRegistry(), Admin{Nodes: func() any {
		entered <- struct{}{}
		<-release
		return "nodes"
	}, Busy: func() { busy.Add(1) }})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	for range adminWorkers {
		wg.Go(func() {
			if w := do(h, "GET", "/debug/nodes", ""); w.Code != 200 {
				t.Errorf("/debug/nodes within the bound = %d %q, want 200", w.Code, w.Body.String())
			}
		})
	}
	for range adminWorkers {
		<-entered
	}
	// soon is do, or nil if h has not answered within a second.
	soon := func(path string) *httptest.ResponseRecorder {
		ch := make(chan *httptest.ResponseRecorder, 1)
		wg.Go(func() { ch <- do(h, "GET", path, "") })
		select {
		case w := <-ch:
			return w
		case <-time.After(time.Second):
			return nil
		}
	}
	for _, path := range []string{"/metrics", "/status", "/debug/nodes", "/debug/config", "/debug/owners?key=k", "/debug/pprof/"} {
		w := soon(path)
		switch {
		case w == nil:
			t.Errorf("%s with %d admin requests under way: no answer within 1s, want 503 at once", path, adminWorkers)
		case w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), "admin listener serves 4 requests"):
			t.Errorf("%s with %d admin requests under way = %d %q, want 503 with Retry-After naming the bound", path, adminWorkers, w.Code, w.Body.String())
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if w := soon(path); w == nil || w.Code != 200 {
			t.Errorf("%s with %d admin requests under way = %v, want 200", path, adminWorkers, w)
		}
	}
	if got := busy.Load(); got != 6 {
		t.Errorf("Busy called %d times, want 6: once per 503", got)
	}
}

// TestAdminRefusesBodies: no admin endpoint reads a body, so a request
// with one, /healthz's included, is answered 413 and its connection
// closed, the body unread: net/http would otherwise read it after the
// handler until the read timeout, the connection serving all that while
// (test/e2e's TestAdminProbesPastHeldRequests). Without one, it is
// served.
func TestAdminRefusesBodies(t *testing.T) {
	h := NewAdminHandler(prometheus.NewRegistry(), Admin{})
	tests := []struct {
		name, method, path, body string
		want                     int
	}{
		{"a probe", "GET", "/healthz", "", 200},
		{"a probe with a body", "GET", "/healthz", "x", 413},
		{"a readiness probe with a body", "GET", "/readyz", "x", 413},
		{"a POST of metrics", "POST", "/metrics", "x", 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(h, tt.method, tt.path, tt.body)
			if w.Code != tt.want {
				t.Fatalf("%s %s with body %q = %d %q, want %d", tt.method, tt.path, tt.body, w.Code, w.Body.String(), tt.want)
			}
			if tt.want == 413 && (w.Header().Get("Connection") != "close" || !strings.Contains(w.Body.String(), "takes no request body")) {
				t.Errorf("413 with Connection %q and body %q, want close and the reason", w.Header().Get("Connection"), w.Body.String())
			}
		})
	}
}
