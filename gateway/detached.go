package gateway

import (
	"net/http"
	"time"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
)

// Detached responses. The hot requests, GET and plain PUT of /{key}, need
// not keep a goroutine waiting for memcached (a HEAD, op.Head, is routed:
// a node without meta commands answers it with a get): on a server whose
// ResponseWriter can be detached (h1's), the request is checked, its
// memcached request sent, and the handler returns; memcached's reply, as
// its connection's reader reads it, writes the HTTP response. With
// thousands of clients this spares a goroutine wake-up per request and the
// reply's wait for its worker to be scheduled again, where most of the
// gateway's p99 goes on the routed path (docs/benchmarks.md).
//
// This path serves exactly what the routed path would, with the same code:
// the same checks (access, key, query), the same Store results written by
// writeItem and writeStored, the same metrics and access log (observer)
// and in-flight cap (limiter). Whatever it does not take (other methods
// and paths, conditional or Prefer: respond-async PUTs, PUTs of a key with
// asynchronous writes pending, chunked or large bodies, a refused token,
// an invalid key or query, a full in-flight cap) goes down the routed path
// untouched, which answers it, errors included. If the Store declines the
// asynchronous call (a node down, a full in-flight cap, no pipelined
// connections), the request waits for Get or Set in place, with failover,
// as routed.

// Detacher is what ServeDetached needs of a server's response: Detach
// lets the handler finish it later, from any goroutine, and returns the
// function that does so, to be called once after the response's last
// use (nil if it cannot be detached). Block makes a detached response's
// writes wait for the client, for a response written on a goroutine of
// its own that is larger than a socket takes at once (a value streamed
// in chunks), which would otherwise be copied into memory whole.
// WaitIfRefused makes them wait for the client only once the byte budget
// refuses to hold such a copy, for a response written on a goroutine of
// its own, which would otherwise be cut short after its head.
// ReleaseRequest tells the server that the request's objects (the
// *http.Request, its URL and Header) are not used after the request ends,
// so that it may reuse them: serveDetached calls it for every request it
// takes, since nothing it starts keeps them (detachedReq.end drops its
// request before it calls finish; the Store's operations and the
// chunks' readers hold the request's context and strings, never the
// request). h1's responses are Detachers (h1.Server's Detached).
type Detacher = interface {
	Detach() (finish func())
	Block()
	WaitIfRefused()
	ReleaseRequest()
}

// detachedReq is one request served by serveDetached, from its checks to
// its end.
type detachedReq struct {
	h      *handler
	sw     statusWriter
	r      *http.Request
	ctx    *requestCtx
	kr     keyRequest
	start  time.Time
	d      Detacher
	finish func() // the detached response's, or nil if answered in place
	// The callback given to the Store, made once per detachedReq (pooled).
	doneFn func(op.Result)
}

// largeValue is the size from which a GET's response is written by a
// goroutine of its own rather than by memcached's reply reader: decoding
// and copying it would hold up the replies behind it. So is a compressed
// PHP value's, whatever its size: decompressing may take milliseconds.
const largeValue = 16 << 10

// serveDetached serves r with a detached response, w's Detacher d, and
// reports whether it did; if not, nothing was done and the routed path
// serves it.
func (hh *handler) serveDetached(w http.ResponseWriter, r *http.Request, d Detacher, maker *Handler) bool {
	if hh.detachStore == nil {
		return false
	}
	put := r.Method == http.MethodPut
	if !put && r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if len(r.URL.Path) < 2 || hh.opts.route(r.URL.Path) != nil {
		return false
	}
	if put && (r.ContentLength < 0 || r.ContentLength > detachedValueMax) {
		return false
	}
	if hh.guard.access(r) != nil || hh.opts.Hosts.misdirected(r, false) {
		return false // refused on the routed path
	}
	kr, err := hh.parseKeyRequest(r)
	if err != nil || kr.async || kr.op.Verb != op.Get && kr.op.Verb != op.Set {
		return false
	}
	if put && (hh.ex.order.pending(kr.op.Item.Key) || hh.ex.mayHoldIndex(kr.op.Item.Key)) {
		// The routed path waits for them (WriteOrder), and retires the
		// chunks of an index it replaces; this one would do neither.
		return false
	}
	if !hh.lim.lim.acquire() {
		return false
	}
	// The request is ours from here, and its objects the server's again
	// once it ends (Detacher).
	d.ReleaseRequest()
	hh.obs.inFlight.Inc()
	ctx, r := takeContext(r, maker, hh.lim.requestTimeout())
	ctx.lim, ctx.slot = hh.lim, true // given back by f.end
	f := hh.newDetachedReq(w, r, ctx, ctx.start)
	f.kr, f.d = kr, d
	// Until f is handed to the Store's callback, or to done (which ends
	// it itself), a panic here is answered and f ended as the observer
	// and limiter would on the routed path.
	ours := true
	defer func() {
		if ours {
			if p := recover(); p != nil {
				hh.obs.recovered(&f.sw, f.r, p)
				f.end()
			}
		}
	}()
	o := &f.kr.op
	hh.lim.ownRead(o, r)
	if put {
		if o.Item.Value, err = hh.lim.readBody(r, hh.opts.MaxValueBytes, "MEMCGATE_MAX_VALUE_BYTES"); err == nil {
			// DoAsync encodes the value before it returns, and Do
			// keeps no Value once it returns.
			defer hh.lim.putBody(o.Item.Value)
			err = hh.codec.prepare(ctx, &o.Item)
		}
		if err != nil {
			ours = false
			f.done(op.Result{Err: err})
			return true
		}
	}
	if f.finish = d.Detach(); f.finish != nil {
		ours = false
		if hh.detachStore.DoAsync(ctx, *o, f.doneFn) {
			hh.detached.Inc()
			return true
		}
		ours = true // declined: nothing was done
	}
	res := hh.ex.store.Do(ctx, *o)
	ours = false
	f.done(res)
	return true
}

func (h *handler) newDetachedReq(w http.ResponseWriter, r *http.Request, ctx *requestCtx, start time.Time) *detachedReq {
	f, _ := h.detachedq.Get().(*detachedReq)
	if f == nil {
		f = &detachedReq{h: h}
		f.doneFn = f.done
	}
	f.sw = statusWriter{ResponseWriter: w}
	f.r, f.ctx, f.start = r, ctx, start
	return f
}

// done answers the request with its operation's result: the Store's
// callback. A large or compressed value, or a value stored in chunks, is
// answered on a goroutine of its own (see largeValue).
func (f *detachedReq) done(res op.Result) {
	if f.finish != nil && res.Err == nil && f.kr.op.Verb == op.Get &&
		(len(res.Item.Value) >= largeValue || f.h.opts.Codec.compressed(res.Item.Flags) || res.Item.Flags == chunk.IndexFlags) {
		go f.respondAway(res)
		return
	}
	f.respond(res)
}

// respondAway is respond on a goroutine of its own, which may wait for
// the client: what the socket does not take at once is copied into
// memory held in the byte budget, and once the budget refuses the copy,
// written waiting for the client (WaitIfRefused), not cut short after
// its 200 head with the connection closed. A client holding the budget
// with bodies it sends slowly so cut other clients' large values short.
func (f *detachedReq) respondAway(res op.Result) {
	f.d.WaitIfRefused()
	f.respond(res)
}

func (f *detachedReq) respond(res op.Result) {
	defer f.end()
	defer f.recover()
	if f.finish != nil && res.Err == nil && chunk.IsIndex(res.Item.Flags, res.Item.Value) {
		f.d.Block() // streamed: at the client's pace, not copied whole
	}
	f.h.respond(&f.sw, f.r, &f.kr, res)
	f.h.lim.putValue(&res)
}

// recover answers a panic as the observer does: the response is written
// on a goroutine the observer does not watch, memcached's reply reader,
// which must not die with it.
func (f *detachedReq) recover() {
	if p := recover(); p != nil {
		f.h.obs.recovered(&f.sw, f.r, p)
	}
}

// end records the request, lets its response go and recycles f. Nothing
// of the request is used after finish: the server may reuse its objects
// from then on (Detacher's ReleaseRequest).
func (f *detachedReq) end() {
	h := f.h
	f.record()
	h.lim.end(f.ctx)
	finish := f.finish
	f.sw, f.r, f.ctx, f.finish, f.kr, f.d = statusWriter{}, nil, nil, nil, keyRequest{}, nil
	h.detachedq.Put(f)
	if finish != nil {
		finish()
	}
}

// record counts the request and writes its access log line. It runs on
// memcached's reply reader or on a goroutine of its own, neither a
// handler's: a panic there (a bug, or the access log's writer) is
// stopped and counted (memcgate_panics_total{where="detached_end"}),
// and end goes on to give back the request's slot and finish its
// response, which was written whole before.
func (f *detachedReq) record() {
	defer f.h.endPanics.Recover()
	f.h.obs.record(f.r, &f.sw, f.start)
}
