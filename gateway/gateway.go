// Package gateway serves memcached items over HTTP: GET/HEAD, PUT, DELETE
// and POST on /{key}, plus the admin endpoints. It parses and checks every
// request before anything reaches memcached, and maps every outcome to a
// status code in one place (errors.go). It does not know how keys are
// placed or how nodes are checked: that is the Store's business.
package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// Handler is the data-plane HTTP handler. Run must run for writes sent with
// Prefer: respond-async to be applied.
type Handler struct {
	mux    *chi.Mux
	h      *handler
	routes sync.Pool // *chi.Context, one per request in flight
}

// ServeDetached serves a plain GET, HEAD or PUT of one key with a
// detached response, d being w's: the memcached reply writes it, and the
// server's worker goes on to other connections meanwhile (0003). It
// reports whether it took the request; if not, nothing was done and
// ServeHTTP serves it. h1.Server offers it every request (Detached).
func (h *Handler) ServeDetached(w http.ResponseWriter, r *http.Request, d Detacher) bool {
	return h.h.serveDetached(w, r, d, h)
}

// ServeHTTP bounds the request's memcached work by RequestTimeout and
// routes it. Its context also carries chi's routing context, which chi
// would otherwise add with a second copy of the request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc, _ := h.routes.Get().(*chi.Context)
	if rc == nil {
		rc = chi.NewRouteContext()
	}
	rc.Reset()
	rc.Routes = h.mux
	ctx, r := takeContext(r, h, h.h.lim.requestTimeout())
	ctx.lim = h.h.lim
	ctx.route = rc // back to the pool after the request, as chi does
	defer func() {
		h.h.lim.end(ctx)
		ctx.route = nil // whoever still holds ctx must not find rc reused
		h.routes.Put(rc)
	}()
	h.mux.ServeHTTP(w, r)
}

// BodyLimit is how much of r's body its handler reads, for a server that
// reads bodies whole before the handler runs (h1.Server's BodyLimit): the
// route's limit, or 0 for a request that will be refused before its body
// is read (a refused Host or token, read-only mode).
func (h *Handler) BodyLimit(r *http.Request) int64 {
	hh := h.h
	if hh.opts.Hosts.misdirected(r, false) {
		return 0
	}
	if rt := hh.opts.route(r.URL.Path); rt != nil {
		return rt.MaxBody
	}
	if hh.guard.access(r) != nil {
		return 0
	}
	if r.URL.Path == "/" {
		return hh.opts.BatchMaxBytes
	}
	return hh.opts.MaxValueBytes
}

// NewContext makes the context ServeHTTP gives a request, for a server
// that builds its requests itself (h1.Server's NewContext): ServeHTTP then
// finds it in the request and serves the request as it is, where it would
// otherwise attach its context with WithContext, a copy of the request.
// head is when the request's head was read: the request's duration (the
// access log's duration_ms, memcgate_http_request_duration_seconds)
// counts from it, so that a body the server read before ServeHTTP is in
// it, as a body ServeHTTP reads is; its RequestTimeout counts from it
// too, and again from the end of its body. client, if not nil, is the
// request's connection: a request whose memcached work is large asks it
// whether the client is still there before that work starts (Client). A
// context serves one request.
func (h *Handler) NewContext(parent context.Context, head time.Time, client Client) context.Context {
	if head.IsZero() {
		head = time.Now()
	}
	ctx := newRequestCtx(parent, head, h.h.lim.requestTimeout())
	ctx.maker, ctx.client = h, client
	return ctx
}

// SetLimits changes, for the requests that follow, the cap on requests
// in flight (Options.MaxRequests, 0: none), the deadline of a request's
// memcached work, of each chunk's and of each asynchronous write's
// (Options.RequestTimeout, 0: unchanged) and the access log
// (Options.AccessLog).
func (h *Handler) SetLimits(maxRequests int, requestTimeout time.Duration, accessLog bool) {
	hh := h.h
	hh.lim.lim.max.Store(int64(maxRequests))
	if requestTimeout > 0 {
		hh.lim.timeout.Store(int64(requestTimeout))
		hh.chunks.SetTimeout(requestTimeout)
		hh.async.timeout.Store(int64(requestTimeout)) // writes already being applied keep theirs
	}
	hh.obs.accessLog.Store(accessLog)
}

// RequestsInFlight is the number of requests holding one of the
// MaxRequests slots now.
func (h *Handler) RequestsInFlight() int64 { return h.h.lim.lim.inFlight.Load() }

// Run applies asynchronous writes until ctx is done, then applies the ones
// still queued and returns. Stop the HTTP server before cancelling ctx.
func (h *Handler) Run(ctx context.Context) error { return h.h.async.Run(ctx) }

// NewHandler returns the data-plane handler. Metrics are registered on reg.
// It starts no goroutine; see Run.
func NewHandler(s Store, log *slog.Logger, reg prometheus.Registerer, opts Options) *Handler {
	opts.withDefaults()
	if opts.Panics == nil {
		opts.Panics = panicguard.New(log, reg)
	}
	if opts.Access == nil {
		opts.Access = NewAccess(opts.Tokens, opts.ReadOnly)
	}
	turns := newCPUTurns()
	h := &handler{
		keyParser: keyParser{maxKeyLen: opts.MaxKeyLen, defaultTTL: int32(opts.DefaultTTL / time.Second)},
		opts:      opts,
		codec:     &codec{kind: opts.Codec, php: opts.PHP, pecl: opts.PeclMemcache, maxDecoded: int(opts.MaxValueBytes) * 64, turns: turns},
		lim:       &limits{budget: opts.Budget, takeBody: opts.TakeBody, readError: opts.ReadError, bufs: opts.Buffers, log: log},
		guard:     guard{a: opts.Access},
		log:       log,
		batchOps:  make(chan struct{}, batchParallel),
		turns:     turns,
	}
	h.lim.lim.max.Store(int64(opts.MaxRequests))
	h.lim.timeout.Store(int64(opts.RequestTimeout))
	if h.chunks = opts.Chunks; h.chunks == nil {
		h.chunks = chunk.New(s, chunk.Options{ChunkSize: int(opts.MaxValueBytes), Grace: opts.BigValueGrace, Timeout: opts.RequestTimeout, Panics: opts.Panics}, reg)
	}
	order := opts.WriteOrder
	if order == nil {
		order = NewWriteOrder()
	}
	reg.MustRegister(order.waited)
	h.ex = &executor{store: s, codec: h.codec, ops: s, order: order}
	if opts.BigValueMaxBytes > 0 {
		h.ex.ops, h.ex.chunks = h.chunks, h.chunks
	}
	h.async = newAsyncQueue(h.ex, order, opts.Quiet, opts.Owners, h.lim.budget, max(opts.MaxValueBytes, 1<<20), opts.AsyncWorkers, opts.AsyncQueue, opts.AsyncQueueBytes, opts.RequestTimeout, log, reg)
	h.obs = newObserver(log, opts.AccessLogger, reg, opts.AccessLog, opts.AccessLogJSON)
	h.detachStore = opts.Async
	h.endPanics = opts.Panics.Site("detached_end")
	h.async.panics = opts.Panics.Site("async_write")
	h.batchPanics = opts.Panics.Site("batch")
	h.detached = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_http_detached_responses_total",
		Help: "Requests answered by memcached's reply as it was read, with no goroutine waiting (MEMCGATE_DETACHED_RESPONSES).",
	})
	reg.MustRegister(h.detached, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "memcgate_http_requests_refused_total",
		Help: "Requests answered 503 because every one of the MEMCGATE_MAX_REQUESTS slots was taken (a slow node's share of them refuses as memcgate_upstream_ops_total{result=\"busy\"}).",
	}, func() float64 { return float64(h.lim.refused.Load()) }))
	if b := opts.Budget; b != nil {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "memcgate_buffered_bytes",
				Help: "Bytes held for clients now (request bodies, values, multi-get and batch answers, the async queue, responses waiting for slow readers), against MEMCGATE_MAX_BUFFERED_BYTES.",
			}, func() float64 { return float64(b.Used()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "memcgate_buffered_bytes_limit",
				Help: "MEMCGATE_MAX_BUFFERED_BYTES: the most bytes held for clients at once.",
			}, func() float64 { return float64(b.Limit()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "memcgate_buffered_refusals_total",
				Help: "Bodies, values and answers refused (503, or 507 per key) because they would have passed MEMCGATE_MAX_BUFFERED_BYTES.",
			}, func() float64 { return float64(b.Refused()) }),
		)
	}
	r := chi.NewRouter()
	// A Host refused is refused before anything else: it takes no slot,
	// and the Routes are behind it too.
	r.Use(h.obs.middleware, h.checkHost, h.lim.middleware)
	if len(opts.Routes) > 0 {
		// Served by a middleware rather than routes so that they see
		// every method and authorize themselves (the HttpMemcModule
		// endpoints authorize per command: GET ?cmd=set is a write).
		r.Use(routes(&h.opts))
	}
	r.Group(func(r chi.Router) {
		r.Use(h.guard.authorize)
		r.Get("/", h.multiGet)
		r.Post("/", h.batch)
	})
	// Every other path is a key. It is served from NotFound rather than a
	// "/*" route so that chi does not copy the whole path into a URL
	// parameter (two allocations per request); the key comes from
	// URL.Path either way.
	r.NotFound(h.guard.authorize(http.HandlerFunc(h.serveKey)).ServeHTTP)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			// HTTP/2 with prior knowledge: net/http passes its preface on
			// as a request, PRI * HTTP/2.0.
			writeError(w, errHTTP2)
			return
		}
		writeError(w, &requestError{kind: kindMethod, msg: "method " + Shorten(r.Method) + " is not allowed on /; use GET /?key=… or POST / (batch)", allow: "GET, POST"})
	})
	return &Handler{mux: r, h: h}
}

// checkHost refuses the requests Options.Hosts does not allow.
func (h *handler) checkHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.opts.Hosts.misdirected(r, false) {
			h.opts.Hosts.refuse(w, r, "data")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// routes sends the requests of o.Routes to their handlers and every other
// request on.
func routes(o *Options) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if rt := o.route(r.URL.Path); rt != nil {
				rt.Handler.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}
