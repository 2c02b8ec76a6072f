package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
)

// The REST API on /{key}: a request is parsed into its operation
// (parseKeyRequest), its value read if the verb takes one, the operation
// run (exec) and its result answered (respond). The detached path
// (detached.go) serves the same requests with the same three steps, but
// lets memcached's reply call respond.

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
	values sync.Pool // of *[]byte: PUT bodies, see valueBuf

	// Detached responses' (detached.go): detachStore is nil when they
	// are off.
	detachStore AsyncStore
	detached    prometheus.Counter
	detachedq   sync.Pool // of *detachedReq
}

// serveKey serves a request for /{key}.
func (h *handler) serveKey(w http.ResponseWriter, r *http.Request) {
	kr, err := h.parseKeyRequest(r)
	if err != nil {
		writeError(w, err)
		return
	}
	o := kr.op
	switch {
	case h.takesBig(r, o.Verb):
		small, done := h.putBig(w, r, &kr)
		if done {
			return
		}
		o.Item.Value = small
	case o.Verb.TakesValue():
		var buf *[]byte
		if !kr.async {
			// memcached's answer comes after the value is sent: the
			// buffer is free again when this returns.
			if buf = h.valueBuf(r.ContentLength); buf != nil {
				defer h.values.Put(buf)
			}
		}
		if o.Item.Value, err = h.lim.readBody(r, h.opts.MaxValueBytes, buf); err != nil {
			writeError(w, err)
			return
		}
	}
	if kr.async {
		// Only plain sets and deletes are queued: the others need
		// memcached's answer (RFC 7240 lets a server ignore the
		// preference). The codec runs when the write is applied.
		if err := h.codec.check(&o.Item); err != nil {
			writeError(w, err)
			return
		}
		h.async.accept(w, []op.Op{o}, false)
		return
	}
	h.respond(w, r, &kr, h.ex.exec(r.Context(), o))
}

// respond answers kr with its operation's result.
func (h *handler) respond(w http.ResponseWriter, r *http.Request, kr *keyRequest, res op.Result) {
	v := kr.op.Verb
	status, msg, retry := outcome(v, res.Err)
	switch {
	case res.Err != nil:
		writeStatus(w, status, msg, retry)
	case v.Reply() == op.Items && chunk.IsIndex(res.Item.Flags, res.Item.Value):
		h.writeChunked(w, r, kr, res.Item)
	case v.Reply() == op.Items:
		h.writeItem(w, r, kr.etags, res.Item)
	case v.Reply() == op.Number:
		body := strconv.FormatUint(res.N, 10)
		hd := w.Header()
		hd["Content-Type"] = []string{"text/plain; charset=utf-8"}
		hd["Content-Length"] = []string{strconv.Itoa(len(body))}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	default:
		w.WriteHeader(status)
	}
}

// writeItem answers a read with its item: 200 with the value, its flags
// in X-Memcached-Flags and its CAS as a strong ETag, 304 when etags
// (If-None-Match) names that ETag, or 206 or 416 for a Range
// (ranges.go).
func (h *handler) writeItem(w http.ResponseWriter, r *http.Request, etags string, it op.Item) {
	// A large value is held against the budget until its response is
	// written: a client that does not read can hold it for up to the
	// write timeout.
	rc := reqCtx(r)
	if h.lim.hold(rc, len(it.Value)) != nil {
		writeError(w, errBudget)
		return
	}
	v, err := h.codec.present(it)
	if err == nil && len(v.body) != len(it.Value) && h.lim.hold(rc, len(v.body)) != nil {
		err = errBudget // decompressed
	}
	if err != nil {
		writeError(w, err)
		return
	}
	// One backing array for the header values: one allocation, not four.
	hv := make([]string, 4)
	hv[0], hv[1], hv[2] = formatETag(it.CAS), strconv.FormatUint(uint64(it.Flags), 10), strconv.Itoa(len(v.body))
	hd := w.Header()
	hd["Etag"], hd["X-Memcached-Flags"] = hv[0:1:1], hv[1:2:2]
	if etags != "" && etagListHas(etags, hv[0]) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	status, body := http.StatusOK, v.body
	if len(r.Header["Range"]) > 0 {
		kind, off, end := byteRange(r, int64(len(body)), hv[0])
		switch kind {
		case rangeUnsatisfiable:
			hd.Set("Content-Range", contentRange(0, 0, int64(len(body))))
			writeError(w, errRange(int64(len(body))))
			return
		case rangePartial:
			hd.Set("Content-Range", contentRange(off, end, int64(len(body))))
			status, body, hv[2] = http.StatusPartialContent, body[off:end], strconv.FormatInt(end-off, 10)
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

// pooledValueMax is the largest request body read into a pooled buffer.
// Larger ones are rare in a cache and would keep their memory in the pool.
const pooledValueMax = 16 << 10

// valueBuf returns a pooled buffer for a body of n bytes (-1: unknown), or
// nil if n is not known or over pooledValueMax. The caller puts it back in
// h.values when nothing can read the value any more: a Store does not keep
// an item's Value after it returns.
func (h *handler) valueBuf(n int64) *[]byte {
	if n < 0 || n > pooledValueMax {
		return nil
	}
	if p, _ := h.values.Get().(*[]byte); p != nil {
		return p
	}
	return new([]byte)
}
