package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
)

func TestTokens(t *testing.T) {
	toks := NewTokens(map[string]Scope{
		"reader-0123456789": ScopeRead,
		"writer-0123456789": ScopeRead | ScopeWrite,
		"admin-01234567890": ScopeAdmin,
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := newFake()
	h := NewHandler(s, log, prometheus.NewRegistry(), Options{Tokens: toks})
	tests := []struct {
		name, method, auth string
		want               int
	}{
		{"no token", "GET", "", 401},
		{"unknown token", "GET", "Bearer nope-0123456789", 401},
		{"not bearer", "GET", "Basic cmVhZGVyOng=", 401},
		{"reader reads", "GET", "Bearer reader-0123456789", 404},
		{"reader writes", "PUT", "Bearer reader-0123456789", 403},
		{"writer writes", "PUT", "Bearer writer-0123456789", 201},
		{"lower-case scheme", "PUT", "bearer writer-0123456789", 201},
		{"admin is not data", "GET", "Bearer admin-01234567890", 403},
	}
	for _, tt := range tests {
		var hdr []string
		if tt.auth != "" {
			hdr = []string{"Authorization", tt.auth}
		}
		w := do(h, tt.method, "/k2", "v", hdr...)
		if w.Code != tt.want {
			t.Errorf("%s: %s with %q = %d %q, want %d", tt.name, tt.method, tt.auth, w.Code, w.Body.String(), tt.want)
		}
		if w.Code == 401 && w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", tt.name)
		}
	}
	admin := NewAdminHandler(prometheus.NewRegistry(), Admin{Access: NewAccess(toks, false), Config: func() any { return map[string]string{"k": "v"} }})
	for _, tt := range []struct {
		path, auth string
		want       int
	}{
		{"/healthz", "", 200},
		{"/readyz", "", 200},
		{"/metrics", "", 401},
		{"/metrics", "Bearer reader-0123456789", 403},
		{"/metrics", "Bearer admin-01234567890", 200},
		{"/debug/config", "", 401},
		{"/debug/config", "Bearer reader-0123456789", 403},
		{"/debug/config", "Bearer admin-01234567890", 200},
	} {
		var hdr []string
		if tt.auth != "" {
			hdr = []string{"Authorization", tt.auth}
		}
		if w := do(admin, "GET", tt.path, "", hdr...); w.Code != tt.want {
			t.Errorf("admin GET %s with %q = %d, want %d", tt.path, tt.auth, w.Code, tt.want)
		}
	}
}

func TestReadOnly(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := newFake()
	h := NewHandler(s, log, prometheus.NewRegistry(), Options{ReadOnly: true})
	for _, m := range []string{"PUT", "DELETE", "POST"} {
		if w := do(h, m, "/k?op=incr", "v"); w.Code != 403 {
			t.Errorf("%s in read-only mode = %d, want 403", m, w.Code)
		}
	}
	if w := do(h, "GET", "/k", ""); w.Code != 404 {
		t.Errorf("GET in read-only mode = %d, want 404 (reads work)", w.Code)
	}
	if s.Calls != 1 {
		t.Errorf("read-only writes reached the store: %d calls, want 1", s.Calls)
	}
}

// blockingStore holds every Get until released, to fill the limiter.
type blockingStore struct {
	*fakeStore
	entered chan struct{}
	release chan struct{}
}

// TestMaxRequests: a request past MaxRequests gets 503 with Retry-After,
// is counted in memcgate_http_requests_refused_total (so that the cap
// is told from the other 503s and alerted on) and logged, a line a
// second at most whatever the rate of refusals.
func TestMaxRequests(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	bs := &blockingStore{fakeStore: newFake(), entered: make(chan struct{}, 2), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	h := NewHandler(blockingGet{bs}, log, reg, Options{MaxRequests: 2})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { do(h, "GET", "/k", "") })
	}
	<-bs.entered
	<-bs.entered
	w := do(h, "GET", "/k", "")
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("third request with MaxRequests=2 = %d (Retry-After %q), want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	start := time.Now()
	for range 50 {
		do(h, "GET", "/k", "")
	}
	most := 1 + int(time.Since(start)/time.Second)
	if got := counterValue(t, reg, "memcgate_http_requests_refused_total"); got != 51 {
		t.Errorf("memcgate_http_requests_refused_total = %v after 51 refusals, want 51", got)
	}
	if n := strings.Count(logs.String(), "MEMCGATE_MAX_REQUESTS"); n < 1 || n > most {
		t.Errorf("51 refusals in %v logged %d lines, want 1 to %d:\n%s", time.Since(start), n, most, logs.String())
	}
	close(bs.release)
	wg.Wait()
	if w := do(h, "GET", "/k", ""); w.Code != 404 {
		t.Errorf("request after the others finished = %d, want 404", w.Code)
	}
}

type blockingGet struct{ *blockingStore }

func (b blockingGet) Do(ctx context.Context, o op.Op) op.Result {
	select {
	case b.entered <- struct{}{}:
		<-b.release
	default:
	}
	return b.fakeStore.Do(ctx, o)
}

// counterValue returns the counter name in reg, unlabelled.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s: not registered", name)
	return 0
}
