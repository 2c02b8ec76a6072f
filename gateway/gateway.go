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
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
)

// Store is what the gateway needs from the memcached side.
// *upstream.Cluster implements it.
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
}

// handler holds what the data endpoints share.
type handler struct {
	store      Store
	opts       Options
	defaultTTL int32
	log        *slog.Logger
}

// allowed is the Allow header of every 405 on /{key}.
const allowed = "GET, HEAD, PUT, DELETE, POST"

// NewHandler returns the data-plane handler. Metrics are registered on reg.
func NewHandler(s Store, log *slog.Logger, reg prometheus.Registerer, opts Options) http.Handler {
	opts.withDefaults()
	h := &handler{store: s, opts: opts, defaultTTL: int32(opts.DefaultTTL / time.Second), log: log}
	lim := &limiter{max: int64(opts.MaxRequests)}
	r := chi.NewRouter()
	r.Use(newObserver(log, reg, opts.AccessLog).middleware, lim.middleware, h.deadline)
	if opts.Memc != nil {
		// The compatible endpoints authorize per command, not per method
		// (GET ?cmd=set is a write): see mountMemc.
		h.mountMemc(r, opts.Memc)
	}
	r.Group(func(r chi.Router) {
		r.Use(h.authorize)
		r.Get("/*", h.get)
		r.Head("/*", h.get)
		r.Put("/*", h.put)
		r.Delete("/*", h.delete)
		r.Post("/*", h.post)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allowed)
		writeError(w, &requestError{http.StatusMethodNotAllowed, "method " + r.Method + " is not allowed; use " + allowed})
	})
	return r
}

// deadline bounds the request's memcached work by RequestTimeout.
func (h *handler) deadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), h.opts.RequestTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
