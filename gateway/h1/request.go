package h1

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// maxDiscard is how much of an unread request body is read and dropped
// to keep the connection (net/http's maxPostHandlerReadBytes).
const maxDiscard = 256 << 10

// readHead waits until c.in holds a complete request head and parses it
// without consuming it. It returns the request and the head's length;
// or readEnded once the connection is handed over (the request is not
// for the fast path: Fallback answers malformed requests), answered or
// closed; or readParked when it waits in the poller for the rest of the
// head, up to the header timeout.
func (c *conn) readHead(first bool) (req *http.Request, n int, res readResult) {
	s := c.srv
	for {
		buf := c.in.bytes()
		// Between requests net/http looks at nothing before it holds 4
		// bytes (counting the CR/LF it drops after a POST) or EOF, which
		// closes silently: a line it cannot parse is answered only then.
		if first || len(buf)+c.crlfSkipped >= 4 {
			n, lines, fast := scanHead(buf)
			if !fast {
				c.handover()
				return nil, 0, readEnded
			}
			if n > 0 {
				req, err := c.newRequest(buf[:n], lines)
				switch {
				case err != nil:
					if c.refuse(err) {
						return nil, 0, readParked
					}
					return nil, 0, readEnded
				case req == nil:
					c.handover()
					return nil, 0, readEnded
				}
				return req, n, readOK
			}
		}
		if len(buf) == c.in.Size() {
			c.handover() // Fallback applies MaxHeaderBytes
			return nil, 0, readEnded
		}
		c.phase = phaseHead
		if c.waitMore(c.deadline(orRead(s.ReadHeaderTimeout, s.ReadTimeout))) {
			return nil, 0, readParked
		}
		if err := c.in.readErr(); err != nil {
			// net/http answers a head cut short by the client's EOF
			// (after the 4 bytes it waits for between requests), but
			// says nothing on a timeout or a reset.
			if b := c.in.Buffered(); err == io.EOF && b > 0 && (c.reqFirst || b+c.crlfSkipped >= 4) {
				c.handover()
			} else {
				c.close()
			}
			return nil, 0, readEnded
		}
	}
}

// readsAhead reports whether req's body is to be read whole before its
// handler runs: it is not all buffered yet, the connection can wait in
// the poller, and the handler takes that much (Server.BodyLimit).
func (c *conn) readsAhead(req *http.Request) bool {
	s := c.srv
	return s.BodyLimit != nil && c.canPark() && req.ContentLength > int64(c.in.Buffered()) &&
		req.ContentLength <= s.BodyLimit(req)
}

// aheadTurn is how much of a body a worker reads ahead before it lets the
// connections queued behind it go first.
const aheadTurn = 128 << 10

// aheadChunk is the first allocation for a body read ahead: it then
// doubles as the body's bytes come, so that memory follows what the
// client sent, not what its Content-Length says.
const aheadChunk = 16 << 10

// readAhead reads c.ahead's body into c.abuf as it arrives, with the
// connection parked (up to the read timeout) while none is there, and
// returns the request once the body is whole. The bytes are held against
// Server.Budget; if it refuses them, or the client stops early, the
// handler gets the request with a body that fails with that error.
func (c *conn) readAhead() (*http.Request, readResult) {
	s := c.srv
	req := c.ahead
	b := req.Body.(*body)
	cl := int(req.ContentLength)
	turn := 0 // bytes read from the socket since a worker took the connection
	for len(c.abuf) < cl {
		if turn >= aheadTurn && s.poller.requeue(c) {
			// Others' turn: a large body arriving fast must not keep
			// the worker from connections queued behind it.
			return nil, readParked
		}
		if len(c.abuf) == cap(c.abuf) {
			size := min(cl, max(2*cap(c.abuf), aheadChunk, c.in.Buffered()))
			if err := c.growAhead(size); err != nil {
				return c.endAhead(b, err)
			}
		}
		if k := c.in.Buffered(); k > 0 { // the body's start, read with the head
			k = min(k, cap(c.abuf)-len(c.abuf))
			c.abuf = append(c.abuf, c.in.bytes()[:k]...)
			c.in.Discard(k)
			continue
		}
		c.in.release()
		n, blocked, err := c.in.readNoWait(c.abuf[len(c.abuf):cap(c.abuf)])
		c.abuf = c.abuf[:len(c.abuf)+n]
		turn += n
		switch {
		case err == io.EOF:
			return c.endAhead(b, io.ErrUnexpectedEOF)
		case err != nil:
			return c.endAhead(b, err)
		case !blocked:
			continue
		}
		if c.readDL {
			c.setReadTimeout(0) // the poller keeps the deadline while parked
		}
		switch s.poller.parkReading(c, stateActive, c.deadline(s.ReadTimeout)) {
		case parked:
			return nil, readParked
		case notParked:
			// The poller is closing: wait in reads from here.
			c.setDeadline(c.deadline(s.ReadTimeout))
			n, err := c.in.Read(c.abuf[len(c.abuf):cap(c.abuf)])
			c.abuf = c.abuf[:len(c.abuf)+n]
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return c.endAhead(b, err)
			}
		}
	}
	return c.endAhead(b, nil)
}

// growAhead grows c.abuf to size bytes, holding them against the budget.
func (c *conn) growAhead(size int) error {
	more := int64(size - cap(c.abuf))
	if bg := c.srv.Budget; bg != nil {
		if err := bg.Acquire(more); err != nil {
			return err
		}
		c.aheld += more
	}
	c.abuf = append(make([]byte, 0, size), c.abuf...)
	return nil
}

// endAhead hands b the body read ahead, or the error that cut it short,
// and returns its request to serve. The body then reads from memory.
func (c *conn) endAhead(b *body, err error) (*http.Request, readResult) {
	req := c.ahead
	c.ahead, c.phase = nil, phaseIdle
	c.in.release()
	if c.readDL {
		c.setReadTimeout(0)
	}
	// After an error the connection's place in the stream is lost: the
	// body fails once its bytes are read, and the connection closes
	// after the response.
	b.ahead, b.err = c.abuf, err
	return req, readOK
}

// dropAhead lets go of a body read ahead and of its budget.
func (c *conn) dropAhead() {
	if c.aheld > 0 {
		c.srv.Budget.Release(c.aheld)
		c.aheld = 0
	}
	c.abuf = nil
}

// errBothLengths refuses a request that says both how long its body is
// and that it is chunked: RFC 9112 §6.3 lets a server process it as
// chunked if it then closes the connection, but such a request is how
// requests are smuggled past a proxy that reads the other length, so it
// is refused, as nginx does.
var errBothLengths = errors.New("h1: request has both Content-Length and Transfer-Encoding")

// badRequest is net/http's answer to a request it cannot read, which the
// fast path gives to the requests it refuses itself.
const badRequest = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"

// refuse answers a request newRequest refused with 400 and closes the
// connection, dropping for a while what the client still sends so that
// it gets the answer (linger, which reports whether it parked it).
func (c *conn) refuse(error) (wasParked bool) {
	if d := c.srv.WriteTimeout; d > 0 {
		c.rwc.SetWriteDeadline(time.Now().Add(d))
	}
	io.WriteString(c.rwc, badRequest)
	c.in.Discard(c.in.Buffered())
	c.phase = phaseLinger
	return c.linger()
}

// scanHead checks the head at the start of b, line by line, against the
// fast path's grammar. It returns the head's length and its number of
// header lines once b holds a complete head, n == 0 while more is needed,
// and !fast as soon as a complete line is outside the grammar.
func scanHead(b []byte) (n, lines int, fast bool) {
	for pos := 0; ; {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			return 0, 0, true
		}
		end := pos + i
		if i == 0 || b[end-1] != '\r' {
			return 0, 0, false // a bare LF, which net/http accepts
		}
		line := b[pos : end-1]
		switch {
		case pos == 0:
			if !validRequestLine(line) {
				return 0, 0, false
			}
		case len(line) == 0:
			return end + 1, lines, true
		case !validHeaderLine(line):
			return 0, 0, false
		default:
			lines++
		}
		pos = end + 1
	}
}

// validRequestLine accepts "METHOD /target HTTP/1.x" with a token method
// and a target of printable ASCII in origin form.
func validRequestLine(l []byte) bool {
	m := bytes.IndexByte(l, ' ')
	if m <= 0 || !isToken(l[:m]) {
		return false
	}
	rest := l[m+1:]
	t := bytes.IndexByte(rest, ' ')
	if t <= 0 || rest[0] != '/' {
		return false
	}
	for _, ch := range rest[:t] {
		if ch <= ' ' || ch >= 0x7f {
			return false
		}
	}
	proto := rest[t+1:]
	return string(proto) == "HTTP/1.1" || string(proto) == "HTTP/1.0"
}

// validHeaderLine accepts "Name:value" with a token name and a value that
// net/http accepts: no control bytes but HTAB.
func validHeaderLine(l []byte) bool {
	i := bytes.IndexByte(l, ':')
	if i <= 0 || !isToken(l[:i]) {
		return false
	}
	for _, ch := range l[i+1:] {
		if ch < ' ' && ch != '\t' || ch == 0x7f {
			return false
		}
	}
	return true
}

func isToken[T string | []byte](s T) bool { return len(s) > 0 && allIn(s, "!#$%&'*+-.^_`|~") }

// allIn reports whether every byte of s is an ASCII letter, a digit or
// one of extra.
func allIn[T string | []byte](s T, extra string) bool {
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if !('a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || strings.IndexByte(extra, ch) >= 0) {
			return false
		}
	}
	return true
}

// newRequest builds the request of a head that passed scanHead, as
// net/http would, or returns nil if the request is not for the fast path,
// or errBothLengths for a request the fast path refuses. Every string of
// the request shares one copy of the head.
func (c *conn) newRequest(head []byte, lines int) (*http.Request, error) {
	s := string(head)
	eol := strings.Index(s, "\r\n")
	method, rest, _ := strings.Cut(s[:eol], " ")
	target, proto, _ := strings.Cut(rest, " ")
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, nil
	}
	h := make(http.Header, lines)
	var strs []string // one-value slices for h, as textproto does
	var host, clen, connection string
	var hosts, clens, conns int
	handOver := false
	for p := eol + 2; ; {
		e := strings.Index(s[p:], "\r\n")
		line := s[p : p+e]
		p += e + 2
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, ":")
		k, v = canonicalKey(k), strings.Trim(v, " \t")
		switch k {
		case "Host":
			hosts++
			host = v
			continue // net/http moves it to Request.Host
		case "Content-Length":
			clens++
			clen = v
		case "Connection":
			conns++
			connection = v
		case "Transfer-Encoding", "Expect", "Upgrade":
			// Fallback's, unless Content-Length comes too (see below).
			handOver = true
		}
		if vv, ok := h[k]; ok {
			h[k] = append(vv, v)
		} else {
			if strs == nil {
				strs = make([]string, lines)
			}
			vv, strs = strs[:1:1], strs[1:]
			vv[0] = v
			h[k] = vv
		}
	}
	if clens > 0 && h["Transfer-Encoding"] != nil {
		return nil, errBothLengths
	}
	is11 := proto == "HTTP/1.1"
	if handOver || hosts > 1 || is11 && hosts == 0 || !allIn(host, "-._:[]") || clens > 1 || conns > 1 {
		return nil, nil
	}
	isClose, isKeepAlive := asciiEqualFold(connection, "close"), asciiEqualFold(connection, "keep-alive")
	if conns == 1 && !isClose && !isKeepAlive {
		return nil, nil // leave token lists and upgrades to net/http
	}
	var cl int64
	if clens == 1 {
		if cl = parseLength(clen); cl < 0 {
			return nil, nil
		}
	}
	if hp := h["Pragma"]; len(hp) > 0 && hp[0] == "no-cache" { // as net/http
		if _, ok := h["Cache-Control"]; !ok {
			h["Cache-Control"] = []string{"no-cache"}
		}
	}
	r := &http.Request{
		Method:        method,
		URL:           u,
		Proto:         proto,
		ProtoMajor:    1,
		Header:        h,
		Body:          http.NoBody,
		ContentLength: cl,
		Close:         isClose || !is11 && !isKeepAlive,
		Host:          host,
		RemoteAddr:    c.remote,
		RequestURI:    target,
	}
	if is11 {
		r.ProtoMinor = 1
	}
	if cl > 0 {
		r.Body = &body{c: c, n: cl, closing: r.Close}
	}
	ctx := c.ctx
	if nc := c.srv.NewContext; nc != nil {
		ctx = nc(ctx)
	}
	return r.WithContext(ctx), nil
}

// canonicalKey returns k in canonical form, without allocating when it
// already is.
func canonicalKey(k string) string {
	upper := true
	for i := 0; i < len(k); i++ {
		ch := k[i]
		if upper && 'a' <= ch && ch <= 'z' || !upper && 'A' <= ch && ch <= 'Z' {
			return http.CanonicalHeaderKey(k)
		}
		upper = ch == '-'
	}
	return k
}

// parseLength parses a decimal Content-Length of at most 1<<40, or
// returns -1.
func parseLength(s string) int64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > 1<<40 {
		return -1
	}
	return int64(n)
}

// asciiEqualFold is strings.EqualFold for an ASCII t: a non-ASCII rune
// that folds to an ASCII letter (like U+017F to s) is longer than it, and
// net/http does not fold those.
func asciiEqualFold(s, t string) bool { return len(s) == len(t) && strings.EqualFold(s, t) }

// body is a fast-path request body: the next n bytes of the connection,
// or of what readAhead read of them. Like net/http's, it returns io.EOF
// with its last bytes, io.ErrUnexpectedEOF if the client stops early, and
// http.ErrBodyReadAfterClose after Close. It is not safe for concurrent
// use.
type body struct {
	c      *conn // reads from c.in, and releases its buffer at the body's end
	n      int64 // bytes not yet read
	ahead  []byte
	err    error // what cut the read ahead short, after the bytes in ahead
	sawEOF bool
	closed bool
	early  bool // closed before its end: the connection cannot be reused

	closing bool // the request closes the connection (Request.Close)
}

// Read implements io.Reader.
func (b *body) Read(p []byte) (int, error) {
	switch {
	case b.closed:
		return 0, http.ErrBodyReadAfterClose
	case b.sawEOF:
		return 0, io.EOF
	case len(p) == 0:
		return 0, nil
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	var n int
	var err error
	switch {
	case len(b.ahead) > 0:
		n = copy(p, b.ahead)
		b.ahead = b.ahead[n:]
	case b.err != nil:
		b.sawEOF = true
		return 0, b.err
	default:
		n, err = b.c.in.Read(p)
	}
	b.n -= int64(n)
	if b.n == 0 {
		b.sawEOF = true
		b.done()
		return n, io.EOF
	}
	if err == io.EOF { // net/http then reports io.EOF, and keeps the connection
		b.sawEOF = true
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// done lets go of the connection's buffers once the body is read.
func (b *body) done() {
	b.c.in.release()
	if b.ahead != nil || b.err != nil {
		b.ahead = nil
		b.c.dropAhead()
	}
}

// Close implements io.Closer as net/http's server does: it reads and
// drops up to maxDiscard unread bytes, or gives up the connection; it
// reads nothing if the connection closes after the request anyway.
func (b *body) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	switch {
	case b.sawEOF:
	case b.closing: // net/http: "no point in reading to EOF"
	case b.n > maxDiscard:
		b.early = true
	default:
		b.early = b.n == maxDiscard // net/http's off-by-one, kept
		return b.discard()
	}
	return nil
}

// discard reads and drops the rest of the body.
func (b *body) discard() error {
	if b.err != nil {
		return b.err // the connection's place in the stream is lost
	}
	if b.n > 0 && !b.sawEOF && b.ahead == nil {
		d, err := b.c.in.Discard(int(b.n))
		b.n -= int64(d)
		if err == io.EOF { // as in Read: net/http's body has seen its end
			b.sawEOF = true
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
	b.sawEOF = true
	b.done()
	return nil
}
