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
			n, ok := c.hs.scan(buf)
			if !ok || n > readBufSize || n > 0 && c.hs.fallback {
				// Fallback's: a line net/http may answer before
				// the head ends, or a whole head longer than the
				// fast path takes or outside its grammar.
				return nil, 0, c.handover()
			}
			if n > 0 {
				req, err := c.newRequest(buf[:n], c.hs.lines)
				switch {
				case err != nil:
					if c.refuse(err) {
						return nil, 0, readParked
					}
					return nil, 0, readEnded
				case req == nil:
					return nil, 0, c.handover()
				}
				return req, n, readOK
			}
		}
		if len(buf) == c.in.Size() && !c.growHead() {
			return nil, 0, c.handover() // Fallback answers 431, as it would
		}
		c.phase = phaseHead
		if c.waitMore(c.deadline(s.headTimeout())) {
			return nil, 0, readParked
		}
		if err := c.in.readErr(); err != nil {
			// net/http answers a head cut short by the client's EOF
			// (after the 4 bytes it waits for between requests), but
			// says nothing on a timeout or a reset.
			if b := c.in.Buffered(); err == io.EOF && b > 0 && (c.reqFirst || b+c.crlfSkipped >= 4) {
				return nil, 0, c.handover()
			}
			if isTimeout(err) {
				s.timedOut(phaseHead, false)
			}
			c.close()
			return nil, 0, readEnded
		}
	}
}

// errBothLengths refuses a request that says both how long its body is
// and that it is chunked: RFC 9112 §6.3 lets a server process it as
// chunked if it then closes the connection, but such a request is how
// requests are smuggled past a proxy that reads the other length, so it
// is refused, as nginx does.
var errBothLengths = errors.New("h1: request has both Content-Length and Transfer-Encoding")

// errTEOnHTTP10 refuses an HTTP/1.0 request with Transfer-Encoding, which
// HTTP/1.0 does not have: net/http ignores the field and reads no body,
// so a proxy in front that forwards the body chunked (HAProxy does) has
// its chunks read as the next requests, and the request itself stored
// with an empty body. RFC 9112 §6.1 requires its framing to be taken as
// faulty and the connection closed; it is refused, as nginx does.
var errTEOnHTTP10 = errors.New("h1: HTTP/1.0 request has Transfer-Encoding")

// errObsFold refuses a request whose head continues a field value on a
// line that begins with whitespace (obs-fold, RFC 9112 §5.2). net/http
// joins such a line to the field before it; a proxy in front may instead
// take it for a field of its own, or drop it, so that a fold can hide a
// Content-Length or Transfer-Encoding from one of them: with
// "X-A: 1\r\n Transfer-Encoding: chunked" and a Content-Length, net/http
// reads the Content-Length and a proxy that takes the folded line as a
// field reads chunks. The RFC lets a server refuse any fold with 400, as
// nginx does. Only the heads net/http reads are checked: the fast path
// hands a folded head to Fallback, whose GuardConn refuses it.
var errObsFold = errors.New("h1: request header field continued on a line of its own (obsolete line folding)")

// errTENotChunked refuses a request whose Transfer-Encoding does not end
// in chunked ("identity", "chunked, identity", "xchunked", empty): its
// length cannot be known, and RFC 9112 §6.3 requires 400 and the
// connection closed. net/http answers 501 and closes; the guard makes it
// answer 400, as HAProxy does. The fast path hands every request with
// Transfer-Encoding (and no Content-Length) to Fallback.
var errTENotChunked = errors.New("h1: request Transfer-Encoding does not end in chunked")

// badRequest is net/http's answer to a request it cannot read; GuardConn
// replaces it with framingAnswer's when it made net/http fail the request.
const badRequest = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"

// framingAnswer returns the answer to a request refused for err
// (errBothLengths, errTEOnHTTP10, errObsFold, errTENotChunked): 400 with
// a short body that says why, and the connection closed.
func framingAnswer(err error) string {
	msg := strings.TrimPrefix(err.Error(), "h1: ") + "\n"
	return "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(msg)) + "\r\n\r\n" + msg
}

// refuse answers a request newRequest refused with framingAnswer's 400 and
// closes the connection, dropping for a while what the client still
// sends so that it gets the answer (linger, which reports whether it
// parked it).
func (c *conn) refuse(err error) (wasParked bool) {
	c.srv.badRequest(err)
	if d := c.srv.WriteTimeout; d > 0 {
		c.setWriteTimeout(time.Now().Add(d))
	}
	c.armWrite()
	io.WriteString(c.rwc, framingAnswer(err))
	c.in.Discard(c.in.Buffered())
	c.phase = phaseLinger
	return c.linger()
}

// growHead makes room in c.in, which a request head not yet complete
// fills, for more of it, and reports false once it holds as much as
// net/http reads for a head (MaxHeaderBytes+4096 bytes): Fallback then
// answers as it would. The head stays with the fast path until it is
// complete, parked between reads like a short one, so that a client
// sending a long head slowly costs the bytes it sent and no goroutine,
// where net/http would hold a goroutine and its buffers. The buffer
// grows by an eighth, 2 KiB at least, or at once to what the socket
// holds, and then to the end of its allocation: it stays within a little
// of what the client sent, and the bytes copied as it grows are a few
// times the head's at most.
func (c *conn) growHead() bool {
	limit := maxHeader(c.srv.MaxHeaderBytes) + 4096
	have := c.in.Buffered()
	if have >= limit {
		return false
	}
	n := have + max(readBufSize/2, have/8)
	if c.in.rc != nil {
		n = max(n, have+c.queued())
	}
	c.in.grow(min(n, limit), limit)
	return true
}

// headScan is readHead's progress through the head being read: it
// checks each line once, as it comes, so that a long head sent a few
// bytes at a time costs one pass over it, not one per read.
type headScan struct {
	pos      int  // where the first line not yet checked begins
	searched int  // how far past pos a line end was looked for and not found
	lines    int  // header lines checked
	fallback bool // a line is outside the fast path's grammar, but net/http reads on past it
}

// scan checks the lines of the head at the start of b, from where it
// stopped, against the fast path's grammar. It returns the head's length
// once b holds a complete head (s.lines then counts its header lines, and
// s.fallback says it is Fallback's), n == 0 while more is needed, and
// !ok as soon as a complete line is one net/http may answer before the
// head ends, which makes the connection Fallback's at once. A line that
// net/http surely reads on past (a bare LF for CRLF, a request line it
// takes) leaves the head with the fast path until it is complete, so
// that a client cannot make a slow head cost net/http's goroutine with
// one such line. b must begin with the bytes it was given before.
func (s *headScan) scan(b []byte) (n int, ok bool) {
	for {
		pos := s.pos
		from := max(pos, s.searched) // a long line's start is not searched again
		i := bytes.IndexByte(b[from:], '\n')
		if i < 0 {
			s.searched = len(b)
			return 0, true
		}
		i += from - pos
		end := pos + i
		line := b[pos:end]
		if i > 0 && line[i-1] == '\r' {
			line = line[:i-1]
		} else {
			s.fallback = true // net/http takes a bare LF as CRLF
		}
		switch {
		case pos == 0:
			if !validRequestLine(line) {
				if !readsPast(line) {
					return 0, false
				}
				s.fallback = true
			}
		case len(line) == 0:
			return end + 1, true
		case !validHeaderLine(line):
			return 0, false
		default:
			s.lines++
		}
		s.pos = end + 1
	}
}

// readsPast reports whether net/http reads on to the header lines after
// request line l, which the fast path does not take, rather than answer
// it at once: readRequest's checks of a request line, in its order.
func readsPast(l []byte) bool {
	method, rest, ok1 := bytes.Cut(l, []byte(" "))
	target, proto, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || !isToken(method) {
		return false
	}
	if _, _, ok := http.ParseHTTPVersion(string(proto)); !ok {
		return false
	}
	rawURL := string(target)
	if string(method) == "CONNECT" && !strings.HasPrefix(rawURL, "/") {
		rawURL = "http://" + rawURL // an authority, which net/http parses so
	}
	_, err := url.ParseRequestURI(rawURL)
	return err == nil
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

// newRequest builds the request of a head that passed headScan, as
// net/http would, or returns nil if the request is not for the fast path,
// or errBothLengths or errTEOnHTTP10 for a request the fast path refuses.
// Every string of the request shares one copy of the head. The request,
// its URL and its header map are objects a handler gave back
// (ReleaseRequest) when there are any: the connection holds them until
// the request ends (endRequest).
func (c *conn) newRequest(head []byte, lines int) (*http.Request, error) {
	o, _ := c.srv.requests.Get().(*reqObjs)
	if o == nil {
		o = new(reqObjs)
	}
	r, err := c.buildRequest(o, head, lines)
	if r == nil {
		o.reset() // nobody saw them
		c.srv.requests.Put(o)
		return nil, err
	}
	c.rq, c.rqBack = o, false
	return r, nil
}

// buildRequest is newRequest's parse, into o.
func (c *conn) buildRequest(o *reqObjs, head []byte, lines int) (*http.Request, error) {
	s := string(head)
	eol := strings.Index(s, "\r\n")
	method, rest, _ := strings.Cut(s[:eol], " ")
	target, proto, _ := strings.Cut(rest, " ")
	if !parseTarget(target, &o.url) {
		return nil, nil
	}
	if o.hdr == nil {
		o.hdr = make(http.Header, lines)
	}
	h := o.hdr
	var strs []string // one-value slices for h, as textproto does
	var host, clen, connection, expect string
	var hosts, clens, conns, expects int
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
		case "Expect":
			expects++
			expect = v
		case "Transfer-Encoding", "Upgrade":
			// Fallback's, unless Content-Length comes too (see below).
			handOver = true
		}
		if vv, ok := h[k]; ok {
			h[k] = append(vv, v)
		} else {
			if strs == nil {
				if len(o.vals) < lines {
					o.vals = make([]string, lines)
				}
				strs = o.vals
			}
			vv, strs = strs[:1:1], strs[1:]
			vv[0] = v
			h[k] = vv
		}
	}
	is11 := proto == "HTTP/1.1"
	if h["Transfer-Encoding"] != nil {
		switch {
		case clens > 0:
			return nil, errBothLengths
		case !is11:
			return nil, errTEOnHTTP10
		}
	}
	if handOver || hosts > 1 || is11 && hosts == 0 || !allIn(host, "-._:[]") || clens > 1 || conns > 1 {
		return nil, nil
	}
	// "Expect: 100-continue" on HTTP/1.1 is the fast path's (see
	// continue100); any other expectation (417), several, or one on
	// HTTP/1.0 (ignored) is Fallback's.
	if expects > 0 && (expects > 1 || !is11 || !asciiEqualFold(expect, "100-continue")) {
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
	r := http.Request{
		Method:        method,
		URL:           &o.url,
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
		r.Body = &body{c: c, n: cl, closing: r.Close, expect: expects > 0, owe100: expects > 0}
	}
	ctx := c.ctx
	if nc := c.srv.NewContext; nc != nil {
		ctx = nc(ctx, time.Now(), c)
	}
	// WithContext's copy stays on the stack (it is inlined): the
	// request's context is set without a request of its own.
	o.req = *r.WithContext(ctx)
	return &o.req, nil
}

// parseTarget parses target, a request line's origin-form target, into u
// as url.ParseRequestURI would, and reports whether it could. A target
// whose path has only bytes that are the same escaped and unescaped is
// parsed here, without allocating; any other goes to url.ParseRequestURI.
func parseTarget(target string, u *url.URL) bool {
	p, q, hasQ := strings.Cut(target, "?")
	if !strings.HasPrefix(p, "/") || !allIn(p, "-._~$&+,/:;=@") {
		nu, err := url.ParseRequestURI(target)
		if err != nil {
			return false
		}
		*u = *nu
		return true
	}
	*u = url.URL{Path: p, RawQuery: q}
	if hasQ && q == "" && strings.Count(target, "?") == 1 {
		u.ForceQuery = true
	}
	return true
}

// reqObjs is what a fast-path request is made of besides the strings of
// its head: the request, its URL, its header map and the one-value slices
// of the header's values. A handler that keeps none of them past the
// request's end gives them back (ReleaseRequest) for a later request, on
// any connection; else the connection lets go of them when the request
// ends, and whoever still holds them keeps them.
type reqObjs struct {
	req  http.Request
	url  url.URL
	hdr  http.Header // nil if it grew past maxReusedHeader keys
	vals []string    // the backing of the header's value slices
}

// reset empties o for the pool: nothing in it keeps the request's head,
// its context or its body alive.
func (o *reqObjs) reset() {
	o.req, o.url = http.Request{}, url.URL{}
	if len(o.hdr) > maxReusedHeader {
		o.hdr = nil
	}
	clear(o.hdr)
	if len(o.vals) > 2*maxReusedHeader {
		o.vals = nil
	}
	clear(o.vals)
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
