package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
)

// discardWriter is a ResponseWriter that keeps nothing, so the benchmark
// measures the handler and not the recorder.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

func benchHandler(b *testing.B, accessLog bool) (http.Handler, *fakeStore) {
	s := newFake()
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	return NewHandler(s, log, prometheus.NewRegistry(), Options{AccessLog: accessLog}), s
}

// The seed benchmark's shape: 96-character keys, 400-byte values.
var benchKey = strings.Repeat("k", 96)

func BenchmarkGet(b *testing.B) {
	for _, accessLog := range []bool{false, true} {
		name := "nolog"
		if accessLog {
			name = "accesslog"
		}
		b.Run(name, func(b *testing.B) {
			h, s := benchHandler(b, accessLog)
			s.put(upstream.Item{Key: benchKey, Value: []byte(strings.Repeat("v", 400))})
			req := httptest.NewRequest("GET", "/"+benchKey, nil)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
}

func BenchmarkPut(b *testing.B) {
	h, _ := benchHandler(b, false)
	body := strings.Repeat("v", 400)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("PUT", "/"+benchKey, strings.NewReader(body))
		clear(w.h)
		h.ServeHTTP(w, req)
	}
}

func BenchmarkCheckKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := checkKey(benchKey, MaxKeyLen); err != nil {
			b.Fatal(err)
		}
	}
}
