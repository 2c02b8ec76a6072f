package gateway

import (
	"io"
	"log/slog"
	"strconv"
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

// TestMetricSeriesBoundedByClientInput: what a client chooses (methods,
// keys, query strings, request IDs, Host names) is no metric's label, so
// the series the registry exports stop growing however many different
// requests come: a thousand methods of its own are one method="OTHER".
func TestMetricSeriesBoundedByClientInput(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := NewHandler(newFake(), slog.New(slog.NewTextHandler(io.Discard, nil)), reg, Options{})
	series := func() int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			n += len(mf.GetMetric())
		}
		return n
	}
	send := func(from, to int) {
		for i := from; i < to; i++ {
			s := strconv.Itoa(i)
			do(h, "M"+s, "/k"+s, "")
			do(h, "GET", "/k"+s+"?x"+s+"=1", "", "X-Request-Id", "id"+s, "Host", "h"+s+".example")
			do(h, "GET", "/?key=a"+s+"&key=b"+s, "")
			do(h, "PUT", "/k"+s, "v", "Prefer", "respond-async")
		}
	}
	send(0, 10)
	after10 := series()
	send(10, 1000)
	if got := series(); got != after10 {
		t.Errorf("the registry exports %d series after 1000 requests of different methods, keys, queries, IDs and hosts, %d after 10: a label follows client input", got, after10)
	}
	if got := testutil.ToFloat64(h.h.obs.requests.WithLabelValues("OTHER", "405")); got != 1000 {
		t.Errorf(`memcgate_http_requests_total{method="OTHER",code="405"} = %v, want 1000`, got)
	}
}
