package h1

import (
	"bytes"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	// chunkingThreshold is how much body without a Content-Length is
	// held back to compute one: net/http's bufferBeforeChunkingSize.
	// Past it the response streams, chunked on HTTP/1.1.
	chunkingThreshold = 2048
	// maxBuffer is how much response is buffered before it is written.
	maxBuffer = 64 << 10
)

// maxReusedHeader is the most keys a response header map may have had
// to be cleared and reused for the next response.
const maxReusedHeader = 16

type kv struct {
	k string
	v []string
}

// response is the fast path's http.ResponseWriter, and an http.Flusher.
// It buffers the response in its connection and writes it in one go when
// the handler returns, or once it outgrows maxBuffer. It mirrors the
// header logic of net/http's chunkWriter.writeHeader. A connection reuses
// its response: it must not be used after the handler returns.
type response struct {
	c      *conn
	req    *http.Request
	body   *body // nil for http.NoBody
	header http.Header

	status  int
	cl      int64 // the response's Content-Length, or -1
	written int64

	isHEAD, is11, wants10KeepAlive, wantsClose bool

	wroteHeader bool // WriteHeader was called, logically
	committed   bool // the head is in c.hbuf or on the wire
	done        bool // the handler has returned
	chunked     bool
	pend        int  // body bytes at the end of c.wbuf in net/http's buffer (writeBody)
	closeAfter  bool // close the connection after this response
	tooBig      bool // the unread request body is not dropped (too big, or expecting 100 Continue): the connection lingers
	fullDuplex  bool

	// The header as WriteHeader saw it (its keys are in c.kvs).
	hasCLKey, hasType, hasCE, hasDate, hasConnKey, trailers bool
	te, connHdr                                             string
	trailerDecl                                             []string
}

func (w *response) reset(c *conn, req *http.Request) {
	var connection string
	if v := req.Header["Connection"]; len(v) > 0 {
		connection = v[0]
	}
	b, _ := req.Body.(*body)
	// The header map comes with the response buffers (takeOut), from
	// an earlier response (see forget). Its memory is most of what a
	// small response allocates otherwise.
	*w = response{
		c: c, req: req, body: b, cl: -1, header: w.header,
		isHEAD:           req.Method == "HEAD",
		is11:             req.ProtoMinor == 1,
		wants10KeepAlive: req.ProtoMinor == 0 && asciiEqualFold(connection, "keep-alive"),
		wantsClose:       req.Close || asciiEqualFold(connection, "close"),
	}
}

// forget drops every reference to the finished request and response, so
// that a connection waiting for its next request keeps nothing of its
// last one alive. It keeps the header map, emptied, for a later
// response (releaseOut pools it), unless it grew large: a handler must
// not use the map after it returns, as for net/http.
func (w *response) forget() {
	if len(w.header) > maxReusedHeader {
		w.header = nil
	}
	clear(w.header)
	kvs := w.c.kvs
	clear(kvs[:cap(kvs)])
	w.c.kvs = kvs[:0]
	w.req, w.body, w.trailerDecl, w.te, w.connHdr = nil, nil, nil, "", ""
}

// Header implements http.ResponseWriter. Changes after WriteHeader have
// no effect, except on trailers.
func (w *response) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header)
	}
	return w.header
}

// WriteHeader implements http.ResponseWriter. A second call is logged and
// ignored; 1xx codes other than 101 are written at once, as net/http
// does; a code outside 100-999 panics.
func (w *response) WriteHeader(code int) {
	if w.wroteHeader {
		w.c.srv.logf("h1: superfluous response.WriteHeader call with %d after %d", code, w.status)
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	c := w.c
	if code < 200 && code != http.StatusSwitchingProtocols {
		kvs, _ := c.snapshot(w.header)
		b := appendHeaders(appendStatus(c.hbuf[:0], w.is11, code), kvs, exCL|exTE)
		c.hbuf = append(b, "\r\n"...)
		c.flush(nil)
		return
	}
	w.wroteHeader, w.status = true, code
	h := w.header
	_, prefixed := c.snapshot(h) // before the Content-Length check, as net/http
	_, w.hasCLKey = h["Content-Length"]
	if cl := first(h["Content-Length"]); cl != "" {
		if v, err := strconv.ParseInt(cl, 10, 64); err == nil && v >= 0 {
			w.cl = v
		} else {
			c.srv.logf("h1: invalid Content-Length of %q", cl)
			h.Del("Content-Length")
		}
	}
	_, w.hasType = h["Content-Type"]
	_, w.hasDate = h["Date"]
	var conn []string
	conn, w.hasConnKey = h["Connection"]
	w.connHdr, w.te = first(conn), first(h["Transfer-Encoding"])
	w.hasCE = first(h["Content-Encoding"]) != ""
	w.trailerDecl = h["Trailer"]
	w.trailers = len(w.trailerDecl) > 0 || prefixed
}

// snapshot copies the keys of h that can be sent, sorted, and their value
// slices into c.kvs, and reports whether h has TrailerPrefix keys.
func (c *conn) snapshot(h http.Header) (kvs []kv, prefixed bool) {
	kvs = c.kvs[:0]
	for k, v := range h {
		if isToken(k) {
			kvs = append(kvs, kv{k, v})
		} else {
			prefixed = prefixed || strings.HasPrefix(k, http.TrailerPrefix)
		}
	}
	slices.SortFunc(kvs, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	c.kvs = kvs
	return kvs, prefixed
}

// Write implements http.ResponseWriter.
func (w *response) Write(p []byte) (int, error) { return w.write(p, "") }

// WriteString implements io.StringWriter.
func (w *response) WriteString(s string) (int, error) { return w.write(nil, s) }

// write takes its data from b or s, whichever is not empty.
func (w *response) write(b []byte, s string) (int, error) {
	n := len(b) + len(s)
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if n == 0 {
		return 0, nil
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(n)
	if w.cl != -1 && w.written > w.cl {
		return 0, http.ErrContentLength
	}
	c := w.c
	if c.werr != nil {
		return 0, c.werr
	}
	if !w.committed {
		// A body is held whole only with a Content-Length that stays:
		// one declared beside a Transfer-Encoding is dropped (commit),
		// and the body is then chunked from what net/http's buffer
		// holds, which is all of it only up to chunkingThreshold.
		limit := maxBuffer
		if w.cl == -1 || w.te != "" {
			limit = chunkingThreshold
		}
		if len(c.wbuf)+n <= limit {
			c.wbuf = append(append(c.wbuf, b...), s...)
			w.pend = waiting(w.pend, len(b), len(s))
			return n, nil
		}
		w.commit(b, s)
	}
	if w.isHEAD {
		return n, nil
	}
	w.writeBody(b, s)
	if c.werr != nil {
		return 0, c.werr
	}
	return n, nil
}

// writeBody adds b or s to a committed body as net/http sends it. Its
// handler writes into a bufio.Writer of chunkingThreshold bytes in front
// of the chunkWriter, which makes a chunk of each write it gets, on a
// chunked body, and passes it on as it is otherwise: so written bytes
// wait in the buffer until they fill it, or a Flush or the response's end
// sends them; a Write larger than the room left goes to the chunkWriter
// whole if nothing waits; and a WriteString never does (the chunkWriter
// has no WriteString), it fills the buffer. Here the waiting bytes are
// the last w.pend of c.wbuf, and frame passes them on. What waits is
// what a handler's panic loses, with net/http as here (see flush).
func (w *response) writeBody(b []byte, s string) {
	c := w.c
	for room := chunkingThreshold - w.pend; len(b)+len(s) > room; room = chunkingThreshold {
		if w.pend == 0 && len(b) > 0 { // straight from b, one chunk if chunked
			if w.chunked {
				c.wbuf = append(strconv.AppendInt(c.wbuf, int64(len(b)), 16), "\r\n"...)
			}
			if len(c.wbuf)+len(b) > maxBuffer {
				c.flush(b)
			} else {
				c.wbuf = append(c.wbuf, b...)
			}
			if w.chunked {
				c.wbuf = append(c.wbuf, "\r\n"...)
			}
			if len(c.wbuf) > maxBuffer {
				c.flush(nil)
			}
			return
		}
		if len(b) > 0 {
			c.wbuf, b = append(c.wbuf, b[:room]...), b[room:]
		} else {
			c.wbuf, s = append(c.wbuf, s[:room]...), s[room:]
		}
		w.pend += room
		w.frame()
	}
	c.wbuf = append(append(c.wbuf, b...), s...)
	w.pend += len(b) + len(s)
}

// waiting returns how many bytes wait in net/http's buffer in front of
// its chunkWriter (see writeBody) after a Write of nb bytes or a
// WriteString of ns, if pend waited before. A response not yet committed
// holds its body here, up to maxBuffer with a Content-Length, and this is
// how much of it would still wait there once committed. (A handler that
// panics before then gets nothing sent, where net/http sends the head and
// what passed its buffer: a body it declared longer, cut short, either
// way.)
func waiting(pend, nb, ns int) int {
	const size = chunkingThreshold
	switch n := nb + ns; {
	case pend+n <= size:
		return pend + n
	case ns > 0: // fills and flushes the buffer until the rest fits
		return (pend+n-1)%size + 1
	case pend == 0: // passes straight through
		return 0
	case n-(size-pend) > size: // fills and flushes it, the rest passes through
		return 0
	default:
		return n - (size - pend)
	}
}

// frame passes on the w.pend bytes waiting at the end of c.wbuf, making
// them a chunk on a chunked body, as net/http's flush of its buffer into
// the chunkWriter does.
func (w *response) frame() {
	if w.pend == 0 {
		return
	}
	c := w.c
	if !w.chunked {
		w.pend = 0
		if len(c.wbuf) > maxBuffer {
			c.flush(nil)
		}
		return
	}
	var size [8]byte
	line := append(strconv.AppendInt(size[:0], int64(w.pend), 16), "\r\n"...)
	start := len(c.wbuf) - w.pend
	c.wbuf = append(c.wbuf, line...)
	copy(c.wbuf[start+len(line):], c.wbuf[start:start+w.pend])
	copy(c.wbuf[start:], line)
	c.wbuf = append(c.wbuf, "\r\n"...)
	w.pend = 0
	if len(c.wbuf) > maxBuffer {
		c.flush(nil)
	}
}

// commit writes the final response head into c.hbuf, ahead of the body
// held in c.wbuf, which is then followed by b or s. It follows net/http's
// chunkWriter.writeHeader step by step.
func (w *response) commit(b []byte, s string) {
	w.committed = true
	c := w.c
	plen := len(c.wbuf) + len(b) + len(s)
	keepAlives := c.srv.keepAlives()
	bodyOK := bodyAllowed(w.status)
	hasTE := w.te != ""
	var ex uint8
	var setConn, ctype string

	setCL := w.done && !w.trailers && !hasTE && bodyOK && !w.hasCLKey && (!w.isHEAD || plen > 0)
	if setCL {
		w.cl = int64(plen)
	}
	if w.wants10KeepAlive && (w.isHEAD || w.cl != -1 || !bodyOK) {
		if !w.hasConnKey {
			setConn = "keep-alive"
		}
	} else if !w.is11 || w.wantsClose {
		w.closeAfter = true
	}
	if w.connHdr == "close" || !keepAlives {
		w.closeAfter = true
	}
	// A body whose client expected 100 Continue and that was not read
	// to its end closes the connection, as on net/http: its client may
	// be holding it back, or sending it after all. So does one cut
	// short that no Read has reported at its end with io.EOF (net/http's
	// expectContinueReader counts only that as the end). The connection
	// lingers (tooBig) so that the answer is read, not reset.
	if rb := w.body; rb != nil && rb.expect && (!rb.sawEOF || rb.cut && !rb.gotEOF) && !w.closeAfter {
		w.tooBig, w.closeAfter = true, true
	}
	// Drop a small unread request body now, so that a client that sends
	// its whole request before reading cannot deadlock with us.
	if rb := w.body; rb != nil && !w.closeAfter && !w.fullDuplex {
		switch {
		case rb.closed:
			// A body whose read ahead was cut short has lost its place
			// in the stream, even if its reader saw the end of it.
			w.closeAfter = !rb.sawEOF || rb.err != nil
		case rb.n >= maxDiscard:
			w.tooBig, w.closeAfter = true, true
			ex, setConn = ex|exConn, "close"
		case rb.discard() == nil:
			rb.closed = true
		default:
			w.closeAfter = true
		}
	}
	if bodyOK {
		if !w.hasCE && !w.hasType && !hasTE && plen > 0 {
			var sn [512]byte
			p := c.wbuf
			if len(p) < len(sn) && plen > len(p) {
				k := copy(sn[:], p)
				k += copy(sn[k:], b)
				k += copy(sn[k:], s)
				p = sn[:k]
			}
			ctype = http.DetectContentType(p)
		}
	} else {
		ex |= exCL | exTE
		if w.status == http.StatusNotModified {
			ex |= exCT
		}
	}
	hasCL := w.cl != -1
	if hasCL && hasTE && w.te != "identity" {
		c.srv.logf("h1: WriteHeader called with both Transfer-Encoding of %q and a Content-Length of %d", w.te, w.cl)
		ex |= exCL
		hasCL = false
	}
	switch {
	case w.isHEAD || !bodyOK, hasCL:
		ex |= exTE
	case !w.is11:
		w.closeAfter = true
		ex |= exTE
	case w.te == "identity":
		w.closeAfter = true
		ex |= exTE
	default:
		w.chunked = true
		if w.te == "chunked" {
			ex |= exTE
		}
	}
	if w.chunked {
		ex |= exCL
	}
	if w.closeAfter && (!keepAlives || !hasToken(w.connHdr, "close")) {
		ex |= exConn
		if w.is11 {
			setConn = "close"
		}
	}

	h := appendHeaders(appendStatus(c.hbuf[:0], w.is11, w.status), c.kvs, ex)
	if !w.hasDate {
		h = append(c.appendDate(append(h, "Date: "...)), "\r\n"...)
	}
	if setCL {
		h = append(strconv.AppendInt(append(h, "Content-Length: "...), w.cl, 10), "\r\n"...)
	}
	if ctype != "" {
		h = appendLine(h, "Content-Type", ctype)
	}
	if setConn != "" {
		h = appendLine(h, "Connection", setConn)
	}
	if w.chunked {
		h = appendLine(h, "Transfer-Encoding", "chunked")
	}
	h = append(h, "\r\n"...)
	if w.isHEAD {
		c.wbuf, w.pend = c.wbuf[:0], 0
	}
	c.hbuf = h
}

// finish completes the response after the handler returned.
func (w *response) finish() {
	w.done = true
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	c := w.c
	if !w.committed {
		w.commit(nil, "")
	}
	w.frame()
	if w.chunked {
		c.wbuf = append(c.wbuf, "0\r\n"...)
		// TrailerPrefix keys are looked for now, as net/http does: they
		// are for trailers a handler learns of after the header is sent.
		if w.trailers || hasTrailerPrefix(w.header) {
			c.wbuf = w.appendTrailers(c.wbuf)
		}
		c.wbuf = append(c.wbuf, "\r\n"...)
	}
	c.flush(nil)
	if w.body != nil {
		w.body.Close()
	}
	clear(c.kvs) // let go of the handler's strings
}

// reusable reports whether the connection can serve another request
// after this response (net/http's shouldReuseConnection).
func (w *response) reusable() bool {
	switch {
	case w.closeAfter, w.c.werr != nil, w.body != nil && w.body.early:
		return false
	case !w.isHEAD && w.cl != -1 && bodyAllowed(w.status) && w.cl != w.written:
		return false // the body is shorter than it said: the client is out of step
	}
	return true
}

// Flush implements http.Flusher.
func (w *response) Flush() { w.FlushError() }

// FlushError sends the response so far, as http.ResponseController's
// Flush does, and returns the connection's write error.
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(nil, "")
	}
	w.frame()
	w.c.flush(nil)
	return w.c.werr
}

// SetReadDeadline sets the connection's read deadline, for
// http.ResponseController.
func (w *response) SetReadDeadline(t time.Time) error {
	w.c.readDL = true
	return w.c.rwc.SetReadDeadline(t)
}

// SetWriteDeadline sets the connection's write deadline, for
// http.ResponseController.
func (w *response) SetWriteDeadline(t time.Time) error {
	w.c.writeBy, w.c.writeDL = time.Time{}, true
	return w.c.rwc.SetWriteDeadline(t)
}

// EnableFullDuplex lets the handler read the request body after it has
// started the response, for http.ResponseController.
func (w *response) EnableFullDuplex() error {
	w.fullDuplex = true
	return nil
}

// flush writes c.hbuf, c.wbuf and then p to the connection in one system
// call and empties the buffers. After a write error it writes nothing.
// Body bytes waiting in net/http's buffer (response.pend) are neither
// written nor dropped: only a handler's panic flushes with some, and
// net/http then does not send what waits in its buffer either.
func (c *conn) flush(p []byte) {
	wbuf := c.wbuf[:len(c.wbuf)-c.w.pend]
	switch {
	case c.werr != nil || len(c.hbuf)+len(wbuf)+len(p) == 0:
	case c.nonBlocking: // a detached response (detach.go)
		c.iovs = [3][]byte{c.hbuf, wbuf, p}
		c.flushNonBlocking(c.iovs[:])
		c.iovs = [3][]byte{}
	default:
		c.iov = append(c.iovs[:0], c.hbuf, wbuf, p) // WriteTo consumes c.iov
		c.armWrite()
		var err error
		if c.sk != nil {
			_, err = c.sk.writeBuffers(&c.iov) // one writev, as WriteTo's on a *net.TCPConn
		} else {
			_, err = c.iov.WriteTo(c.rwc)
		}
		if err != nil {
			c.werr = err
		}
	}
	c.hbuf, c.wbuf = c.hbuf[:0], c.wbuf[:copy(c.wbuf, c.wbuf[len(wbuf):])]
}

// dateStamp is a Date header value and the second it names.
type dateStamp struct {
	sec  int64
	text []byte // http.TimeFormat; never changed once stored
}

// appendDate appends the current time in http.TimeFormat. The text is
// formatted once per second for the whole server, not per connection: a
// client that opens a connection per request would otherwise pay for
// formatting it, and its allocation, on every request.
func (c *conn) appendDate(b []byte) []byte {
	now := time.Now()
	sec := now.Unix()
	d := c.srv.date.Load()
	if d == nil || d.sec != sec {
		d = &dateStamp{sec: sec, text: now.UTC().AppendFormat(make([]byte, 0, len(http.TimeFormat)), http.TimeFormat)}
		c.srv.date.Store(d)
	}
	return append(b, d.text...)
}

// appendTrailers appends the trailer section of a chunked response: the
// TrailerPrefix keys and the keys declared in the Trailer header, with
// their values as the handler left them.
func (w *response) appendTrailers(b []byte) []byte {
	t := make(http.Header)
	for k, vv := range w.header {
		if kk, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
			t[kk] = vv
		}
	}
	for _, decl := range w.trailerDecl {
		for k := range strings.SplitSeq(decl, ",") {
			if k = http.CanonicalHeaderKey(textproto.TrimString(k)); k != "" && validTrailer(k) {
				for _, v := range w.header[k] {
					t.Add(k, v)
				}
			}
		}
	}
	buf := bytes.NewBuffer(b)
	t.Write(buf)
	return buf.Bytes()
}
