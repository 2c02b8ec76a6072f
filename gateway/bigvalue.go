package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
)

// Values larger than one memcached item (Options.BigValueMaxBytes): a PUT
// streams its body into chunks as it arrives (putBig), and a GET streams
// them back (writeChunked), each holding at most a chunk or two against
// the budget however large the value. Package chunk owns the format and
// the order of writes that keeps readers from ever seeing two versions
// mixed; this file is the HTTP side.

// takesBig reports whether r, a request for operation v, is a PUT whose
// value may be larger than one item: its body is over MaxValueBytes, or
// of unknown length (chunked), while values in chunks are on.
func (h *handler) takesBig(r *http.Request, v op.Verb) bool {
	return h.opts.BigValueMaxBytes > 0 && r.Method == http.MethodPut && codecWrites(v) &&
		(r.ContentLength > h.opts.MaxValueBytes || r.ContentLength < 0)
}

// putBig serves a PUT takesBig took: it stores the value in chunks of
// MaxValueBytes as the body arrives, then its index with the PUT's verb
// (set, add, replace or cas; Prefer: respond-async is not honoured), and
// answers. A body of unknown length that turns out to fit one item is
// handed back instead (done false), read and with the request's slot
// taken, as readBody leaves a body, to be stored as usual.
func (h *handler) putBig(w http.ResponseWriter, r *http.Request, kr *keyRequest) (small []byte, done bool) {
	o := &kr.op
	rc := reqCtx(r)
	limit := h.opts.BigValueMaxBytes
	if r.ContentLength > limit {
		writeError(w, bigTooLarge(strconv.FormatInt(r.ContentLength, 10), limit))
		return nil, true
	}
	flags, err := h.codec.chunkFlags(o.Item.Flags)
	if err != nil {
		writeError(w, err)
		return nil, true
	}
	src := &bodyChunks{l: h.lim, rc: rc, ctx: r.Context(), body: r.Body, size: h.chunks.ChunkSize(), limit: limit, cl: r.ContentLength}
	if r.ContentLength < 0 {
		// The first chunk and the byte after it are read without a
		// slot: a client that sends a chunk's worth and stops must not
		// hold one while it waits (security.md, rule 3).
		first, err := src.read()
		more := false
		if err == nil {
			more, err = src.more()
		}
		switch {
		case err == io.EOF || err == nil && !more:
			h.renewWrite(w)
			if err := h.lim.bodyRead(rc); err != nil {
				writeError(w, err)
				return nil, true
			}
			return first, false
		case err != nil:
			writeError(w, err)
			return nil, true
		}
		if !h.lim.takeSlot(rc) {
			writeError(w, errBusy)
			return nil, true
		}
		src.replay = true // the first chunk goes out with the slot taken
	} else if !h.lim.takeSlot(rc) {
		writeError(w, errBusy)
		return nil, true
	}
	// The chunks go out under names of their own, but the index that
	// makes them the key's value must follow the asynchronous writes of
	// the key accepted before: wait for those first, within the request's
	// deadline (chunkCtx has none).
	if err := h.ex.order.wait(r.Context(), o.Item.Key); err != nil {
		w.Header().Set("Connection", "close") // the rest of the body is not read
		writeError(w, err)
		return nil, true
	}
	put := chunk.Put{Verb: o.Verb, Key: o.Item.Key, Flags: flags, Expiration: o.Item.Expiration, CAS: o.Item.CAS, CASNode: o.Item.CASNode}
	err = h.chunks.Put(chunkCtx(r), put, src)
	h.renewWrite(w)
	if err != nil {
		if !src.eof {
			// Refused before the whole body came (a condition, the
			// budget, memcached): do not wait to read the rest.
			w.Header().Set("Connection", "close")
		}
		status, msg, retry := outcome(o.Verb, err)
		writeStatus(w, status, msg, retry)
		return nil, true
	}
	w.WriteHeader(http.StatusCreated)
	return nil, true
}

// renewWrite gives the answer to a PUT whose body the handler read, as
// it arrived, the server's whole write timeout from now: the deadline
// the server set at the request's head may have passed while the body
// came, and the client would get the connection closed without a word
// on a value that was stored.
func (h *handler) renewWrite(w http.ResponseWriter) {
	if d := h.opts.WriteTimeout; d > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d)) // a writer without deadlines keeps none
	}
}

// bigTooLarge answers a body over BigValueMaxBytes.
func bigTooLarge(n string, limit int64) error {
	return &requestError{kind: kindTooLarge, msg: "request body is " + n + " bytes; at most " + strconv.FormatInt(limit, 10) + " are accepted (MEMCGATE_BIG_VALUE_MAX_BYTES)"}
}

// chunkCtx is the context of r's memcached work on chunks: the request's
// own, without its RequestTimeout, since a value of many chunks takes
// longer than one operation; each chunk gets its own RequestTimeout
// instead (chunk.Options.Timeout).
func chunkCtx(r *http.Request) context.Context {
	if rc := reqCtx(r); rc != nil {
		return rc.Context
	}
	return r.Context()
}

// bodyChunks is a PUT body read chunk by chunk (a chunk.Source), into one
// buffer that grows with the bytes that came, held against the budget,
// up to the chunk size: however large the value, a PUT holds one chunk.
// The request holds its in-flight slot only while a chunk is on its way
// to memcached, not while the body arrives (security.md, rule 3): Next
// takes it once a chunk is read, and gives it back before it reads the
// next; read and more take none.
type bodyChunks struct {
	l       *limits
	rc      *requestCtx
	ctx     context.Context // the request's, for Options.ReadError
	body    io.Reader
	size    int   // the chunk size
	limit   int64 // the most bytes accepted
	cl      int64 // Content-Length; -1: chunked
	buf     []byte
	held    int   // bytes of buf's capacity held against the budget
	n       int64 // bytes read
	carry   [1]byte
	carried bool // carry is the next chunk's first byte (more)
	replay  bool // Next returns buf again: read ahead to tell a small value from a large one
	eof     bool
}

// Next returns the body's next chunk, io.EOF with or after the last.
func (b *bodyChunks) Next() ([]byte, error) {
	if b.replay {
		b.replay = false
		return b.buf, nil
	}
	if b.eof {
		return nil, io.EOF
	}
	b.l.dropSlot(b.rc)
	buf, err := b.read()
	if err != nil && err != io.EOF {
		return nil, err
	}
	if !b.l.takeSlot(b.rc) {
		return nil, errBusy
	}
	return buf, err
}

// read reads the body's next chunk, as Next, without taking a slot.
func (b *bodyChunks) read() ([]byte, error) {
	b.buf = b.buf[:0]
	if b.carried {
		b.buf, b.carried = append(b.buf, b.carry[0]), false // buf has a chunk's capacity by now
	}
	for len(b.buf) < b.size && !b.eof {
		if len(b.buf) == cap(b.buf) {
			if err := b.grow(); err != nil {
				return nil, err
			}
		}
		n, err := b.body.Read(b.buf[len(b.buf):cap(b.buf)])
		b.buf = b.buf[:len(b.buf)+n]
		b.n += int64(n)
		switch {
		case b.n > b.limit:
			return nil, bigTooLarge("more than "+strconv.FormatInt(b.limit, 10), b.limit)
		case err == io.EOF:
			b.eof = true
		case err != nil:
			return nil, bodyError(b.l.late(b.ctx, err), int(b.n), b.cl)
		}
	}
	if b.cl >= 0 {
		if b.n < b.cl && b.eof {
			return nil, bodyError(io.ErrUnexpectedEOF, int(b.n), b.cl)
		}
		b.eof = b.n == b.cl
	}
	if b.eof {
		return b.buf, io.EOF
	}
	return b.buf, nil
}

// grow doubles buf's capacity, up to the chunk size, holding it against
// the budget.
func (b *bodyChunks) grow() error {
	size := min(b.size, max(2*cap(b.buf), 16<<10))
	if size > b.held {
		if err := b.l.hold(b.rc, size-b.held); err != nil {
			return errBudget
		}
		b.held = size
	}
	nb := make([]byte, len(b.buf), size)
	copy(nb, b.buf)
	b.buf = nb
	return nil
}

// more reports whether the body goes on past what Next returned, by
// reading one byte ahead.
func (b *bodyChunks) more() (bool, error) {
	if b.eof {
		return false, nil
	}
	n, err := io.ReadFull(b.body, b.carry[:])
	switch {
	case n == 1:
		b.carried = true
		b.n++
		return true, nil
	case err == io.EOF:
		b.eof = true
		return false, nil
	}
	return false, bodyError(b.l.late(b.ctx, err), int(b.n), b.cl)
}

// writeChunked answers a read of a value stored in chunks, it being the
// value's index: the headers from the index, then the value, or the range
// asked for, streamed chunk by chunk with at most two chunks held against
// the budget. HEAD and 304 fetch no chunk. The first chunk is fetched
// before the status is sent: if it is gone because the value was just
// replaced, the new value is served instead; if the value is lost, the
// answer is 404 and its index is dropped. A chunk gone later cuts the
// response short (the connection closes): its bytes are never replaced
// by another version's.
func (h *handler) writeChunked(w http.ResponseWriter, r *http.Request, kr *keyRequest, it op.Item) {
	key := kr.op.Item.Key
	if h.ex.chunks != nil {
		h.ex.chunks.Saw(key) // a small write of it retires these chunks
	}
	ctx := chunkCtx(r)
	held := 0
	for retried := false; ; retried = true {
		read := time.Now()
		x, _, err := chunk.Parse(it)
		var d decoded
		if err != nil {
			err = &valueError{err}
		} else {
			d, err = h.codec.presentChunked(x.Flags)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		etag := formatETag(it.CAS, it.CASNode)
		hd := w.Header()
		hd["Etag"], hd["X-Memcached-Flags"] = []string{etag}, []string{strconv.FormatUint(uint64(x.Flags), 10)}
		if kr.etags != "" && etagListHas(kr.etags, etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		kind, off, end := byteRange(r, x.Size, etag)
		if kind == rangeUnsatisfiable {
			hd.Set("Content-Range", contentRange(0, 0, x.Size))
			writeError(w, errRange(x.Size))
			return
		}
		status := http.StatusOK
		if kind == rangePartial {
			status = http.StatusPartialContent
		}
		commit := func() {
			hd["Accept-Ranges"], hd["Content-Type"] = []string{"bytes"}, d.contentType
			hd["Content-Length"] = []string{strconv.FormatInt(end-off, 10)}
			if kind == rangePartial {
				hd.Set("Content-Range", contentRange(off, end, x.Size))
			}
			if d.phpType != "" {
				hd["X-Php-Type"] = []string{d.phpType}
			}
			w.WriteHeader(status)
		}
		if r.Method == http.MethodHead || off == end {
			commit()
			return
		}
		// Two chunks at once: one written out, the next fetched.
		chunks := int((end-1)/int64(x.ChunkSize) - off/int64(x.ChunkSize) + 1)
		if need := x.ChunkSize * min(chunks, 2); need > held {
			if h.lim.hold(reqCtx(r), need-held) != nil {
				writeError(w, errBudget)
				return
			}
			held = need
		}
		rd := h.chunks.NewReader(ctx, key, x, read, off, end)
		b, err := rd.Next()
		if err != nil {
			rd.Close()
			if errors.Is(err, chunk.ErrMissing) && !retried {
				// Replaced since its index was read (and the old
				// chunks evicted)? Then the new value is the answer.
				now := h.ex.exec(r.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: key}})
				switch {
				case now.Err != nil:
					err = now.Err
				case now.Item.CAS == it.CAS && now.Item.CASNode == it.CASNode && bytes.Equal(now.Item.Value, it.Value):
					// The same index (a CAS alone may be another
					// node's, after a reload or a failover).
				case chunk.IsIndex(now.Item.Flags, now.Item.Value):
					it = now.Item
					continue
				default:
					delete(hd, "Etag")
					delete(hd, "X-Memcached-Flags")
					h.writeItem(w, r, kr.etags, now.Item)
					return
				}
			}
			if errors.Is(err, chunk.ErrMissing) {
				h.chunks.Drop(ctx, key, it)
			}
			writeError(w, err)
			return
		}
		commit()
		for err == nil {
			if _, werr := w.Write(b); werr != nil {
				break
			}
			b, err = rd.Next()
		}
		if errors.Is(err, chunk.ErrMissing) {
			h.chunks.Drop(ctx, key, it)
		}
		rd.Close()
		return
	}
}
