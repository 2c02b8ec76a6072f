package gateway

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/memcgate/memcgate/upstream"
)

// get serves GET and HEAD /{key}: 200 with the raw value, its flags in
// X-Memcached-Flags and its CAS as a strong ETag; 304 when If-None-Match
// names that ETag; 404 on a miss.
func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	key, err := keyFromPath(r, h.opts.MaxKeyLen)
	if err != nil {
		writeError(w, err)
		return
	}
	it, err := h.store.Get(r.Context(), key)
	h.writeItem(w, r, it, err)
}

// writeItem answers a GET or HEAD with the outcome of its read.
func (h *handler) writeItem(w http.ResponseWriter, r *http.Request, it upstream.Item, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	// A large value is held against the budget until its response is
	// written: a client that does not read can hold it for up to the
	// write timeout.
	rc := reqCtx(r)
	if h.hold(rc, len(it.Value)) != nil {
		writeError(w, errBudget)
		return
	}
	v, err := h.present(it)
	if err == nil && len(v.body) != len(it.Value) && h.hold(rc, len(v.body)) != nil {
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
	if inm := r.Header.Get("If-None-Match"); inm != "" && etagListHas(inm, hv[0]) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	hd["Content-Type"], hd["Content-Length"] = v.contentType, hv[2:3:3]
	if v.phpType != "" {
		hv[3] = v.phpType
		hd["X-Php-Type"] = hv[3:4:4]
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(v.body)
	}
}

// put serves PUT /{key}: set, or add with If-None-Match: *, replace with
// If-Match: *, cas with If-Match: "<cas>". 201 when stored, 412 when the
// condition fails.
func (h *handler) put(w http.ResponseWriter, r *http.Request) {
	key, err := keyFromPath(r, h.opts.MaxKeyLen)
	if err != nil {
		writeError(w, err)
		return
	}
	it, err := h.item(r, key)
	if err != nil {
		writeError(w, err)
		return
	}
	ifMatch, ifNone := r.Header.Get("If-Match"), r.Header.Get("If-None-Match")
	async := ifMatch == "" && ifNone == "" && preferAsync(r)
	var buf *[]byte
	if !async {
		// memcached's answer comes after the value is sent: the buffer is
		// free again when this returns.
		if buf = h.valueBuf(r.ContentLength); buf != nil {
			defer h.values.Put(buf)
		}
	}
	if it.Value, err = h.readBody(r, h.opts.MaxValueBytes, buf); err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	if async {
		// Conditional writes need memcached's answer, so only plain sets
		// are queued (RFC 7240 lets a server ignore the preference). The
		// codec runs when the write is applied, as for batches.
		if h.opts.Codec.typed() && it.Flags > 0xffff {
			writeError(w, h.prepare(&it))
			return
		}
		h.accepted(w, []parsedOp{{kind: "set", item: it}}, false)
		return
	}
	if err := h.prepare(&it); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case ifMatch == "" && ifNone == "":
		err = h.store.Set(ctx, it) // as serveDetached's (detached.go)
	case ifMatch == "" && ifNone == "*":
		if err = h.store.Add(ctx, it); errors.Is(err, upstream.ErrExists) {
			err = &preconditionError{err, "key exists (If-None-Match: *)"}
		}
	case ifMatch == "*" && ifNone == "":
		if err = h.store.Replace(ctx, it); errors.Is(err, upstream.ErrNotFound) {
			err = &preconditionError{err, "key does not exist (If-Match: *)"}
		}
	case ifMatch != "" && ifNone == "":
		if it.CAS, err = parseETag(ifMatch); err != nil {
			break
		}
		switch err = h.store.CompareAndSwap(ctx, it); {
		case errors.Is(err, upstream.ErrCASConflict):
			err = &preconditionError{err, "item changed since ETag " + ifMatch + " was read"}
		case errors.Is(err, upstream.ErrNotFound):
			err = &preconditionError{err, "key does not exist (If-Match: " + ifMatch + ")"}
		}
	default:
		err = badRequest("use If-None-Match: * (add), If-Match: * (replace) or If-Match: \"<etag>\" (cas), not both")
	}
	writeStored(w, err)
}

// writeStored answers a PUT with the outcome of its write.
func writeStored(w http.ResponseWriter, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// delete serves DELETE /{key}: 204, or 404 when the key was not there.
func (h *handler) delete(w http.ResponseWriter, r *http.Request) {
	key, err := keyFromPath(r, h.opts.MaxKeyLen)
	if err != nil {
		writeError(w, err)
		return
	}
	if preferAsync(r) {
		h.accepted(w, []parsedOp{{kind: "delete", item: upstream.Item{Key: key}}}, false)
		return
	}
	if err := h.store.Delete(r.Context(), key); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// post serves POST /{key}?op=append|prepend|incr|decr|touch.
func (h *handler) post(w http.ResponseWriter, r *http.Request) {
	key, err := keyFromPath(r, h.opts.MaxKeyLen)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	op, _ := query(r.URL.RawQuery, "op")
	switch op {
	case "append", "prepend":
		it := upstream.Item{Key: key}
		if it.Value, err = h.readBody(r, h.opts.MaxValueBytes, nil); err != nil {
			break
		}
		if op == "append" {
			err = h.store.Append(ctx, it)
		} else {
			err = h.store.Prepend(ctx, it)
		}
		if err == nil {
			w.WriteHeader(http.StatusCreated)
			return
		}
	case "incr", "decr":
		var delta, v uint64
		if delta, err = parseDelta(r.URL.RawQuery); err != nil {
			break
		}
		if op == "incr" {
			v, err = h.store.Incr(ctx, key, delta)
		} else {
			v, err = h.store.Decr(ctx, key, delta)
		}
		if err == nil {
			body := strconv.FormatUint(v, 10)
			hd := w.Header()
			hd["Content-Type"] = []string{"text/plain; charset=utf-8"}
			hd["Content-Length"] = []string{strconv.Itoa(len(body))}
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, body)
			return
		}
	case "touch":
		if _, ok := query(r.URL.RawQuery, "exptime"); !ok {
			err = badRequest("touch needs ?exptime=<seconds>")
			break
		}
		var exp int32
		if exp, err = parseExptime(r.URL.RawQuery, 0); err != nil {
			break
		}
		if err = h.store.Touch(ctx, key, exp); err == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	case "":
		err = badRequest("POST needs ?op=append, prepend, incr, decr or touch")
	default:
		err = badRequest("unknown op " + strconv.Quote(op) + "; use append, prepend, incr, decr or touch")
	}
	writeError(w, err)
}

// item builds the item of a write from ?exptime= and ?flags=.
func (h *handler) item(r *http.Request, key string) (upstream.Item, error) {
	exp, err := parseExptime(r.URL.RawQuery, h.defaultTTL)
	if err != nil {
		return upstream.Item{}, err
	}
	flags, err := parseFlags(r.URL.RawQuery)
	if err != nil {
		return upstream.Item{}, err
	}
	return upstream.Item{Key: key, Flags: flags, Expiration: exp}, nil
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

// octetStream is the Content-Type of every value; net/http never modifies
// header values, so the slice is shared read-only.
var octetStream = []string{"application/octet-stream"}

func formatETag(cas uint64) string { return `"` + strconv.FormatUint(cas, 10) + `"` }

// parseETag reads the CAS out of a strong ETag as formatETag writes it.
func parseETag(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if len(s) < 3 || s[0] != '"' || s[len(s)-1] != '"' {
		return 0, badRequest("If-Match takes * or one ETag as GET returned it, like \"12345\"")
	}
	v, err := strconv.ParseUint(s[1:len(s)-1], 10, 64)
	if err != nil {
		return 0, badRequest("If-Match " + s + " is not an ETag this gateway issued")
	}
	return v, nil
}

// etagListHas reports whether an If-None-Match list names etag (weak
// comparison, as RFC 9110 §13.1.2 asks for If-None-Match).
func etagListHas(list, etag string) bool {
	for part := range strings.SplitSeq(list, ",") {
		part = strings.TrimPrefix(strings.TrimSpace(part), "W/")
		if part == "*" || part == etag {
			return true
		}
	}
	return false
}
