package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/upstream/op"
)

// discardWriter is a ResponseWriter that keeps nothing, so the benchmark
// measures the handler and not the recorder.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

func benchHandler(b *testing.B, accessLog bool) (*Handler, *fakeStore) {
	return benchHandlerLog(b, accessLog, io.Discard)
}

// benchHandlerLog is benchHandler with the access log's lines written
// directly to accessJSON, as the binary does, or through slog if it is nil.
func benchHandlerLog(b *testing.B, accessLog bool, accessJSON io.Writer) (*Handler, *fakeStore) {
	s := newFake()
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	return NewHandler(s, log, prometheus.NewRegistry(), Options{AccessLog: accessLog, AccessLogJSON: accessJSON}), s
}

// The seed benchmark's shape: 96-character keys, 400-byte values.
var benchKey = strings.Repeat("k", 96)

// benchContexts are the two ways a request reaches ServeHTTP: built by h1
// with the handler's own context (NewContext), or with any other context,
// which ServeHTTP replaces with a copy of the request. Both benchmarks copy
// the parsed request once per iteration, as every server does to attach
// a context.
var benchContexts = []string{"newcontext", "copied"}

// requestFor is base as a server hands it to h for one request.
func requestFor(h *Handler, base *http.Request, how string) *http.Request {
	if how == "newcontext" {
		return base.WithContext(h.NewContext(context.Background(), time.Now(), nil))
	}
	return base.WithContext(context.Background())
}

func BenchmarkGet(b *testing.B) {
	for _, lg := range []struct {
		name       string
		accessLog  bool
		accessJSON io.Writer
	}{{"nolog", false, nil}, {"accesslog", true, io.Discard}, {"accesslog-slog", true, nil}} {
		for _, how := range benchContexts {
			b.Run(lg.name+"/"+how, func(b *testing.B) {
				h, s := benchHandlerLog(b, lg.accessLog, lg.accessJSON)
				s.Put(op.Item{Key: benchKey, Value: []byte(strings.Repeat("v", 400))})
				base := httptest.NewRequest("GET", "/"+benchKey, nil)
				w := &discardWriter{h: http.Header{}}
				b.ReportAllocs()
				for b.Loop() {
					clear(w.h)
					h.ServeHTTP(w, requestFor(h, base, how))
				}
			})
		}
	}
}

// BenchmarkPut stores a 400-byte value; the fake store copies it, as
// memcached's connection buffer would.
func BenchmarkPut(b *testing.B) {
	for _, how := range benchContexts {
		b.Run(how, func(b *testing.B) {
			h, _ := benchHandler(b, false)
			value := []byte(strings.Repeat("v", 400))
			base := httptest.NewRequest("PUT", "/"+benchKey, nil)
			base.ContentLength = int64(len(value))
			body := &rewindBody{}
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				body.Reset(value)
				r := requestFor(h, base, how)
				r.Body = body
				h.ServeHTTP(w, r)
			}
		})
	}
}

// rewindBody is a request body that can be read again, so that the
// benchmark allocates no body per iteration.
type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

func BenchmarkCheckKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := checkKey(benchKey, MaxKeyLen); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAsyncPut queues a 400-byte value with Prefer: respond-async
// while Run applies the queue to the fake store, so that it measures
// enqueue (placement, reservations, the push) on the handler path.
func BenchmarkAsyncPut(b *testing.B) {
	benchAsyncPut(b, nil)
}

// BenchmarkAsyncPutLanes is BenchmarkAsyncPut with the writes placed on
// three nodes' lanes (Options.Owners).
func BenchmarkAsyncPutLanes(b *testing.B) {
	benchAsyncPut(b, ownersFunc(func(key string) (int, int) { return int(key[len(key)-1]) % 3, 3 }))
}

func benchAsyncPut(b *testing.B, owners Owners) {
	h := NewHandler(newFake(), slog.New(slog.NewJSONHandler(io.Discard, nil)), prometheus.NewRegistry(), Options{Owners: owners})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- h.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-ran })
	value := []byte(strings.Repeat("v", 400))
	bases := make([]*http.Request, 64) // keys of many workers: one key's share would fill
	for i := range bases {
		bases[i] = httptest.NewRequest("PUT", "/"+benchKey[:90]+strconv.Itoa(100000+i), nil)
		bases[i].Header.Set("Prefer", "respond-async")
		bases[i].ContentLength = int64(len(value))
	}
	body := &rewindBody{}
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		clear(w.h)
		body.Reset(value)
		r := requestFor(h, bases[i%len(bases)], "newcontext")
		i++
		r.Body = body
		h.ServeHTTP(w, r)
	}
	refused := 0.0
	for _, c := range h.h.async.rejectFor {
		refused += testutil.ToFloat64(c)
	}
	b.ReportMetric(refused/float64(i), "refused/op")
}
