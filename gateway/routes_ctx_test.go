package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
)

// ctxMark is a context key of the test's own, as a route's middleware
// would add one.
type ctxMark struct{}

// TestRouteWrappingContextKeepsLimits: a handler of Options.Routes that
// derives the request's context (r.WithContext) still reads its body
// under the byte budget and the in-flight cap, which the request's
// context carries: the limits are found through the derived context, not
// lost with it.
func TestRouteWrappingContextKeepsLimits(t *testing.T) {
	tests := []struct {
		name       string
		budget     int64
		body       string
		wantStatus int
		wantBody   string
	}{
		{"fits the budget", 1 << 20, strings.Repeat("v", 8<<10), http.StatusOK, "read 8192 bytes"},
		{"beyond the budget", 16 << 10, strings.Repeat("v", 32<<10), http.StatusServiceUnavailable, "MEMCGATE_MAX_BUFFERED_BYTES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := Route{
				Owns:    func(p string) bool { return strings.HasPrefix(p, "/wrapped/") },
				MaxBody: 1 << 20,
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					r = r.WithContext(context.WithValue(r.Context(), ctxMark{}, true))
					b, err := ReadBody(r, 1<<20, "MEMCGATE_TEST_LIMIT")
					if err != nil {
						status, msg, _ := Status(err)
						http.Error(w, msg, status)
						return
					}
					io.WriteString(w, "read "+strconv.Itoa(len(b))+" bytes")
				}),
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			h := NewHandler(newFake(), log, prometheus.NewRegistry(), Options{Routes: []Route{rt}, Budget: budget.New(tt.budget)})
			w := do(h, http.MethodPost, "/wrapped/x", tt.body)
			if w.Code != tt.wantStatus || !strings.Contains(w.Body.String(), tt.wantBody) {
				t.Fatalf("got %d %q, want %d containing %q", w.Code, w.Body.String(), tt.wantStatus, tt.wantBody)
			}
		})
	}
}

// unwrapper wraps a ResponseWriter as a route's middleware might, and says
// so with Unwrap.
type unwrapper struct{ http.ResponseWriter }

func (u unwrapper) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// TestClientClosedThroughWrappers: ClientClosed reaches the gateway's
// status writer through writers that wrap it and unwrap, and does nothing
// to one that is not the gateway's.
func TestClientClosedThroughWrappers(t *testing.T) {
	tests := []struct {
		name string
		wrap func(http.ResponseWriter) http.ResponseWriter
	}{
		{"the gateway's own", func(w http.ResponseWriter) http.ResponseWriter { return w }},
		{"wrapped once", func(w http.ResponseWriter) http.ResponseWriter { return unwrapper{w} }},
		{"wrapped twice", func(w http.ResponseWriter) http.ResponseWriter { return unwrapper{unwrapper{w}} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sw := &statusWriter{ResponseWriter: httptest.NewRecorder()}
			ClientClosed(tt.wrap(sw))
			if sw.status != statusClientClosed {
				t.Fatalf("status %d, want %d", sw.status, statusClientClosed)
			}
		})
	}
	ClientClosed(httptest.NewRecorder()) // not the gateway's: nothing to record, no panic
}
