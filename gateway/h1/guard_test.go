package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// guardBothLengths is the guard's answer to a head with both
// Content-Length and Transfer-Encoding, and the fast path's.
const guardBothLengths = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 54\r\n\r\n" +
	"request has both Content-Length and Transfer-Encoding\n"

// guardEcho describes the request it got, body, trailer and body error
// included, in a response that always has a Content-Length (0 for HEAD),
// so that guardResponses can cut a stream of them apart.
func guardEcho(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var b bytes.Buffer
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(&b, "%s %q %s close=%v cl=%d te=%q host=%q\n",
		r.Method, r.RequestURI, r.Proto, r.Close, r.ContentLength, r.TransferEncoding, r.Host)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q\n", k, r.Header[k])
	}
	fmt.Fprintf(&b, "body=%q err=%v trailer=%q\n", body, err, r.Trailer)
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Length", "0")
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.Write(b.Bytes())
}

var guardDate = regexp.MustCompile(`\r\nDate: [^\r]*\r\n`)

func guardNormalize(b []byte) []byte {
	return guardDate.ReplaceAll(b, []byte("\r\nDate: -\r\n"))
}

var guardCL = regexp.MustCompile(`\r\nContent-Length: (\d+)\r\n`)

// guardResponses cuts out, one after the other, the responses at the
// start of out that have a Content-Length (those of guardEcho), skipping
// 1xx ones, up to the first other one (net/http's own error answers,
// which end the connection). It returns where each ends and whether it
// says "Connection: close".
func guardResponses(out []byte) (ends []int, closes []bool) {
	off := 0
	for {
		h := bytes.Index(out[off:], []byte("\r\n\r\n"))
		if h < 0 {
			return
		}
		head := out[off : off+h+4]
		if len(head) > 9 && string(head[:7]) == "HTTP/1." && head[9] == '1' {
			off += h + 4
			continue
		}
		m := guardCL.FindSubmatch(head)
		if m == nil {
			return
		}
		n, _ := strconv.Atoi(string(m[1]))
		end := off + h + 4 + n
		if end > len(out) {
			return
		}
		ends = append(ends, end)
		closes = append(closes, bytes.Contains(head, []byte("\r\nConnection: close\r\n")))
		off = end
	}
}

// guardOracle walks in as net/http's server reads requests (with
// net/http's own parsers) and finds the first request whose head the
// guard refuses (guardHeadRefused). It returns its index and why it is
// refused, or -1 if the walk stops before one (net/http fails a head or a
// body, or a request asks to close the connection). It also returns, for
// the chunked requests before, the stretch of the stream net/http peeks
// into for a "\r\n\r\n" before it reads a trailer section that does not
// start with CRLF.
func guardOracle(in []byte) (k int, peeks []guardPeek, why error) {
	r := bytes.NewReader(in)
	br := bufio.NewReader(r)
	pos := func() int { return len(in) - r.Len() - br.Buffered() }
	post := false
	for k = 0; ; k++ {
		if post {
			peek, _ := br.Peek(4)
			n := 0
			for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
				n++
			}
			br.Discard(n)
		}
		if _, why, ok := guardHeadRefused(in[pos():]); ok {
			return k, peeks, why
		}
		req, err := http.ReadRequest(br)
		if err != nil || req.Close {
			return -1, peeks, nil
		}
		if e := req.Header.Get("Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
			return -1, peeks, nil
		}
		bodyStart := pos()
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return -1, peeks, nil
		}
		if len(req.TransferEncoding) > 0 {
			cr := bytes.NewReader(in[bodyStart:])
			cbr := bufio.NewReader(cr)
			io.Copy(io.Discard, httputil.NewChunkedReader(cbr))
			t := bodyStart + len(in[bodyStart:]) - cr.Len() - cbr.Buffered()
			if i := bytes.Index(in[t:], []byte("\r\n\r\n")); !bytes.HasPrefix(in[t:], []byte("\r\n")) && i >= 0 {
				peeks = append(peeks, guardPeek{k, t, t + i + 4})
			}
		}
		post = req.Method == http.MethodPost
	}
}

// A guardPeek is where request k's trailer section starts, in[from:to]
// being what net/http peeks at before it reads it.
type guardPeek struct{ k, from, to int }

// guardHeadRefused reports whether in starts with a head (a request line
// and header fields, as net/http's textproto reader reads them) that the
// guard refuses, why, and where it ends: one with both fields
// (errBothLengths); on HTTP/1.x, one with a line that continues a field
// (errObsFold), with Transfer-Encoding on HTTP/1.0 (errTEOnHTTP10), or
// with one whose last coding is not chunked (errTENotChunked).
func guardHeadRefused(in []byte) (end int, why error, ok bool) {
	r := bytes.NewReader(in)
	br := bufio.NewReader(r)
	tp := textproto.NewReader(br)
	line, err := tp.ReadLine()
	if err != nil {
		return 0, nil, false
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return 0, nil, false
	}
	end = len(in) - r.Len() - br.Buffered()
	_, proto, _ := strings.Cut(line, " ")
	_, proto, _ = strings.Cut(proto, " ")
	major, _, vok := http.ParseHTTPVersion(proto)
	te := h["Transfer-Encoding"] != nil
	switch {
	case te && h["Content-Length"] != nil:
		return end, errBothLengths, true
	case !vok || major != 1:
		return 0, nil, false
	case guardFold.Match(in[:end]):
		return end, errObsFold, true
	case te && proto == "HTTP/1.0":
		return end, errTEOnHTTP10, true
	case te && !guardEndsChunked(h["Transfer-Encoding"]):
		return end, errTENotChunked, true
	}
	return 0, nil, false
}

// guardEndsChunked reports whether the last coding that the
// Transfer-Encoding values list is chunked.
func guardEndsChunked(values []string) bool {
	var last string
	for _, el := range strings.Split(strings.Join(values, ","), ",") {
		if el = strings.Trim(el, " \t"); el != "" {
			last = el
		}
	}
	return strings.EqualFold(last, "chunked")
}

// guardFold matches a line that begins with whitespace, which in a head
// that textproto read is a continuation line.
var guardFold = regexp.MustCompile(`\n[ \t]`)

var guardNameTE = regexp.MustCompile(`(?mi)^transfer-encoding:`)

// guardCheck checks guarded, net/http's answer to in through GuardConn,
// against plain, its answer without.
func guardCheck(t *testing.T, in, plain, guarded []byte) {
	t.Helper()
	plain, guarded = guardNormalize(plain), guardNormalize(guarded)
	k, peeks, why := guardOracle(in)
	ends, closes := guardResponses(plain)
	// Whether net/http without the guard reached request i.
	reached := func(i int) bool {
		return i >= 0 && len(ends) >= i && (i == 0 || !closes[i-1])
	}
	want := plain
	if reached(k) {
		want = append(plain[:guardPrefix(ends, k):guardPrefix(ends, k)], framingAnswer(why)...)
	}
	if bytes.Equal(guarded, want) {
		return
	}
	// Where net/http fails a request line, its plain 400 and the
	// refusal's answer may stand for each other (see guardConn's "The
	// answer"): the same status and close, another body.
	var f framing
	if f.scan(in) >= 0 {
		precise := []byte(framingAnswer(f.why))
		for _, sw := range [][2][]byte{{[]byte(badRequest), precise}, {precise, []byte(badRequest)}} {
			if rest, ok := bytes.CutSuffix(want, sw[0]); ok && bytes.Equal(guarded, append(rest[:len(rest):len(rest)], sw[1]...)) {
				return
			}
		}
	}
	// The exception (see guardConn): a chunked request's trailer peek
	// runs into a refused head, so that request's body read fails. The
	// guard may refuse heads there that net/http would never reach (after
	// a request it rejects), so this allows it wherever the peek covers
	// a Transfer-Encoding field name (with a Content-Length, on HTTP/1.0
	// or with a coding that is not chunked last) or a continuation line.
	for _, p := range peeks {
		peek := in[p.from:p.to]
		refusable := guardNameTE.Find(peek) != nil || guardFold.Match(peek)
		if !reached(p.k) || !refusable {
			continue
		}
		rest, ok := bytes.CutPrefix(guarded, plain[:guardPrefix(ends, p.k)])
		rends, rcloses := guardResponses(rest)
		if ok && len(rends) == 1 && rends[0] == len(rest) && rcloses[0] &&
			bytes.Contains(rest, []byte("suspiciously long trailer")) {
			return
		}
	}
	t.Fatalf("stream %q (refused at request %d)\nguarded %q\nwant    %q\n(without guard %q)", in, k, guarded, want, plain)
}

// guardPrefix returns the length of the first k responses.
func guardPrefix(ends []int, k int) int {
	if k == 0 {
		return 0
	}
	return ends[k-1]
}

// guardMemConn is a connection that reads in, chunk bytes at a time at
// most (all if 0), then io.EOF, and keeps what is written to it. It never
// blocks, so a server's answer to it does not depend on timing. closed is
// closed when the server closes the connection or, as on TCP, only its
// writing side: either way it has written all it will.
type guardMemConn struct {
	in      []byte
	chunk   int
	mu      sync.Mutex // guards out and wclosed
	out     bytes.Buffer
	wclosed bool
	once    sync.Once
	closed  chan struct{}
}

func (c *guardMemConn) Read(p []byte) (int, error) {
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := len(p)
	if c.chunk > 0 {
		n = min(n, c.chunk)
	}
	n = copy(p[:n], c.in)
	c.in = c.in[n:]
	return n, nil
}

func (c *guardMemConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wclosed {
		return 0, net.ErrClosed
	}
	return c.out.Write(p)
}

func (c *guardMemConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// CloseWrite ends the server's output, as on TCP. net/http half-closes
// so, then sleeps half a second before it closes (its rstAvoidanceDelay,
// for a TCP client to read the answer first), when it gives up on a
// request body, as for a large Content-Length, or answers 431. Ending
// the serve here rather than at Close keeps such inputs, which fuzzing
// finds at once and then minimizes, from costing that sleep each.
func (c *guardMemConn) CloseWrite() error {
	c.mu.Lock()
	c.wclosed = true
	c.mu.Unlock()
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *guardMemConn) LocalAddr() net.Addr              { return guardAddr{} }
func (c *guardMemConn) RemoteAddr() net.Addr             { return guardAddr{} }
func (c *guardMemConn) SetDeadline(time.Time) error      { return nil }
func (c *guardMemConn) SetReadDeadline(time.Time) error  { return nil }
func (c *guardMemConn) SetWriteDeadline(time.Time) error { return nil }

type guardAddr struct{}

func (guardAddr) Network() string { return "mem" }
func (guardAddr) String() string  { return "mem" }

// guardOneListener accepts c, then waits to be closed.
type guardOneListener struct {
	c    chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *guardOneListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guardOneListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *guardOneListener) Addr() net.Addr { return guardAddr{} }

var guardQuietLog = log.New(io.Discard, "", 0)

// guardServeMem serves in to a net/http Server running guardEcho on one
// in-memory connection, through GuardConn if guard, and returns all that
// the server wrote until it closed the connection.
func guardServeMem(t testing.TB, in []byte, chunk int, guard bool) []byte {
	t.Helper()
	return guardServeMemOn(t, &http.Server{}, in, chunk, guard)
}

// guardServeMemOn is guardServeMem with srv, whose Handler and ErrorLog
// it sets.
func guardServeMemOn(t testing.TB, srv *http.Server, in []byte, chunk int, guard bool) []byte {
	t.Helper()
	mc := &guardMemConn{in: in, chunk: chunk, closed: make(chan struct{})}
	var c net.Conn = mc
	if guard {
		c = GuardConn(mc)
	}
	ln := &guardOneListener{c: make(chan net.Conn, 1), done: make(chan struct{})}
	ln.c <- c
	srv.Handler, srv.ErrorLog = http.HandlerFunc(guardEcho), guardQuietLog
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	select {
	case <-mc.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("net/http (guard %v) did not close the connection for %q", guard, in)
	}
	ln.Close()
	<-served
	mc.mu.Lock()
	defer mc.mu.Unlock()
	return bytes.Clone(mc.out.Bytes())
}

// guardServeTCP sends pieces, one write each, on a new connection to addr,
// then closes its writing side, and returns what it reads until the server
// closes the connection.
func guardServeTCP(t *testing.T, addr string, pieces []string) []byte {
	t.Helper()
	c := dialFor(t, addr, 10*time.Second)
	defer c.Close()
	go func() {
		for _, p := range pieces {
			if _, err := io.WriteString(c, p); err != nil {
				return // the server closed; it must have answered already
			}
		}
		c.(*net.TCPConn).CloseWrite()
	}()
	out, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading the answer: %v (after %q)", err, out)
	}
	return out
}

// guardStartTCP serves guardEcho with a net/http Server on a loopback
// port, behind GuardListener if guard.
func guardStartTCP(t *testing.T, guard bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if guard {
		ln = GuardListener(ln)
	}
	srv := &http.Server{Handler: http.HandlerFunc(guardEcho), ErrorLog: guardQuietLog}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return addr
}

// Pieces of streams for the tests.
const (
	gGet     = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
	gPut     = "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
	gChunked = "PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n3;q=\"a;b\"\r\n, w\r\n0\r\nX-Sum: 1\r\nX-Two: 2\r\n\r\n"
	gPost    = "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi\r\n\r\n"
	gHead    = "HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n"
	gClose   = "GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
	// a CL+TE request with a whole chunked body, so that net/http without
	// the guard goes on to the request after it
	gBoth = "POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
)

// guardCase is a stream net/http must answer as without the guard
// (refused -1), or refuse at request index refused: with a 400, or, with
// peek, by failing the body read of the chunked request before.
type guardCase struct {
	name    string
	pieces  []string
	refused int
	peek    bool
	closes  bool // net/http closes the connection within the case
}

func guardCases() []guardCase {
	type tc = guardCase
	one := func(name string, refused int, s ...string) tc {
		return tc{name, []string{strings.Join(s, "")}, refused, false, false}
	}
	// shut is a stream on which net/http closes the connection.
	shut := func(name string, s ...string) tc {
		return tc{name, []string{strings.Join(s, "")}, -1, false, true}
	}
	bytewise := func(s string) []string {
		p := make([]string, len(s))
		for i := range s {
			p[i] = s[i : i+1]
		}
		return p
	}
	// Chunked bodies at net/http's limits, whose last chunk's data is a
	// head with both fields: where the framing fails a chunk-size line
	// that net/http accepts, it takes that data for the next request and
	// refuses it, which shows. (TestGuardCaseLimits checks that each pair
	// straddles the limit.)
	te := "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	// Fields with both, a head from wherever the framing would resume.
	fields := "X: 1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
	size := strconv.FormatInt(int64(len(fields)), 16)
	data := fields + "\r\n0\r\n\r\n"
	line := func(n int) string { return size + ";" + strings.Repeat("e", n-len(size)-3) + "\r\n" }
	// 163 chunks with 100 bytes of overhead each (a 118-byte line, less
	// 16 and twice the data), then one whose line brings the overhead to
	// 16384, or one more, which net/http fails.
	overhead := te + strings.Repeat("1;"+strings.Repeat("a", 114)+"\r\nX\r\n", 163)
	last := 16 + 2*len(fields)
	return []tc{
		one("chunk overhead at the limit", -1, overhead, line(16384-16300+last), data, gClose),
		shut("chunk overhead over the limit", overhead, line(16385-16300+last), data, gClose),
		one("chunk line of 4096 bytes", -1, te, line(4096), data, gClose),
		shut("chunk line of 4097 bytes", te, line(4097), data, gClose),
		one("chunk size of 16 digits", -1, te, strings.Repeat("0", 16-len(size))+size+"\r\n", data, gClose),
		shut("chunk size of 17 digits", te, strings.Repeat("0", 17-len(size))+size+"\r\n", data, gClose),
		shut("largest CL", "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 9223372036854775807\r\n\r\nabc"),
		shut("CL too large", "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 9223372036854775808\r\n\r\nabc"),

		// Refused.
		one("CL then TE", 0, gBoth, gClose),
		one("TE then CL", 0, "PUT /s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n", gClose),
		one("mixed case", 0, "PUT /s HTTP/1.1\r\nhost: x\r\ncOnTeNt-LeNgTh: 0\r\nTRANSFER-ENCODING: CHUNKED\r\n\r\n0\r\n\r\n", gClose),
		one("bare LF head", 0, "PUT /s HTTP/1.1\nHost: x\ncontent-length: 0\ntransfer-encoding: chunked\n\n0\r\n\r\n", gClose),
		one("TE continued", 0, "PUT /s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", gClose),
		one("TE gzip", 0, "PUT /s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding: gzip\r\n\r\n", gClose),
		one("HTTP/1.0", 0, "PUT /s HTTP/1.0\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n"),
		one("TE on HTTP/1.0", 0, "GET /k HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n", gClose),
		one("TE on HTTP/1.0 without keep-alive", 0, "PUT /k HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
		one("TE on HTTP/1.0, body a request", 1, gGet, "PUT /k HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
			"DELETE /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", gClose),
		one("after GET", 1, gGet, gBoth, gClose),
		one("after PUT", 1, gPut, gBoth, gClose),
		one("after chunked", 1, gChunked, gBoth, gClose),
		one("after POST and CRLF", 1, gPost, gBoth, gClose),
		one("after HEAD", 1, gHead, gBoth, gClose),
		one("third", 2, gGet, gChunked, gBoth, gGet, gClose),
		one("smuggled GET", 1, gGet, "POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /evil HTTP/1.1\r\nHost: x\r\n\r\n", gClose),
		{"head split bytewise", bytewise(gGet + gBoth + gClose), 1, false, false},
		{"after a trailer that peeks into it", []string{"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\n\n" + gBoth + gClose}, 1, true, false},
		{"after a trailer that peeks past a request into it", []string{"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\n\nGET / HTTP/1.1\nHost: x\n\n" + gBoth + gClose}, 2, true, false},
		{"after a trailer that peeks into TE on HTTP/1.0", []string{"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\n\n" +
			"PUT /s HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + gClose}, 1, true, false},
		{"head split at its end", []string{gGet + gBoth[:len("POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r")], "\n0\r\n\r\n" + gClose}, 1, false, false},

		// Answered as without the guard.
		one("GET", -1, gGet, gGet, gClose),
		one("PUT", -1, gPut, gPut, gClose),
		one("chunked with extensions and trailers", -1, gChunked, gChunked, gClose),
		one("POST then CRLF", -1, gPost, gGet, gPost, gClose),
		one("HEAD", -1, gHead, gGet, gClose),
		one("mixed", -1, gGet, gPut, gHead, gChunked, gPost, gChunked, gPut, gClose),
		one("both in a body", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 81\r\n\r\n", gBoth, gClose),
		one("both in chunk data", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n51\r\n", gBoth, "\r\n0\r\n\r\n", gClose),
		one("both in a trailer", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", gClose),
		one("both as a continuation", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nX-A: a\r\n Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", gClose),
		shut("both, one name with a space", "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length : 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", gClose),
		one("both names longer", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Lengths: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", gClose),
		one("duplicate CL", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\ncontent-length:  5 \r\n\r\nhello", gClose),
		shut("differing CL", "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\nhello", gClose),
		one("CL continued", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n 5\r\n \r\n\r\nhello", gClose),
		one("TE chunked then space", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n \r\n\r\n0\r\n\r\n", gClose),
		one("TE identity", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\nhello", gClose),
		one("TE chunked, identity after a request", 1, gGet, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", gClose),
		one("TE chunked then identity", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\ntransfer-encoding:  Identity \r\n\r\n0\r\n\r\n", gClose),
		one("TE empty", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \t\r\n\r\n", gClose),
		shut("TE gzip, chunked", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", gClose),
		shut("TE identity then chunked", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n", gClose),
		shut("TE chunked, then an empty element", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked,\t,\r\n\r\n0\r\n\r\n", gClose),
		one("field continued", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\t2\r\nContent-Length: 5\r\n\r\nhello", gClose),
		one("field continued after a request", 1, gGet, "GET /k HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n", gClose),
		one("TE hidden in a continuation", 0, "PUT /k HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", gClose),
		shut("continuation as the first field", "PUT /k HTTP/1.1\r\n X-A: 1\r\nHost: x\r\n\r\n", gClose),
		shut("continuation with a bad version", "GET / HTTP/1.x\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n", gGet),
		one("continued trailer", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\r\n 2\r\n\r\n", gGet, gClose),
		shut("chunk line bare LF", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", gClose),
		shut("chunk size with space before ext", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5 ;a\r\nhello\r\n0\r\n\r\n", gClose),
		one("chunk size with trailing space", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5 \t\r\nhello\r\n0 \r\n\r\n", gClose),
		shut("chunk data without CRLF", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n", gClose),
		shut("invalid trailer, then both", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nno colon\n\n", gBoth, gClose),
		shut("trailer peeks into a head with an invalid line and both", "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n\nno colon\nContent-Length: 0\nTransfer-Encoding: chunked\r\n\r\n", gClose),
		one("bare LF trailer", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\n\n", gGet, gClose),
		one("POST then four CRLF bytes", -1, gPost[:len(gPost)-4], "\n\r\n\r", gGet, gClose),
		shut("POST then five", gPost[:len(gPost)-4], "\r\n\r\n\r", gGet, gClose),
		shut("bad version", "GET / HTTP/1.x\r\nHost: x\r\n\r\n", gGet),
		shut("HTTP/2.0", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", gGet),
		one("Expect", -1, "PUT /k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", gClose),
		shut("ends in a head", gGet, "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n"),
	}
}

// TestGuardCaseLimits checks that the cases at net/http's chunked limits
// are what they say: net/http's chunked reader takes the first of each
// pair and fails the second.
func TestGuardCaseLimits(t *testing.T) {
	ok := map[string]bool{}
	for _, tt := range guardCases() {
		if !strings.HasPrefix(tt.name, "chunk ") || !strings.Contains(tt.name, "limit") && !strings.Contains(tt.name, " of ") {
			continue
		}
		in := strings.Join(tt.pieces, "")
		body := in[strings.Index(in, "\r\n\r\n")+4:]
		_, err := io.Copy(io.Discard, httputil.NewChunkedReader(bufio.NewReader(strings.NewReader(body))))
		ok[tt.name] = err == nil
	}
	for _, pair := range [][2]string{
		{"chunk overhead at the limit", "chunk overhead over the limit"},
		{"chunk line of 4096 bytes", "chunk line of 4097 bytes"},
		{"chunk size of 16 digits", "chunk size of 17 digits"},
	} {
		if !ok[pair[0]] || ok[pair[1]] {
			t.Errorf("net/http reads %q: %v, %q: %v; want true, false", pair[0], ok[pair[0]], pair[1], ok[pair[1]])
		}
	}
}

// TestGuard serves each case with net/http on loopback TCP, behind
// GuardListener and without it, and on an in-memory connection read one
// byte at a time.
func TestGuard(t *testing.T) {
	plainAddr, guardAddr := guardStartTCP(t, false), guardStartTCP(t, true)
	for _, tt := range guardCases() {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(strings.Join(tt.pieces, ""))
			if k, _, _ := guardOracle(in); k != tt.refused {
				t.Fatalf("guardOracle(%q) = %d, want %d", in, k, tt.refused)
			}
			plain := guardServeTCP(t, plainAddr, tt.pieces)
			guarded := guardServeTCP(t, guardAddr, tt.pieces)
			guardCheck(t, in, plain, guarded)
			switch {
			case tt.peek:
				if !bytes.Contains(guarded, []byte("suspiciously long trailer")) {
					t.Errorf("guarded answer %q: the trailer's body read did not fail", guarded)
				}
			case tt.refused >= 0:
				if _, _, why := guardOracle(in); !bytes.HasSuffix(guarded, []byte(framingAnswer(why))) {
					t.Errorf("guarded answer %q does not end in a 400", guarded)
				}
			}
			if tt.refused < 0 && !bytes.Equal(guardNormalize(plain), guardNormalize(guarded)) {
				t.Errorf("guarded answer\n%q\nwant %q", guarded, plain)
			}
			guardCheck(t, in, guardServeMem(t, in, 0, false), guardServeMem(t, in, 1, true))
			if tt.refused >= 0 {
				return
			}
			// Then with a head with both fields after it, which the
			// guard must refuse wherever net/http gets to it.
			more, ok := bytes.CutSuffix(in, []byte(gClose))
			more = append(slices.Clip(more), gBoth+gClose...)
			k, _, _ := guardOracle(more)
			if ok && k < 0 && !tt.closes {
				t.Errorf("guardOracle(%q) = %d, want the request after the case refused", more, k)
			}
			guardCheck(t, more, guardServeMem(t, more, 0, false), guardServeMem(t, more, 1, true))
		})
	}
}

// guardProbe is a conn that reports net/http's one-byte background reads:
// on started when one begins, on done when it returned.
type guardProbe struct {
	net.Conn
	started, done chan struct{}
}

func (p *guardProbe) Read(b []byte) (int, error) {
	if len(b) == 1 {
		guardSignal(p.started)
	}
	n, err := p.Conn.Read(b)
	if len(b) == 1 {
		guardSignal(p.done)
	}
	return n, err
}

func guardSignal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

type guardProbeListener struct {
	net.Listener
	started, done chan struct{}
}

func (l guardProbeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardProbe{c, l.started, l.done}, nil
}

// TestGuardHeaderLimit checks refused heads around net/http's limit on
// what it reads for a head, MaxHeaderBytes+4096 bytes: below it they get
// the 400, over it the 431 net/http gives without the guard, and at it
// the 431 too, as the filler takes the last byte of the allowance.
func TestGuardHeaderLimit(t *testing.T) {
	const maxHeader = 100
	limit := maxHeader + 4096
	const tooLarge = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"
	head := func(n int) string {
		pad := n - len(gBoth) + len("0\r\n\r\n") - len("X-Pad: \r\n")
		return "POST /s HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", pad) + "\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
	}
	tests := []struct {
		name        string
		len         int
		plain, want string // status lines without and with the guard
	}{
		{"below", limit - 1, "HTTP/1.1 200 OK", guardBothLengths},
		{"at", limit, "HTTP/1.1 200 OK", tooLarge},
		{"over", limit + 1, tooLarge, tooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // net/http waits 500ms after a 431
			in := []byte(head(tt.len) + "0\r\n\r\n")
			if n := len(head(tt.len)); n != tt.len {
				t.Fatalf("head of %d bytes, want %d", n, tt.len)
			}
			plain := guardServeMemOn(t, &http.Server{MaxHeaderBytes: maxHeader}, in, 0, false)
			guarded := guardServeMemOn(t, &http.Server{MaxHeaderBytes: maxHeader}, in, 0, true)
			if !bytes.HasPrefix(plain, []byte(tt.plain)) {
				t.Errorf("without guard: %.60q, want %.60q", plain, tt.plain)
			}
			if string(guarded) != tt.want {
				t.Errorf("guarded: %q, want %q", guarded, tt.want)
			}
		})
	}
}

// TestGuardBackgroundRead checks that a request followed by a refused one
// keeps its context and is answered before the 400, although net/http's
// background read, while its handler runs, is the first read after the
// refused head was withheld, or reads the withheld byte itself.
func TestGuardBackgroundRead(t *testing.T) {
	const slow = "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
	head := gBoth[:strings.Index(gBoth, "\r\n\r\n")+4]
	tests := []struct {
		name          string
		first, second string // second is sent once the background read waits
	}{
		{"refused head already read", slow + gBoth, ""},
		{"background read reads its last byte", slow + head[:len(head)-1], head[len(head)-1:] + "0\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started, done := make(chan struct{}, 1), make(chan struct{}, 1)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			h := func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Error("no background read")
				}
				// Give a cancellation time to arrive: net/http cancels
				// right after the read returns.
				select {
				case <-r.Context().Done():
				case <-time.After(100 * time.Millisecond):
				}
				fmt.Fprintf(w, "ctx=%v", r.Context().Err())
			}
			srv := &http.Server{Handler: http.HandlerFunc(h), ErrorLog: guardQuietLog}
			go srv.Serve(guardProbeListener{GuardListener(ln), started, done})
			t.Cleanup(func() { srv.Close() })

			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, tt.first)
			if tt.second != "" {
				<-started
				io.WriteString(c, tt.second)
			}
			out, err := io.ReadAll(c)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("reading the answer: %v (after %q)", err, out)
			}
			got := string(guardNormalize(out))
			want := "HTTP/1.1 200 OK\r\nDate: -\r\nContent-Length: 9\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nctx=<nil>" + guardBothLengths
			if got != want {
				t.Errorf("answer\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// TestGuardConn checks the wrapper's reads and errors, and that it keeps
// the wrapped connection's CloseWrite and ReadFrom.
func TestGuardConn(t *testing.T) {
	mc := &guardMemConn{in: []byte(gGet + gBoth), chunk: 7, closed: make(chan struct{})}
	g := GuardConn(mc)
	if GuardConn(g) != g {
		t.Error("GuardConn(GuardConn(c)) wrapped twice")
	}
	if _, ok := g.(io.WriterTo); ok {
		t.Error("a WriterTo would let reads bypass the guard")
	}
	var got []byte
	buf := make([]byte, 7)
	var err error
	for err == nil {
		var n int
		n, err = g.Read(buf)
		got = append(got, buf[:n]...)
	}
	end := strings.Index(gBoth, "\r\n\r\n") + 3
	if want := gGet + gBoth[:end] + "\x00"; string(got) != want {
		t.Errorf("read %q, want %q", got, want)
	}
	var ne net.Error
	var oe *net.OpError
	if err != errSmuggle || errors.Is(err, io.EOF) || errors.As(err, &ne) || errors.As(err, &oe) {
		t.Errorf("Read error = %v, want errSmuggle", err)
	}
	if n, err := g.Read(buf); n != 0 || err != errSmuggle {
		t.Errorf("Read again = %d, %v; want 0, errSmuggle", n, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	g = GuardConn(c)
	if n, err := g.(io.ReaderFrom).ReadFrom(strings.NewReader("out")); n != 3 || err != nil {
		t.Errorf("ReadFrom = %d, %v; want 3, nil", n, err)
	}
	if err := g.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Errorf("CloseWrite: %v", err)
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(peer); string(b) != "out" || err != nil {
		t.Errorf("peer read %q, %v; want \"out\" then EOF", b, err)
	}
}

// TestGuardReadAllocs checks that Read allocates nothing.
func TestGuardReadAllocs(t *testing.T) {
	stream := []byte(strings.Repeat(gGet+gPut+gChunked+gPost, 4))
	mc := &guardMemConn{closed: make(chan struct{})}
	g := GuardConn(mc)
	buf := make([]byte, 512)
	allocs := testing.AllocsPerRun(100, func() {
		mc.in = stream
		for {
			if _, err := g.Read(buf); err != nil {
				break
			}
		}
	})
	if allocs != 0 {
		t.Errorf("Read allocates %v times per stream, want 0", allocs)
	}
}

// BenchmarkGuardRead measures the framing over a stream of small
// requests, and over large bodies.
func BenchmarkGuardRead(b *testing.B) {
	for _, bm := range []struct {
		name   string
		stream string
	}{
		{"heads", strings.Repeat(gGet+gPut+gChunked+gPost+gHead, 50)},
		{"bodies", strings.Repeat("PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n"+strings.Repeat("v", 65536), 4)},
	} {
		b.Run(bm.name, func(b *testing.B) {
			stream := []byte(bm.stream)
			mc := &guardMemConn{closed: make(chan struct{})}
			buf := make([]byte, 4096)
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				mc.in = stream
				g := &guardConn{Conn: mc}
				for {
					if _, err := g.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}

// FuzzGuard feeds a byte stream, read chunk bytes at a time, then EOF, to
// net/http with and without GuardConn. The answers must be the same, but
// where guardOracle finds a head the guard refuses (guardHeadRefused)
// that net/http reaches: there the guarded answer is
// the same up to the responses before it, then the 400 (or, for a
// chunked request whose trailer section peeks into it, that request's
// answer to its failed body read).
func FuzzGuard(f *testing.F) {
	for _, tt := range guardCases() {
		in := strings.Join(tt.pieces, "")
		if len(in) > 8<<10 {
			continue
		}
		f.Add([]byte(in), uint8(0))
		f.Add([]byte(in), uint8(3))
		if more, ok := strings.CutSuffix(in, gClose); ok && tt.refused < 0 {
			f.Add([]byte(more+gBoth+gClose), uint8(1))
		}
	}
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		if len(in) > 8<<10 {
			t.Skip()
		}
		plain := guardServeMem(t, in, int(chunk), false)
		guarded := guardServeMem(t, in, int(chunk), true)
		guardCheck(t, in, plain, guarded)
	})
}

// ExampleGuardListener serves net/http on plain TCP with requests that
// have both Content-Length and Transfer-Encoding refused.
func ExampleGuardListener() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.NotFoundHandler(),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go srv.Serve(GuardListener(ln))
	defer srv.Close()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, resp.Close)
	// Output: 400 Bad Request true
}

// TestGuardHeadTooLarge: a head over net/http's limit (MaxHeaderBytes
// plus 4096 bytes), in its header fields or in its request line, is
// answered 431 with Guard.HeadTooLarge's body, on net/http behind such a
// Guard and on the fast path, which hands it to Fallback
// (Server.HeadTooLarge); without one, net/http's own 431, which names no
// limit. A head within the limit is served.
func TestGuardHeadTooLarge(t *testing.T) {
	const msg = "head over X_MAX_HEADER_BYTES"
	const limit = testMaxHeader + 4096
	const plain = "431 Request Header Fields Too Large"
	h := testHandler()
	_, fast := startH1(t, h, func(s *Server) { s.HeadTooLarge = msg })
	_, fastPlain := startH1(t, h, nil)
	ln := listen(t, "tcp")
	std := &http.Server{Handler: h, MaxHeaderBytes: testMaxHeader, ErrorLog: quietLog()}
	go std.Serve(Guard{HeadTooLarge: msg}.Listener(ln))
	t.Cleanup(func() { std.Close() })
	guarded := ln.Addr().String()
	stdPlain := startNetHTTP(t, listen(t, "tcp"), h)
	field := func(n int) string { // a head of n bytes
		const start, end = "GET /echo HTTP/1.1\r\nHost: a\r\nX-Big: ", "\r\n\r\n"
		return start + strings.Repeat("b", n-len(start)-len(end)) + end
	}
	heads := []struct {
		name, raw string
		over      bool
	}{
		{"header fields within the limit", field(limit), false},
		{"header fields over the limit", field(limit + 1), true},
		{"request line over the limit", "GET /" + strings.Repeat("a", limit) + " HTTP/1.1\r\nHost: a\r\n\r\n", true},
	}
	servers := []struct {
		name, addr, body string // body: of the 431
	}{
		{"fast path", fast, msg + "\n"},
		{"net/http", guarded, msg + "\n"},
		{"fast path, no HeadTooLarge", fastPlain, plain},
		{"net/http, zero Guard", stdPlain, plain},
	}
	for _, hd := range heads {
		for _, s := range servers {
			t.Run(hd.name+"/"+s.name, func(t *testing.T) {
				t.Parallel() // net/http waits 500ms after a 431
				resps, _ := exchange(t, s.addr, hd.raw, []string{"GET"}, false)
				if len(resps) == 0 {
					t.Fatal("no answer")
				}
				r := resps[0]
				switch {
				case !hd.over && r.status != "HTTP/1.1 200 OK":
					t.Errorf("%s, want 200", r)
				case hd.over && (r.status != "HTTP/1.1 431 Request Header Fields Too Large" || r.body != s.body):
					t.Errorf("%s\nwant 431 with body %q", r, s.body)
				}
			})
		}
	}
}

// TestGuardResponseLikeItsOwn431: a response whose last bytes are
// net/http's 431 answer passes unchanged, on net/http behind a Guard with
// HeadTooLarge and on the fast path once it has handed the connection
// over. net/http's buffered writer sends a response's last bytes in a
// Write of their own, so a handler that serves a client's bytes (a
// stored value) can be made to write exactly net/http's 431; replacing
// it put a longer answer in the response's place: a body that is not
// the one sent, and bytes past its Content-Length that the client reads
// as one more answer.
func TestGuardResponseLikeItsOwn431(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pad, _ := strconv.Atoi(r.URL.Query().Get("pad"))
		body := strings.Repeat("p", pad) + headTooLarge
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	})
	const msg = "head over X_MAX_HEADER_BYTES"
	_, fast := startH1(t, h, func(s *Server) { s.HeadTooLarge = msg })
	ln := listen(t, "tcp")
	std := &http.Server{Handler: h, MaxHeaderBytes: testMaxHeader, ErrorLog: quietLog()}
	go std.Serve(Guard{HeadTooLarge: msg}.Listener(ln))
	t.Cleanup(func() { std.Close() })
	for _, s := range []struct{ name, addr string }{{"net/http", ln.Addr().String()}, {"fast path, handed over", fast}} {
		t.Run(s.name, func(t *testing.T) {
			c := dialFor(t, s.addr, 10*time.Second)
			defer c.Close()
			br := bufio.NewReader(c)
			// A head longer than the fast path takes hands the
			// connection over to net/http.
			long := "GET /?pad=0 HTTP/1.1\r\nHost: a\r\nX-Long: " + strings.Repeat("l", readBufSize) + "\r\n\r\n"
			for pad := -1; pad <= 4096; pad++ {
				req := fmt.Sprintf("GET /?pad=%d HTTP/1.1\r\nHost: a\r\n\r\n", max(pad, 0))
				if pad < 0 {
					req = long
				}
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("pad %d: %v", pad, err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := strings.Repeat("p", max(pad, 0)) + headTooLarge; err != nil || resp.StatusCode != http.StatusOK || string(body) != want {
					t.Fatalf("pad %d: %d, %d bytes ending %q, %v; want 200 with the %d bytes written", pad, resp.StatusCode, len(body), body[max(0, len(body)-40):], err, len(want))
				}
			}
		})
	}
}

// TestGuardResponseLikeItsOwn400: a response whose last bytes are
// net/http's plain 400, served while a refused head pipelined behind its
// request waits, passes unchanged, and the refused head then gets the
// guard's 400. net/http's background read takes the filler while the
// handler runs; the guard's answer replaced every 400 from then on.
func TestGuardResponseLikeItsOwn400(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pad, _ := strconv.Atoi(r.URL.Query().Get("pad"))
		body := strings.Repeat("p", pad) + badRequest
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		time.Sleep(time.Millisecond) // the background read takes the filler
		io.WriteString(w, body)
	})
	addr := startNetHTTP(t, listen(t, "tcp"), h)
	const refused = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
	for pad := 3900; pad <= 4096; pad++ {
		c := dialFor(t, addr, 10*time.Second)
		br := bufio.NewReader(c)
		io.WriteString(c, fmt.Sprintf("GET /?pad=%d HTTP/1.1\r\nHost: a\r\n\r\n", pad)+refused)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("pad %d: %v", pad, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := strings.Repeat("p", pad) + badRequest; err != nil || string(body) != want {
			c.Close()
			t.Fatalf("pad %d: %d, %d bytes ending %q, %v; want the %d bytes written", pad, resp.StatusCode, len(body), body[max(0, len(body)-40):], err, len(want))
		}
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("pad %d, the refused head: %v", pad, err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Content-Length and Transfer-Encoding") {
			t.Fatalf("pad %d, the refused head: %d %q, want the guard's 400", pad, resp.StatusCode, body)
		}
	}
}
