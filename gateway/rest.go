package gateway

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
)

// The REST API on /{key}: a request is parsed into its operation
// (parseKeyRequest), its value read if the verb takes one, the operation
// run (exec) and its result answered (respond). The detached path
// (detached.go) serves the same requests with the same three steps, but
// lets memcached's reply call respond.

// serveKey serves a request for /{key}.
func (h *handler) serveKey(w http.ResponseWriter, r *http.Request) {
	kr, err := h.parseKeyRequest(r)
	if err != nil {
		writeError(w, err)
		return
	}
	o := kr.op
	h.lim.ownRead(&o, r)
	switch {
	case h.takesBig(r, o.Verb):
		small, done := h.putBig(w, r, &kr)
		if done {
			return
		}
		if kr.async && !fits(small) { // as keepBody, for a buffer of bodyChunks' own
			small = bytes.Clone(small)
		}
		o.Item.Value = small
	case o.Verb.TakesValue():
		if o.Item.Value, err = h.lim.readBody(r, h.opts.MaxValueBytes, "MEMCGATE_MAX_VALUE_BYTES"); err != nil {
			writeError(w, err)
			return
		}
		if kr.async {
			// A write queued with Prefer: respond-async keeps its
			// value, and the queue counts only the value's length.
			o.Item.Value = h.lim.keepBody(o.Item.Value)
		} else {
			// memcached's answer comes after the value is sent, and
			// a Store keeps no Value once it returns: the buffer is
			// free again when this returns.
			defer h.lim.putBody(o.Item.Value)
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
		// The key is part of the request's target, which a long
		// query string makes kilobytes long: keep only the key.
		o.Item.Key = strings.Clone(o.Item.Key)
		h.async.accept(w, []op.Op{o}, false)
		return
	}
	res := h.ex.exec(r.Context(), o)
	h.respond(w, r, &kr, res)
	h.lim.putValue(&res)
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
	case v == op.Head:
		h.writeHead(w, r, kr, res)
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
