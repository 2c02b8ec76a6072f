package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/loggate"
)

// statusWriter records the status and size of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	id     string // the request ID, once a log line has needed it (observer.id)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) recordStatus(status int) { w.status = status }

// ClientClosed records, for a handler of Options.Routes, that the client
// went away before its answer: the request is logged and counted as 499,
// nothing is written, and the connection is closed once the handler
// returns.
func ClientClosed(w http.ResponseWriter) { recordClientClosed(w) }

// recordClientClosed records 499 on the statusWriter under w, through
// writers that wrap it and say so with Unwrap, as http.ResponseController
// finds the connection's writer.
func recordClientClosed(w http.ResponseWriter) {
	for {
		switch t := w.(type) {
		case statusRecorder:
			t.recordStatus(statusClientClosed)
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return
		}
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// observer is the outermost middleware: request ID, metrics, access log and
// panic recovery, in one wrapper so a request costs one statusWriter.
type observer struct {
	log       *slog.Logger // panics
	access    *slog.Logger // access log lines (Options.AccessLogger, else log)
	accessLog atomic.Bool
	// accessJSON, if not nil, takes the access log's lines directly,
	// formatted by appendAccessJSON, in lines from lines (Options.AccessLogJSON).
	accessJSON io.Writer
	lines      sync.Pool // of *[]byte
	requests   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	inFlight   prometheus.Gauge
	idPrefix   string
	seq        atomic.Uint64
	// panics counts the handlers' panics (memcgate_http_panics_total);
	// panicLog lets their error line, stack and all, through a second at
	// most: a client that finds a request that panics repeats it at will.
	panics   atomic.Uint64
	panicLog loggate.Gate

	// The children of requests and duration, looked up once: a
	// WithLabelValues per request hashes the labels and takes a lock.
	counts    [len(methods)][600]atomic.Pointer[prometheus.Counter] // by method and status, filled on first use
	durations [len(methods)]prometheus.Observer
}

// methods are the method label's values; the last is every other method.
var methods = [...]string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost, http.MethodDelete, http.MethodOptions, http.MethodPatch, "OTHER"}

func newObserver(log, access *slog.Logger, reg prometheus.Registerer, accessLog bool, accessJSON io.Writer) *observer {
	if access == nil {
		access = log
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	o := &observer{
		log:        log,
		access:     access,
		accessJSON: accessJSON,
		idPrefix:   hex.EncodeToString(b[:]) + "-",
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_http_requests_total",
			Help: "HTTP requests answered, by method and status code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "memcgate_http_request_duration_seconds",
			Help:    "Time from request headers read to response written, by method.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"method"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "memcgate_http_in_flight_requests",
			Help: "HTTP requests being served.",
		}),
	}
	for i, m := range methods {
		o.durations[i] = o.duration.WithLabelValues(m)
	}
	o.accessLog.Store(accessLog)
	// The server-side failures the 5xx alert and dashboard watch exist
	// from the start at 0, so that increase() sees the first one; other
	// codes appear on first use (pre-creating every method and code would
	// export hundreds of empty series).
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost, http.MethodDelete} {
		for _, code := range precreatedCodes {
			c := o.requests.WithLabelValues(m, strconv.Itoa(code))
			o.counts[method(m)][code].Store(&c)
		}
	}
	reg.MustRegister(o.requests, o.duration, o.inFlight, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "memcgate_http_panics_total",
		Help: "Requests whose handler panicked (answered 500 if nothing was sent yet): a bug. The log has the first stack of each second.",
	}, func() float64 { return float64(o.panics.Load()) }))
	return o
}

// precreatedCodes are the statuses memcgate_http_requests_total exports
// from zero for the API's methods: the gateway's own failures (500) and
// memcached's (502, 503, 504).
var precreatedCodes = []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout}

// method bounds the method label to known methods: the index into methods.
func method(m string) int {
	for i, k := range methods[:len(methods)-1] {
		if m == k {
			return i
		}
	}
	return len(methods) - 1
}

// count counts one answer.
func (o *observer) count(m, status int) {
	if status < 100 || status >= 600 { // not a status net/http would send; counted but not cached
		o.requests.WithLabelValues(methods[m], strconv.Itoa(status)).Inc()
		return
	}
	slot := &o.counts[m][status]
	c := slot.Load()
	if c == nil {
		cc := o.requests.WithLabelValues(methods[m], strconv.Itoa(status))
		slot.Store(&cc)
		c = &cc
	}
	(*c).Inc()
}

// requestID is the client's X-Request-Id if it sent a usable one, else a
// new one: this process's random prefix and a sequence number.
func (o *observer) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		return id
	}
	var b [32]byte // prefix (9 bytes) and sequence number: one allocation, the string
	return string(strconv.AppendUint(append(b[:0], o.idPrefix...), o.seq.Add(1), 10))
}

// id is the request's ID for its log lines: made once, so that a panic's
// line and the access log's carry the same one.
func (o *observer) id(r *http.Request, sw *statusWriter) string {
	if sw.id == "" {
		sw.id = o.requestID(r)
	}
	return sw.id
}

func (o *observer) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := requestStart(r)
		o.inFlight.Inc()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			started := false
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				started = sw.status != 0
				o.recovered(sw, r, p)
			}
			o.record(r, sw, start)
			if started {
				// The answer had begun: finishing it would pass a part
				// off as the whole (a chunked body would get its last
				// chunk). Aborting closes the connection mid-answer.
				panic(http.ErrAbortHandler)
			}
			if sw.status == statusClientClosed {
				// Nothing may be sent: a server that finishes a silent
				// handler with its implicit 200 would tell a client that
				// is still reading (net/http cancels the request when the
				// client half-closes) that a write was made when it was
				// not. Aborting closes the connection instead, as nginx
				// does with its 499.
				panic(http.ErrAbortHandler)
			}
		}()
		// The ID goes into log lines only, and is made only for them; it
		// is not put in the context (an allocation per request nothing
		// reads).
		next.ServeHTTP(sw, r)
	})
}

// recovered counts a handler's panic p, logs it (a line a second at
// most, with the panics not logged before it) and answers 500 if nothing
// was written yet; the middleware cuts an answer already begun.
func (o *observer) recovered(sw *statusWriter, r *http.Request, p any) {
	o.panics.Add(1)
	if unlogged, ok := o.panicLog.Pass(); ok {
		o.log.Error("handler panicked", "request_id", o.id(r, sw), "panic", fmt.Sprint(p), "stack", string(debug.Stack()), "unlogged_before", unlogged)
	}
	if sw.status == 0 {
		writeError(sw, fmt.Errorf("panic: %v", p))
	}
	sw.status = http.StatusInternalServerError
}

// record ends a request whose head was read at start (and which was
// counted in flight): its count, duration and access log line.
func (o *observer) record(r *http.Request, sw *statusWriter, start time.Time) {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	d := time.Since(start)
	m := method(r.Method)
	o.inFlight.Dec()
	o.count(m, sw.status)
	o.durations[m].Observe(d.Seconds())
	if !o.accessLog.Load() || !o.access.Enabled(r.Context(), slog.LevelInfo) { // not even the request ID at MEMCGATE_LOG_LEVEL=warn
		return
	}
	withPath := o.access.Enabled(r.Context(), slog.LevelDebug)
	id := o.id(r, sw)
	if o.accessJSON != nil && !withPath && o.writeAccessJSON(start.Add(d), id, r, sw, d) {
		return
	}
	var buf [7]slog.Attr
	attrs := accessAttrs(buf[:0], id, Shorten(r.Method), sw.status, sw.bytes, d, r.RemoteAddr)
	if withPath {
		attrs = append(attrs, slog.String("path", r.URL.Path))
	}
	o.access.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// maxPooledLine is the largest line buffer kept for the next line: lines
// are about 250 bytes, up to about 500 with a client's long request ID
// and method (each bounded: requestID, Shorten).
const maxPooledLine = 1 << 10

// writeAccessJSON writes the access log line of r, ended at t, to
// accessJSON, unless appendAccessJSON cannot format it.
func (o *observer) writeAccessJSON(t time.Time, id string, r *http.Request, sw *statusWriter, d time.Duration) bool {
	bp, _ := o.lines.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	b, ok := appendAccessJSON((*bp)[:0], t, id, Shorten(r.Method), sw.status, sw.bytes, d, r.RemoteAddr)
	if ok {
		_, _ = o.accessJSON.Write(b)
	}
	if cap(b) <= maxPooledLine { // a long client ID or method
		*bp = b
		o.lines.Put(bp)
	}
	return ok
}
