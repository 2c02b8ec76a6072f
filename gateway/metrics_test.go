package gateway

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/upstream"
)

// TestServerErrorCountersFromZero: the 5xx series the alerts watch exist
// at 0 before the first request, and a 503 counts on its pre-made series.
func TestServerErrorCountersFromZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newFake()
	h := NewHandler(s, slog.New(slog.NewTextHandler(io.Discard, nil)), reg, Options{})
	const name = "memcgate_http_requests_total"
	want := 5 * len(precreatedCodes) // GET HEAD PUT POST DELETE
	if got, err := testutil.GatherAndCount(reg, name); err != nil || got != want {
		t.Fatalf("%s has %d series (%v) before any request, want %d", name, got, err, want)
	}
	s.Err = upstream.ErrNoNodes
	if w := do(h, "GET", "/k", ""); w.Code != 503 {
		t.Fatalf("GET with no node = %d, want 503", w.Code)
	}
	if got, err := testutil.GatherAndCount(reg, name); err != nil || got != want {
		t.Errorf("%s has %d series (%v) after a 503, want still %d", name, got, err, want)
	}
	if got := testutil.ToFloat64(h.h.obs.requests.WithLabelValues("GET", "503")); got != 1 {
		t.Errorf(`%s{method="GET",code="503"} = %v, want 1`, name, got)
	}
}
