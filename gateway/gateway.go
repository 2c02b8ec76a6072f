// Package gateway serves memcached items over HTTP: GET/HEAD, PUT, DELETE
// and POST on /{key}, plus the admin endpoints. It parses and checks every
// request before anything reaches memcached, and maps every outcome to a
// status code in one place (errors.go). It does not know how keys are
// placed or how nodes are checked: that is the Store's business.
package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream"
)

// Store is what the gateway needs from the memcached side.
// *upstream.Cluster implements it. The methods that take an item must not
// keep its Value after they return: the gateway reuses the buffer.
type Store interface {
	Get(ctx context.Context, key string) (upstream.Item, error)
	Set(ctx context.Context, it upstream.Item) error
	Add(ctx context.Context, it upstream.Item) error
	Replace(ctx context.Context, it upstream.Item) error
	CompareAndSwap(ctx context.Context, it upstream.Item) error
	Append(ctx context.Context, it upstream.Item) error
	Prepend(ctx context.Context, it upstream.Item) error
	Delete(ctx context.Context, key string) error
	Incr(ctx context.Context, key string, delta uint64) (uint64, error)
	Decr(ctx context.Context, key string, delta uint64) (uint64, error)
	Touch(ctx context.Context, key string, exptime int32) error
	// Up reports whether an operation on key could be served now: its
	// node, or one it fails over to, is up.
	Up(key string) bool
	// GetMulti reads many keys, each once, keeping at most limit bytes of
	// values (0: no limit; the keys of values past it fail with
	// upstream.ErrOverLimit); a key in neither map is a miss.
	GetMulti(ctx context.Context, keys []string, limit int) (found map[string]upstream.Item, failed map[string]error)
}

// Options configures the data handler. Zero values take the defaults named
// on each field.
type Options struct {
	// MaxKeyLen is the longest key a client may send; if zero, MaxKeyLen
	// (250). Set it to 250 minus the length of the store's key prefix.
	MaxKeyLen int
	// MaxValueBytes caps request bodies; larger ones get 413 and nothing is
	// stored. If zero, 1048000 (fits memcached's default 1 MiB item).
	MaxValueBytes int64
	// DefaultTTL is the expiration of writes without ?exptime=; zero means
	// never.
	DefaultTTL time.Duration
	// RequestTimeout bounds all memcached work of one request; if zero, 2s.
	RequestTimeout time.Duration
	// AccessLog writes one log line per request.
	AccessLog bool
	// AccessLogJSON, if not nil, is where access log lines go without
	// log/slog, as the exact bytes slog's JSONHandler would write for them
	// (about half the cost, and no allocation but the request ID's).
	// Lines that need JSON escaping, and all of them when the logger is
	// enabled at debug level (which adds the path), still go through the
	// logger. Set it only to the writer of a logger made with
	// slog.NewJSONHandler(w, nil), or with options that leave its
	// records' shape alone (Level). Unlike slog's handler, the gateway
	// does not serialize its writes: w must be safe for concurrent use
	// and write each call's bytes whole (cmd/memcgate's log buffer does).
	AccessLogJSON io.Writer
	// Memc, if set, adds the HttpMemcModule-compatible endpoints.
	Memc *MemcOptions
	// Tokens, if any are set, are required as bearer tokens: read scope
	// for GET/HEAD, write scope for everything else (401/403).
	Tokens Tokens
	// ReadOnly refuses every write with 403.
	ReadOnly bool
	// MaxRequests caps requests in flight; beyond it 503 with Retry-After.
	// Zero means no cap.
	MaxRequests int
	// BatchMaxOps caps the operations of a batch or keys of a multi-get;
	// if zero, 1000.
	BatchMaxOps int
	// BatchMaxBytes caps a batch body; if zero, 16 MiB.
	BatchMaxBytes int64
	// AsyncQueue caps writes accepted with Prefer: respond-async and not
	// yet applied; if zero, 10000.
	AsyncQueue int
	// AsyncWorkers is the number of goroutines applying them; if zero, 64.
	AsyncWorkers int
	// Codec is how values are stored; if empty, CodecRaw.
	Codec ValueCodec
	// PHP configures CodecPHP's writes.
	PHP PHPOptions
	// PeclMemcache configures CodecPeclMemcache's writes.
	PeclMemcache PeclMemcacheOptions
	// Budget bounds the bytes held for clients beyond 4 KiB per request:
	// request bodies as they are read, values read for responses until
	// they are written, multi-get and batch results, the asynchronous
	// queue. What it refuses is answered 503 with Retry-After (507 for
	// one key of a multi-get or batch). Nil: no bound.
	Budget *budget.Budget
	// BatchMaxResponseBytes caps the body of a multi-get's or batch's
	// answer: values past it answer 507 for their keys (read them one
	// by one). If zero, 16 MiB.
	BatchMaxResponseBytes int64
	// AsyncQueueBytes caps the value bytes of writes accepted with
	// Prefer: respond-async and not yet applied; if zero, 16 MiB.
	AsyncQueueBytes int64
	// NoDetach answers every request on the goroutine that serves it,
	// as routed; by default GET, HEAD and plain PUT of /{key} are
	// answered by memcached's reply when the server and the Store allow
	// it (detached.go).
	NoDetach bool
}

func (o *Options) withDefaults() {
	if o.MaxKeyLen <= 0 || o.MaxKeyLen > MaxKeyLen {
		o.MaxKeyLen = MaxKeyLen
	}
	if o.MaxValueBytes <= 0 {
		o.MaxValueBytes = 1048000
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 2 * time.Second
	}
	if o.BatchMaxOps <= 0 {
		o.BatchMaxOps = 1000
	}
	if o.BatchMaxBytes <= 0 {
		o.BatchMaxBytes = 16 << 20
	}
	if o.AsyncQueue <= 0 {
		o.AsyncQueue = 10000
	}
	if o.AsyncWorkers <= 0 {
		o.AsyncWorkers = 64
	}
	if o.BatchMaxResponseBytes <= 0 {
		o.BatchMaxResponseBytes = 16 << 20
	}
	if o.AsyncQueueBytes <= 0 {
		o.AsyncQueueBytes = 16 << 20
	}
}

// handler holds what the data endpoints share.
type handler struct {
	store      Store
	opts       Options
	defaultTTL int32
	log        *slog.Logger
	async      *asyncQueue
	values     sync.Pool // of *[]byte: PUT bodies, see valueBuf
	memc       *memc     // the compatible endpoints, if mounted

	// Detached responses' (detached.go): detachStore is nil when they
	// are off.
	detachStore asyncStore
	detached    prometheus.Counter
	obs         *observer
	lim         *limiter
	detachedq   sync.Pool // of *detachedReq

	budget *budget.Budget // nil: no bound
}

// Handler is the data-plane HTTP handler. Run must run for writes sent with
// Prefer: respond-async to be applied.
type Handler struct {
	mux    *chi.Mux
	h      *handler
	routes sync.Pool // *chi.Context, one per request in flight
}

// ServeHTTP bounds the request's memcached work by RequestTimeout and
// routes it. Its context also carries chi's routing context, which chi
// would otherwise add with a second copy of the request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.serveDetached(w, r) {
		return
	}
	rc, _ := h.routes.Get().(*chi.Context)
	if rc == nil {
		rc = chi.NewRouteContext()
	}
	rc.Reset()
	rc.Routes = h.mux
	ctx, r := h.takeContext(r)
	ctx.route = rc // back to the pool after the request, as chi does
	defer func() {
		h.h.end(ctx)
		ctx.route = nil // whoever still holds ctx must not find rc reused
		h.routes.Put(rc)
	}()
	h.mux.ServeHTTP(w, r)
}

// BodyLimit is how much of r's body its handler reads, for a server that
// reads bodies whole before the handler runs (h1.Server's BodyLimit): the
// route's limit, or 0 for a request that will be refused before its body
// is read (a refused token, read-only mode).
func (h *Handler) BodyLimit(r *http.Request) int64 {
	hh := h.h
	if hh.memc != nil && hh.memc.owns(r.URL.Path) {
		return hh.memc.o.MaxBodyBytes
	}
	if hh.access(r) != nil {
		return 0
	}
	if r.URL.Path == "/" {
		return hh.opts.BatchMaxBytes
	}
	return hh.opts.MaxValueBytes
}

// takeContext returns the request's context as ServeHTTP gives it: the
// one NewContext made, or a new one attached to a copy of r.
func (h *Handler) takeContext(r *http.Request) (*requestCtx, *http.Request) {
	ctx, ok := r.Context().(*requestCtx)
	if !ok || ctx.maker != h || ctx.used {
		parent := r.Context()
		if ok {
			// Not ours to take, and nobody would stop its timer if ours
			// armed it: hang ours on what it wraps.
			parent = ctx.Context
		}
		ctx = newRequestCtx(parent, time.Now().Add(h.h.opts.RequestTimeout))
		r = r.WithContext(ctx)
	}
	ctx.used = true
	return ctx, r
}

// NewContext makes the context ServeHTTP gives a request, for a server
// that builds its requests itself (h1.Server's NewContext): ServeHTTP then
// finds it in the request and serves the request as it is, where it would
// otherwise attach its context with WithContext, a copy of the request.
// Its RequestTimeout counts from now. A context serves one request.
func (h *Handler) NewContext(parent context.Context) context.Context {
	ctx := newRequestCtx(parent, time.Now().Add(h.h.opts.RequestTimeout))
	ctx.maker = h
	return ctx
}

// Run applies asynchronous writes until ctx is done, then applies the ones
// still queued and returns. Stop the HTTP server before cancelling ctx.
func (h *Handler) Run(ctx context.Context) error { return h.h.async.Run(ctx) }

// allowed is the Allow header of every 405 on /{key}.
const allowed = "GET, HEAD, PUT, DELETE, POST"

// NewHandler returns the data-plane handler. Metrics are registered on reg.
// It starts no goroutine; see Run.
func NewHandler(s Store, log *slog.Logger, reg prometheus.Registerer, opts Options) *Handler {
	opts.withDefaults()
	h := &handler{store: s, opts: opts, defaultTTL: int32(opts.DefaultTTL / time.Second), log: log}
	h.async = newAsyncQueue(h, s, opts.AsyncWorkers, opts.AsyncQueue, opts.AsyncQueueBytes, opts.RequestTimeout, log, reg)
	h.lim = &limiter{max: int64(opts.MaxRequests)}
	h.budget = opts.Budget
	h.obs = newObserver(log, reg, opts.AccessLog, opts.AccessLogJSON)
	if fs, ok := s.(asyncStore); ok && !opts.NoDetach {
		h.detachStore = fs
	}
	h.detached = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_http_detached_responses_total",
		Help: "Requests answered by memcached's reply as it was read, with no goroutine waiting (MEMCGATE_DETACHED_RESPONSES).",
	})
	reg.MustRegister(h.detached)
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
	r.Use(h.obs.middleware, h.limit)
	if opts.Memc != nil {
		// The compatible endpoints authorize per command, not per method
		// (GET ?cmd=set is a write): see mountMemc.
		h.mountMemc(r, opts.Memc)
	}
	r.Group(func(r chi.Router) {
		r.Use(h.authorize)
		r.Get("/", h.multiGet)
		r.Post("/", h.batch)
	})
	// Every other path is a key. It is served from NotFound rather than a
	// "/*" route so that chi does not copy the whole path into a URL
	// parameter (two allocations per request); the key comes from
	// URL.Path either way.
	r.NotFound(h.authorize(http.HandlerFunc(h.byMethod)).ServeHTTP)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, POST")
		writeError(w, &requestError{http.StatusMethodNotAllowed, "method " + r.Method + " is not allowed on /; use GET /?key=… or POST / (batch)"})
	})
	return &Handler{mux: r, h: h}
}

// byMethod serves /{key} by method.
func (h *handler) byMethod(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		h.get(w, r)
	case http.MethodPut:
		h.put(w, r)
	case http.MethodDelete:
		h.delete(w, r)
	case http.MethodPost:
		h.post(w, r)
	default:
		w.Header().Set("Allow", allowed)
		writeError(w, &requestError{http.StatusMethodNotAllowed, "method " + r.Method + " is not allowed; use " + allowed})
	}
}

// requestCtx is context.WithDeadline without a timer per request: most
// requests finish long before their deadline and never wait on Done (the
// memcached side has its own I/O timeouts), so the timer, a
// WithDeadline child, is made only when someone first asks for Done, or
// for Err once the deadline has passed. It then behaves exactly like
// that child.
type requestCtx struct {
	context.Context           // the request's own context
	deadline        time.Time // now + RequestTimeout
	once            sync.Once
	armed           atomic.Bool // timed is set
	timed           context.Context
	cancel          context.CancelFunc
	route           *chi.Context // the value of chi.RouteCtxKey while set
	maker           *Handler     // set by NewContext: ServeHTTP may use it as is
	used            bool         // ServeHTTP served a request with it

	// What the request holds until it ends (handler.end).
	slot bool  // one of the limiter's in-flight slots
	held int64 // bytes of the budget
}

// Value answers chi.RouteCtxKey itself, so that chi finds its routing
// context without wrapping the request in another one.
func (c *requestCtx) Value(key any) any {
	if key == chi.RouteCtxKey && c.route != nil {
		return c.route
	}
	return c.Context.Value(key)
}

func newRequestCtx(parent context.Context, deadline time.Time) *requestCtx {
	return &requestCtx{Context: parent, deadline: deadline}
}

func (c *requestCtx) arm() context.Context {
	c.once.Do(func() {
		c.timed, c.cancel = context.WithDeadline(c.Context, c.deadline)
		c.armed.Store(true)
	})
	return c.timed
}

// Deadline is the earlier of the parent's deadline and this one.
func (c *requestCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Done arms the deadline.
func (c *requestCtx) Done() <-chan struct{} { return c.arm().Done() }

// Err is the parent's error, or DeadlineExceeded once the deadline has
// passed; it arms the deadline only then, so Done is closed whenever Err
// is not nil.
func (c *requestCtx) Err() error {
	if c.armed.Load() {
		return c.timed.Err()
	}
	if c.Context.Err() != nil || !time.Now().Before(c.deadline) {
		return c.arm().Err()
	}
	return nil
}

// AfterFunc lets contexts derived from this one (context.WithCancel and
// the like) hook onto the armed deadline directly; without it they would
// each start a goroutine to watch Done.
func (c *requestCtx) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(c.arm(), f) }

// restart moves the deadline to d from now, unless something already
// waits on it.
func (c *requestCtx) restart(d time.Duration) {
	if !c.armed.Load() {
		c.deadline = time.Now().Add(d)
	}
}

// stop releases the timer if one was made.
func (c *requestCtx) stop() {
	if c.armed.Load() {
		c.cancel()
	}
}
