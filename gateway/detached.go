package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/memcgate/memcgate/upstream"
)

// Detached responses. The hot requests, GET, HEAD and plain PUT of /{key},
// need not keep a goroutine waiting for memcached: on a server whose
// ResponseWriter can be detached (h1's), the request is checked, its
// memcached request sent, and the handler returns; memcached's reply, as
// its connection's reader reads it, writes the HTTP response. With
// thousands of clients this spares a goroutine wake-up per request and
// the reply's wait for its worker to be scheduled again, which is where
// most of the gateway's p99 went (docs/benchmarks.md).
//
// This path serves exactly what the routed path would, with the same code: the
// same checks (access, key, query), the same Store results written by
// writeItem and writeStored, the same metrics and access log (observer)
// and in-flight cap (limiter). Whatever it does not take (other methods
// and paths, conditional or Prefer: respond-async PUTs, chunked or large
// bodies, a refused token, an invalid key or query, a full in-flight
// cap) goes down the routed path untouched, which answers it, errors
// included, as it always did. If the Store declines the asynchronous
// call (a node down, a full in-flight cap, no pipelined connections), the
// request waits for Get or Set in place, with failover, as routed.

// detacher is the ResponseWriter of a server that lets a handler finish
// the response later, from any goroutine (h1's Detach): finish must then
// be called once, after the response's last use; nil if it cannot.
type detacher interface {
	Detach() (finish func())
}

// asyncStore is what detached responses need of the Store beyond Store
// (*upstream.Cluster has it): a Get or Set that calls back instead of
// waiting, or declines having done nothing. done must not block.
type asyncStore interface {
	GetAsync(ctx context.Context, key string, done func(upstream.Item, error)) bool
	SetAsync(ctx context.Context, it upstream.Item, done func(error)) bool
}

// detachedReq is one request served by serveDetached, from its checks to
// its end.
type detachedReq struct {
	h      *handler
	sw     statusWriter
	r      *http.Request
	ctx    *requestCtx
	start  time.Time
	finish func() // the detached response's, or nil if answered in place
	// The callbacks given to the Store, made once per detachedReq (pooled).
	gotFn    func(upstream.Item, error)
	storedFn func(error)
}

// largeValue is the size from which a GET's response is written by a
// goroutine of its own rather than by memcached's reply reader: decoding
// and copying it would hold up the replies behind it. So is a compressed
// PHP value's, whatever its size: decompressing may take milliseconds.
const largeValue = 16 << 10

// serveDetached serves r with a detached response, and reports whether it
// did; if not, nothing was done and the routed path serves it.
func (h *Handler) serveDetached(w http.ResponseWriter, r *http.Request) bool {
	hh := h.h
	d, ok := w.(detacher)
	if !ok || hh.detachStore == nil {
		return false
	}
	put := r.Method == http.MethodPut
	if !put && r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if len(r.URL.Path) < 2 || hh.memc != nil && hh.memc.owns(r.URL.Path) {
		return false
	}
	if put && (r.ContentLength < 0 || r.ContentLength > pooledValueMax ||
		r.Header["If-Match"] != nil || r.Header["If-None-Match"] != nil || preferAsync(r)) {
		return false
	}
	if hh.access(r) != nil {
		return false
	}
	key, err := keyFromPath(r, hh.opts.MaxKeyLen)
	if err != nil {
		return false
	}
	var it upstream.Item
	if put {
		if it, err = hh.item(r, key); err != nil {
			return false
		}
	}
	if !hh.lim.acquire() {
		return false
	}
	// The request is ours from here.
	start := time.Now()
	hh.obs.inFlight.Inc()
	ctx, r := h.takeContext(r)
	ctx.slot = true // given back by f.end
	f := hh.newDetachedReq(w, r, ctx, start)
	// Until f is handed to the Store's callback, or to got or stored
	// (which end it themselves), a panic here is answered and f ended as
	// the observer and limiter would on the routed path.
	ours := true
	defer func() {
		if ours {
			if p := recover(); p != nil {
				hh.obs.recovered(&f.sw, f.r, p)
				f.end()
			}
		}
	}()
	if !put {
		if f.finish = d.Detach(); f.finish != nil {
			ours = false
			if hh.detachStore.GetAsync(ctx, key, f.gotFn) {
				hh.detached.Inc()
				return true
			}
			ours = true // declined: nothing was done
		}
		it, err := hh.store.Get(ctx, key)
		ours = false
		f.got(it, err)
		return true
	}
	buf := hh.valueBuf(r.ContentLength)
	defer hh.values.Put(buf) // a Store keeps no Value once it returns
	if it.Value, err = hh.readBody(r, hh.opts.MaxValueBytes, buf); err == nil {
		err = hh.prepare(&it)
	}
	if err == nil {
		if f.finish = d.Detach(); f.finish != nil {
			ours = false
			if hh.detachStore.SetAsync(ctx, it, f.storedFn) {
				hh.detached.Inc()
				return true
			}
			ours = true
		}
		err = hh.store.Set(ctx, it)
	}
	ours = false
	f.stored(err)
	return true
}

func (h *handler) newDetachedReq(w http.ResponseWriter, r *http.Request, ctx *requestCtx, start time.Time) *detachedReq {
	f, _ := h.detachedq.Get().(*detachedReq)
	if f == nil {
		f = &detachedReq{h: h}
		f.gotFn, f.storedFn = f.got, f.stored
	}
	f.sw = statusWriter{ResponseWriter: w}
	f.r, f.ctx, f.start = r, ctx, start
	return f
}

// got answers a GET or HEAD with its read's outcome: a Store callback.
func (f *detachedReq) got(it upstream.Item, err error) {
	if f.finish != nil && (len(it.Value) >= largeValue || f.h.opts.Codec.compressed(it.Flags)) {
		go f.writeItem(it, err)
		return
	}
	f.writeItem(it, err)
}

func (f *detachedReq) writeItem(it upstream.Item, err error) {
	defer f.end()
	defer f.recover()
	f.h.writeItem(&f.sw, f.r, it, err)
}

// stored answers a PUT with its write's outcome: a Store callback.
func (f *detachedReq) stored(err error) {
	defer f.end()
	defer f.recover()
	writeStored(&f.sw, err)
}

// recover answers a panic as the observer does: the response is written
// on a goroutine the observer does not watch, memcached's reply reader,
// which must not die with it.
func (f *detachedReq) recover() {
	if p := recover(); p != nil {
		f.h.obs.recovered(&f.sw, f.r, p)
	}
}

// end records the request, lets its response go and recycles f.
func (f *detachedReq) end() {
	h := f.h
	h.obs.record(f.r, &f.sw, f.start)
	h.end(f.ctx)
	finish := f.finish
	f.sw, f.r, f.ctx, f.finish = statusWriter{}, nil, nil, nil
	h.detachedq.Put(f)
	if finish != nil {
		finish()
	}
}
