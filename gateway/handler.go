package gateway

import (
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// handler holds what the data endpoints share.
type handler struct {
	keyParser
	opts   Options
	ex     *executor
	codec  *codec
	lim    *limits
	guard  guard
	async  *asyncQueue
	chunks *chunk.Values // values stored in chunks
	obs    *observer
	log    *slog.Logger
	// batchOps holds a token for each key of a batch being worked on,
	// over all batches: at most batchParallel at once (run).
	batchOps chan struct{}
	// turns are those of the work on a request's bytes that costs many
	// times reading them (cpuTurns): decoding batches here, compressing
	// and decompressing values in codec, which shares them.
	turns cpuTurns

	// Detached responses' (detached.go): detachStore is nil when they
	// are off.
	detachStore AsyncStore
	detached    prometheus.Counter
	detachedq   sync.Pool        // of *detachedReq
	endPanics   *panicguard.Site // where a detached request's end stops a panic
	batchPanics *panicguard.Site // where a multi-get's or batch's goroutines stop a panic
}

// writeItem answers a read with its item: 200 with the value, its flags
// in X-Memcached-Flags and its CAS as a strong ETag, 304 when etags
// (If-None-Match) names that ETag, or 206 or 416 for a Range
// (ranges.go).
func (h *handler) writeItem(w http.ResponseWriter, r *http.Request, etags string, it op.Item) {
	// The ETag is the item's CAS: a 304 needs neither the value's bytes
	// nor its decompression, which for a compressed value of a PHP codec
	// costs milliseconds for a megabyte of zeros stored in 4 KB.
	if notModified(etags, it) {
		h.writeFound(w, r, etags, it, decoded{}, 0)
		return
	}
	// A large value is held against the budget until its response is
	// written: a client that does not read can hold it for up to the
	// write timeout.
	rc := reqCtx(r)
	if h.lim.hold(rc, len(it.Value)) != nil {
		writeError(w, errBudget)
		return
	}
	v, err := h.codec.present(r.Context(), it, func(n int) error {
		if h.lim.hold(rc, n) != nil {
			return errBudget
		}
		return nil
	})
	if err != nil {
		writeError(w, err)
		return
	}
	h.writeFound(w, r, etags, it, v, len(v.body))
}

// writeHead answers a HEAD from its op.Head: the headers GET would send,
// from the item's size, flags and CAS, without memcached sending the
// value. An If-None-Match naming the item's ETag is answered 304 from the
// op.Head alone. An item whose headers depend on its bytes is read as GET
// reads it: an index of a value in chunks (its size is in the index), and
// a compressed or boolean value of the PHP codecs, or one past
// codec.maxDecoded (its size or its error is the decoded value's). A
// php-memcached compressed value is then answered from its length prefix
// without being decompressed (codec.presentHead); the rest are presented
// as GET presents them.
func (h *handler) writeHead(w http.ResponseWriter, r *http.Request, kr *keyRequest, res op.Result) {
	it := res.Item
	if it.Flags != chunk.IndexFlags && notModified(kr.etags, it) {
		// An index's 304 carries the value's flags, from the index.
		h.writeFound(w, r, kr.etags, it, decoded{}, 0)
		return
	}
	d, ok := h.codec.presentSize(it.Flags, res.N)
	if !ok || it.Flags == chunk.IndexFlags {
		g := *kr
		g.op.Verb = op.Get
		o := g.op
		h.lim.ownRead(&o, r)
		res := h.ex.exec(r.Context(), o)
		defer h.lim.putValue(&res)
		if res.Err == nil && !chunk.IsIndex(res.Item.Flags, res.Item.Value) {
			if d, n, ok := h.codec.presentHead(res.Item, h.lim.budget.Limit()); ok {
				h.writeFound(w, r, kr.etags, res.Item, d, n)
				return
			}
		}
		h.respond(w, r, &g, res)
		return
	}
	h.writeFound(w, r, kr.etags, it, d, int(res.N))
}

// notModified reports whether an If-None-Match list, etags, names the
// ETag of it.
func notModified(etags string, it op.Item) bool {
	if etags == "" {
		return false
	}
	var b [32]byte
	return etagListHas(etags, string(appendETag(b[:0], it.CAS, it.CASNode)))
}

// writeFound answers a read of it, presented as v, whose body is size
// bytes: v.body, or none for a HEAD answered from an op.Head.
func (h *handler) writeFound(w http.ResponseWriter, r *http.Request, etags string, it op.Item, v decoded, size int) {
	// The header values and the digits of the three numbers in them
	// live in the request's context (answerScratch): the answer's
	// headers allocate nothing.
	hv, b := answerScratch(r)
	b = appendETag(b, it.CAS, it.CASNode)
	e := len(b)
	b = strconv.AppendUint(b, uint64(it.Flags), 10)
	f := len(b)
	b = strconv.AppendInt(b, int64(size), 10)
	nums := unsafe.String(unsafe.SliceData(b), len(b)) // b is never written again (answerScratch)
	hv[0], hv[1], hv[2] = nums[:e], nums[e:f], nums[f:]
	hd := w.Header()
	hd["Etag"], hd["X-Memcached-Flags"] = hv[0:1:1], hv[1:2:2]
	if etags != "" && etagListHas(etags, hv[0]) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	status, body := http.StatusOK, v.body
	if len(r.Header["Range"]) > 0 {
		kind, off, end := byteRange(r, int64(size), hv[0])
		switch kind {
		case rangeUnsatisfiable:
			hd.Set("Content-Range", contentRange(0, 0, int64(size)))
			writeError(w, errRange(int64(size)))
			return
		case rangePartial:
			hd.Set("Content-Range", contentRange(off, end, int64(size)))
			status, hv[2] = http.StatusPartialContent, strconv.FormatInt(end-off, 10)
			if body != nil {
				body = body[off:end]
			}
		}
	}
	hd["Content-Type"], hd["Content-Length"] = v.contentType, hv[2:3:3]
	if v.phpType != "" {
		hv[3] = v.phpType
		hd["X-Php-Type"] = hv[3:4:4]
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// answerScratch returns the memory of writeFound's header values: four
// value slices and the bytes of the numbers in them, those of r's
// context the first time, newly allocated otherwise. The header map keeps
// them until the response is written, which may be after the handler
// returns (net/http writes a small response's head then, h1 too), so
// they are never reused for another answer: a context serves one request
// and gives its scratch once.
func answerScratch(r *http.Request) (hv []string, b []byte) {
	if rc := reqCtx(r); rc != nil && !rc.answer.taken {
		a := &rc.answer
		a.taken = true
		return a.hv[:], a.nb[:0]
	}
	return make([]string, 4), make([]byte, 0, 64)
}

// detachedValueMax is the largest PUT body served with a detached
// response. Larger values are rare in a cache, and DoAsync clones them or
// refuses them while their memcached connection has no room for them
// (decision 0010): the routed path, which waits, serves them.
const detachedValueMax = 16 << 10
