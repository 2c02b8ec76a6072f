package h1

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// maxDiscard is how much of an unread request body is read and dropped
// to keep the connection (net/http's maxPostHandlerReadBytes).
const maxDiscard = 256 << 10

// readRequest waits until c.in holds a complete request head and parses
// it without consuming it. It returns the request and the head's length;
// or nil and handOver when the request is not for the fast path (the
// connection goes to Fallback, which answers malformed requests) or the
// connection must be closed (!handOver).
func (c *conn) readRequest() (req *http.Request, n int, handOver bool) {
	for {
		buf := c.in.bytes()
		n, lines, fast := scanHead(buf)
		if !fast {
			return nil, 0, true
		}
		if n > 0 {
			req := c.newRequest(buf[:n], lines)
			return req, n, req == nil
		}
		if len(buf) == c.in.Size() {
			return nil, 0, true // Fallback applies MaxHeaderBytes
		}
		if _, err := c.in.Peek(len(buf) + 1); err != nil {
			// net/http answers a head cut short by the client's EOF,
			// but says nothing on a timeout or a reset.
			return nil, 0, err == io.EOF && c.in.Buffered() > 0
		}
	}
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
// net/http would, or returns nil if the request is not for the fast path.
// Every string of the request shares one copy of the head.
func (c *conn) newRequest(head []byte, lines int) *http.Request {
	s := string(head)
	eol := strings.Index(s, "\r\n")
	method, rest, _ := strings.Cut(s[:eol], " ")
	target, proto, _ := strings.Cut(rest, " ")
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil
	}
	h := make(http.Header, lines)
	var strs []string // one-value slices for h, as textproto does
	var host, clen, connection string
	var hosts, clens, conns int
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
			return nil
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
	is11 := proto == "HTTP/1.1"
	if hosts > 1 || is11 && hosts == 0 || !allIn(host, "-._:[]") || clens > 1 || conns > 1 {
		return nil
	}
	isClose, isKeepAlive := asciiEqualFold(connection, "close"), asciiEqualFold(connection, "keep-alive")
	if conns == 1 && !isClose && !isKeepAlive {
		return nil // leave token lists and upgrades to net/http
	}
	var cl int64
	if clens == 1 {
		if cl = parseLength(clen); cl < 0 {
			return nil
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
	return r.WithContext(ctx)
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

// body is a fast-path request body: the next n bytes of the connection.
// Like net/http's, it returns io.EOF with its last bytes,
// io.ErrUnexpectedEOF if the client stops early, and
// http.ErrBodyReadAfterClose after Close. It is not safe for concurrent
// use.
type body struct {
	c      *conn // reads from c.in, and releases its buffer at the body's end
	n      int64 // bytes not yet read
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
	n, err := b.c.in.Read(p)
	b.n -= int64(n)
	if b.n == 0 {
		b.sawEOF = true
		b.c.in.release()
		return n, io.EOF
	}
	if err == io.EOF { // net/http then reports io.EOF, and keeps the connection
		b.sawEOF = true
		err = io.ErrUnexpectedEOF
	}
	return n, err
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
	if b.n > 0 && !b.sawEOF {
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
	b.c.in.release()
	return nil
}
